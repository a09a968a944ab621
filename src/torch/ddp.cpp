#include "gz/torch/ddp.h"

#include <exception>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/process_group.h"
#include "gz/torch/tensor_adapter.h"

namespace gz {

namespace {
void broadcast_tensor(comm::Communicator& g, const torch::Tensor& t, int root) {
  TensorSpan s(t, g, "broadcast");
  g.broadcast(s.data(), s.count(), s.dtype(), root);
  s.finish();
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, comm::CommPtr group,
                                                 DDPOptions options)
    : module_(std::move(module)), group_(resolve_group(group)), options_(std::move(options)) {
  if (!module_) GZ_THROW(InvalidArgument, "DistributedDataParallel: null module");
  if (options_.root_rank < 0 || options_.root_rank >= group_->size())
    GZ_THROW(InvalidArgument, "DistributedDataParallel: root_rank ", options_.root_rank, " outside [0, ",
             group_->size(), ")");
  for (auto& b : module_->buffers()) buffers_.push_back(b);
  {
    // Every rank starts from the root's parameters and buffers.
    torch::NoGradGuard no_grad;
    if (group_->size() > 1) {
      for (auto& p : module_->parameters()) broadcast_tensor(*group_, p.detach(), options_.root_rank);
      for (auto& b : buffers_) broadcast_tensor(*group_, b, options_.root_rank);
    }
  }
  ReducerOptions ro;
  ro.first_bucket_bytes = options_.first_bucket_bytes;
  ro.bucket_bytes = options_.bucket_bytes;
  ro.min_buckets = options_.min_buckets;
  ro.find_unused_parameters = options_.find_unused_parameters;
  ro.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  ro.comm_hook = options_.comm_hook;
  ro.row_sparse = options_.row_sparse;
  Reducer::NamedParams named;
  for (auto& item : module_->named_parameters()) named.emplace_back(item.key(), item.value());
  reducer_ = Reducer::create(std::move(named), group_, std::move(ro));
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::broadcast_buffers(int root) {
  torch::NoGradGuard no_grad;
  for (auto& b : buffers_) broadcast_tensor(*group_, b, root);
}

void DistributedDataParallel::pre_forward() {
  if (pre_forward_hook_) pre_forward_hook_();
  if (!reducer_->sync_enabled()) return;  // no_sync(): no communication at all
  bool bcast = options_.broadcast_buffers && !buffers_.empty() && group_->size() > 1;
  int root = options_.root_rank;
  if (reducer_->join_mode()) root = reducer_->announce_active(bcast);
  if (bcast) {
    ScopedPhase waiting(Phase::comm);  // a sync point: a late rank's peers wait here
    broadcast_buffers(root);
  }
}

DistributedDataParallel::JoinGuard::JoinGuard(DistributedDataParallel& ddp) : ddp_(ddp) {
  ddp_.reducer_->set_join_mode(true);
}

void DistributedDataParallel::JoinGuard::finish() {
  if (done_) return;
  done_ = true;
  auto& r = *ddp_.reducer_;
  std::vector<torch::Tensor> bufs;
  if (ddp_.options_.broadcast_buffers) bufs = ddp_.buffers_;
  try {
    r.join_and_shadow(bufs);
  } catch (...) {
    r.set_join_mode(false);
    throw;
  }
  r.set_join_mode(false);
}

DistributedDataParallel::JoinGuard::~JoinGuard() {
  if (done_) return;
  if (std::uncaught_exceptions() > 0) {  // unwinding: shadowing would only wait for a timeout
    done_ = true;
    ddp_.reducer_->set_join_mode(false);
    return;
  }
  try {
    finish();
  } catch (const std::exception& e) {
    GZ_LOG(error, "DistributedDataParallel join: ", e.what());
  }
}

}  // namespace gz
