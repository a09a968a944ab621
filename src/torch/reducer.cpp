#include "gz/torch/reducer.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <map>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/torch/tensor_adapter.h"

namespace gz {

// Fires after AccumulateGrad wrote the parameter's .grad. The signature is the same in LibTorch
// 1.13 and 2.x (2.x adds compiled_args, which has a default).
class Reducer::ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<Reducer> reducer, size_t index) : reducer_(std::move(reducer)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto r = reducer_.lock()) r->on_grad_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  size_t index_;
};

std::shared_ptr<Reducer> Reducer::create(NamedParams params, comm::CommPtr group, ReducerOptions options) {
  std::shared_ptr<Reducer> r(new Reducer(std::move(params), std::move(group), std::move(options)));
  r->install_hooks();
  return r;
}

Reducer::Reducer(NamedParams params, comm::CommPtr group, ReducerOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  if (!group_) GZ_THROW(InvalidArgument, "Reducer: null group");
  if (!options_.comm_hook) options_.comm_hook = allreduce_hook();
  GZ_CHECK_ARG(options_.bucket_bytes > 0 && options_.first_bucket_bytes > 0, "bucket sizes must be positive");
  for (auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    check_device(p, *group_, "DistributedDataParallel");
    to_dtype(p.scalar_type(), "DistributedDataParallel");
    names_.push_back(name);
    params_.push_back(p);
  }
  divisor_ = group_->size();
  ready_.assign(params_.size(), 0);
  used_ = torch::zeros({static_cast<int64_t>(params_.size())}, torch::kUInt8);
  // Gradients usually become ready in reverse registration order.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  build_buckets(order);
}

Reducer::~Reducer() {
  wait_all_buckets();
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> self = shared_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) GZ_THROW(InvalidArgument, "DistributedDataParallel: parameter '", names_[i], "' is not a leaf");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<ReadyHook>(self, i)));
    accumulators_.push_back(std::move(acc));
  }
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  torch::NoGradGuard no_grad;
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  std::vector<torch::Tensor> old_views = std::move(views_);
  views_.assign(params_.size(), torch::Tensor());
  // Fill per dtype: each bucket holds one dtype; the first bucket of a dtype is small so
  // communication starts early in backward.
  std::map<c10::ScalarType, size_t> open;      // dtype -> open bucket index
  std::map<c10::ScalarType, size_t> open_bytes;
  std::map<c10::ScalarType, bool> first_done;
  for (size_t i : order) {
    auto st = params_[i].scalar_type();
    auto it = open.find(st);
    if (it == open.end()) {
      buckets_.emplace_back();
      it = open.emplace(st, buckets_.size() - 1).first;
      open_bytes[st] = 0;
    }
    buckets_[it->second].params.push_back(i);
    bucket_of_[i] = it->second;
    open_bytes[st] += params_[i].numel() * params_[i].element_size();
    size_t cap = first_done[st] ? options_.bucket_bytes : options_.first_bucket_bytes;
    if (open_bytes[st] >= cap) {
      open.erase(st);
      first_done[st] = true;
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto& bk = buckets_[b];
    int64_t total = 0;
    for (size_t i : bk.params) total += params_[i].numel();
    const auto& p0 = params_[bk.params.front()];
    bk.grad.index = b;
    // CPU buckets live in memory the group reduces in place without staging copies (the shm backend
    // maps every rank's bucket into every rank). Collective: every rank builds the same buckets.
    auto opts = p0.options().requires_grad(false);
    bk.grad.buffer = p0.is_cpu() ? alloc_buffer_tensor(*group_, total, opts) : torch::zeros({total}, opts);
    int64_t off = 0;
    for (size_t i : bk.params) {
      auto n = params_[i].numel();
      // detach(): a plain tensor sharing the bucket's memory, not an autograd view, so
      // optimizer.zero_grad() may detach_() it.
      views_[i] = bk.grad.buffer.narrow(0, off, n).view(params_[i].sizes()).detach();
      off += n;
      // What stateful hooks (error feedback, PowerSGD) see: per-parameter views and stable ids.
      bk.grad.gradients.push_back(views_[i]);
      bk.grad.param_ids.push_back(i);
    }
  }
  // Gradients that were views of the old buffers move to the new ones.
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& g = params_[i].mutable_grad();
    if (!g.defined()) continue;
    views_[i].copy_(g);
    if (options_.gradient_as_bucket_view) g = views_[i];
  }
}

std::vector<std::vector<size_t>> Reducer::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets_) out.push_back(b.params);
  return out;
}

void Reducer::set_comm_hook(CommHook hook) {
  if (iter_active_) GZ_THROW(Error, "DistributedDataParallel: cannot change the comm hook during backward");
  options_.comm_hook = hook ? std::move(hook) : allreduce_hook();
}

void Reducer::set_join_mode(bool on) {
  join_mode_ = on;
  if (!on) divisor_ = group_->size();
}

int Reducer::announce_active(bool broadcast_buffers) {
  if (!join_mode_ || announced_) return join_mode_ ? active_root_ : 0;
  std::vector<int64_t> mine{1, broadcast_buffers ? 1 : 0};
  std::vector<int64_t> all(2 * group_->size());
  group_->allgather(mine.data(), all.data(), 2, DType::i64);
  int active = 0, root = -1;
  for (int r = 0; r < group_->size(); ++r)
    if (all[2 * r]) {
      ++active;
      if (root < 0) root = r;
    }
  divisor_ = active;
  active_root_ = root;
  last_active_root_ = root;
  announced_ = true;
  return root;
}

void Reducer::begin_iteration() {
  iter_active_ = true;
  std::fill(ready_.begin(), ready_.end(), 0);
  used_.zero_();
  next_launch_ = 0;
  for (auto& b : buckets_) b.pending = b.params.size();
  if (join_mode_) announce_active(false);
  std::weak_ptr<Reducer> self = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto r = self.lock()) r->finalize_backward();
  });
}

void Reducer::on_grad_ready(size_t index) {
  if (!sync_enabled_) return;  // no_sync(): keep accumulating locally
  if (!iter_active_) begin_iteration();
  if (ready_[index]) return;
  mark_ready(index, false);
  used_.data_ptr<uint8_t>()[index] = 1;
  launch_ready_buckets();
}

void Reducer::mark_ready(size_t index, bool zero) {
  torch::NoGradGuard no_grad;
  ready_[index] = 1;
  if (!rebuilt_ && !zero) ready_order_.push_back(index);
  auto& view = views_[index];
  const auto& g = params_[index].grad();
  if (zero || !g.defined()) {
    view.zero_();
  } else if (!is_bound_to(g, view)) {
    view.copy_(g);
    if (options_.gradient_as_bucket_view) bind_grad(index);
  }
  --buckets_[bucket_of_[index]].pending;
}

void Reducer::bind_grad(size_t index) { params_[index].mutable_grad() = views_[index]; }

void Reducer::launch_ready_buckets() {
  // Same launch order on every rank: bucket b only after buckets 0..b-1.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket* bk = &buckets_[next_launch_++];
    comm::Communicator* g = group_.get();
    CommHook* hook = &options_.comm_hook;
    double* div = &divisor_;
    bk->work = group_->submit([bk, g, hook, div] {
      bk->grad.divisor = *div;
      (*hook)(*g, bk->grad);
    });
  }
}

// The bucket ops capture pointers into this Reducer (bucket, hook, divisor): a Work is dropped
// only once its op has returned. One still running past its deadline is aborted first.
void Reducer::settle(Bucket& b, std::exception_ptr* first_error) noexcept {
  if (!b.work) return;
  try {
    b.work->wait();
  } catch (...) {
    if (first_error && !*first_error) *first_error = std::current_exception();
  }
  if (!b.work->is_completed())
    comm::finish_or_abort(*group_, *b.work,
                          "DistributedDataParallel: a bucket all-reduce still running past its deadline");
  b.work.reset();
}

void Reducer::wait_all_buckets() noexcept {
  for (auto& b : buckets_) settle(b, nullptr);
}

void Reducer::finalize_backward() {
  iter_active_ = false;
  announced_ = false;
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing.push_back(i);
  if (!missing.empty() && !options_.find_unused_parameters) {
    std::string names;
    for (size_t k = 0; k < missing.size() && k < 20; ++k) names += (k ? ", " : "") + names_[missing[k]];
    if (missing.size() > 20) names += ", ...";
    wait_all_buckets();
    GZ_THROW(Error, "DistributedDataParallel: rank ", group_->rank(), ": ", missing.size(), " of ",
             params_.size(), " parameters received no gradient in this backward: ", names,
             ". Construct DDP with find_unused_parameters = true, or make every parameter "
             "contribute to the loss (other ranks may now time out waiting for these buckets)");
  }
  for (size_t i : missing) mark_ready(i, true);
  launch_ready_buckets();
  torch::Tensor used_global;
  if (options_.find_unused_parameters) {
    used_global = used_.clone();
    group_->allreduce(used_global.data_ptr(), params_.size(), DType::u8, comm::ReduceOp::max);
  }
  std::exception_ptr err;
  for (auto& b : buckets_) settle(b, &err);
  if (err) std::rethrow_exception(err);
  torch::NoGradGuard no_grad;
  const uint8_t* ug = used_global.defined() ? used_global.data_ptr<uint8_t>() : nullptr;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ug && !ug[i]) continue;  // unused on every rank: leave .grad as it was
    auto& g = params_[i].mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!is_bound_to(g, views_[i])) g = views_[i];
    } else if (!g.defined()) {
      g = views_[i].clone();
    } else {
      g.copy_(views_[i]);
    }
  }
  if (!rebuilt_) rebuild_buckets(join_mode_ ? active_root_ : 0);
}

void Reducer::rebuild_buckets(int root) {
  // Rank `root`'s observed order wins so every rank builds the same buckets.
  std::vector<int64_t> order(params_.size(), -1);
  std::vector<uint8_t> seen(params_.size(), 0);
  size_t k = 0;
  for (size_t i : ready_order_)
    if (!seen[i]) {
      seen[i] = 1;
      order[k++] = static_cast<int64_t>(i);
    }
  for (size_t i = params_.size(); i-- > 0;)
    if (!seen[i]) order[k++] = static_cast<int64_t>(i);
  if (group_->size() > 1) group_->broadcast(order.data(), order.size(), DType::i64, root);
  std::vector<size_t> o(order.begin(), order.end());
  for (auto v : order)
    if (v < 0 || static_cast<size_t>(v) >= params_.size())
      GZ_THROW(PeerError, "DistributedDataParallel: rank ", group_->rank(), ": bad bucket order from rank ", root);
  build_buckets(o);
  rebuilt_ = true;
  ready_order_.clear();
  ++num_rebuilds_;
}

void Reducer::join_and_shadow(const std::vector<torch::Tensor>& buffers) {
  if (!join_mode_) GZ_THROW(Error, "DistributedDataParallel: join_and_shadow outside join mode");
  if (iter_active_) GZ_THROW(Error, "DistributedDataParallel: join() scope left in the middle of backward");
  torch::NoGradGuard no_grad;
  const int n = group_->size();
  for (;;) {
    std::vector<int64_t> mine{0, 0};
    std::vector<int64_t> all(2 * n);
    group_->allgather(mine.data(), all.data(), 2, DType::i64);
    int active = 0, root = -1;
    bool bcast = false;
    for (int r = 0; r < n; ++r)
      if (all[2 * r]) {
        ++active;
        if (root < 0) root = r;
        bcast = bcast || all[2 * r + 1];
      }
    if (active == 0) break;
    last_active_root_ = root;
    // Mirror one synchronised iteration of the active ranks, contributing zeros.
    if (bcast)
      for (auto& b : buffers) {
        TensorSpan s(b, *group_, "broadcast");
        group_->broadcast(s.data(), s.count(), s.dtype(), root);
        s.finish();
      }
    for (auto& bk : buckets_) {
      bk.grad.buffer.zero_();
      bk.grad.divisor = 1;
      options_.comm_hook(*group_, bk.grad);
    }
    if (options_.find_unused_parameters) {
      auto zeros = torch::zeros_like(used_);
      group_->allreduce(zeros.data_ptr(), params_.size(), DType::u8, comm::ReduceOp::max);
    }
    if (!rebuilt_) {
      ready_order_.clear();
      rebuild_buckets(root);
    }
  }
  // Everyone joined: the ranks that stayed longest hold the trained model.
  if (last_active_root_ >= 0 && n > 1) {
    for (auto& p : params_) {
      TensorSpan s(p.detach(), *group_, "broadcast");
      group_->broadcast(s.data(), s.count(), s.dtype(), last_active_root_);
      s.finish();
    }
    for (auto& b : buffers) {
      TensorSpan s(b, *group_, "broadcast");
      group_->broadcast(s.data(), s.count(), s.dtype(), last_active_root_);
      s.finish();
    }
  }
  last_active_root_ = -1;
}

}  // namespace gz
