#include "gz/torch/reducer.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/bucket_plan.h"
#include "gz/torch/row_sparse.h"
#include "gz/torch/tensor_adapter.h"

// How: a post hook on each parameter's gradient accumulator copies the gradient into its bucket's
// persistent flat buffer (or binds .grad to its view of it); a bucket whose gradients are all ready
// is reduced asynchronously on the group's progress thread while backward goes on, buckets in index
// order on every rank. A callback queued on the autograd engine waits for all buckets at the end of
// backward. Buckets start in reverse registration order and are rebuilt once, from the
// gradient-ready order rank 0 (or the lowest active rank) observed in the first iteration.
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
  row_sparse_.assign(params_.size(), 0);
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
  // One dtype per bucket; a row-sparse gradient travels in a bucket of its own (gz/torch/bucket_plan.h).
  std::vector<BucketItem> items(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    items[i] = {static_cast<size_t>(params_[i].numel() * params_[i].element_size()),
                static_cast<uint64_t>(params_[i].scalar_type()), row_sparse_[i] != 0};
  BucketLimits limits;
  limits.first_bucket_bytes = options_.first_bucket_bytes;
  limits.bucket_bytes = options_.bucket_bytes;
  limits.min_buckets = options_.min_buckets;
  allocate_buckets(plan_buckets(items, order, limits));
}

void Reducer::allocate_buckets(const std::vector<std::vector<size_t>>& layout) {
  torch::NoGradGuard no_grad;
  buckets_.clear();
  buckets_.resize(layout.size());
  bucket_of_.assign(params_.size(), 0);
  offsets_.assign(params_.size(), 0);
  std::vector<torch::Tensor> old_views = std::move(views_);
  views_.assign(params_.size(), torch::Tensor());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto& bk = buckets_[b];
    bk.params = layout[b];
    int64_t total = 0;
    for (size_t i : bk.params) {
      bucket_of_[i] = b;
      offsets_[i] = total;
      total += params_[i].numel();
    }
    // Padded (BucketPlan): at least one block, so even an empty bucket splits over the ranks.
    bk.numel = pad_multiple_ == 1
                   ? total
                   : std::max<int64_t>(1, (total + pad_multiple_ - 1) / pad_multiple_) * pad_multiple_;
    bk.grad.index = b;
    if (transient_) continue;  // memory comes with the bucket's first gradient (mark_ready)
    const auto& p0 = params_[bk.params.front()];
    // CPU buckets live in memory the group reduces in place without staging copies (the shm backend
    // maps every rank's bucket into every rank). Collective: every rank builds the same buckets.
    auto opts = p0.options().requires_grad(false);
    bk.grad.buffer =
        p0.is_cpu() ? alloc_buffer_tensor(*group_, bk.numel, opts) : torch::zeros({bk.numel}, opts);
    for (size_t i : bk.params) {
      // detach(): a plain tensor sharing the bucket's memory, not an autograd view, so
      // optimizer.zero_grad() may detach_() it.
      views_[i] = bk.grad.buffer.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes()).detach();
      // What stateful hooks (error feedback, PowerSGD) see: per-parameter views and stable ids.
      bk.grad.gradients.push_back(views_[i]);
      bk.grad.param_ids.push_back(i);
    }
    if (row_sparse_[bk.params.front()]) {
      bk.grad.rows = views_[bk.params.front()];
      bk.grad.row_sparse = options_.row_sparse;
    }
  }
  if (transient_) return;  // gradients stay where they are until their bucket is reduced
  // Gradients that were views of the old buffers move to the new ones.
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& g = params_[i].mutable_grad();
    if (!g.defined()) continue;
    views_[i].copy_(g);
    if (options_.gradient_as_bucket_view) g = views_[i];
  }
}

int64_t Reducer::last_rows_exchanged(size_t i) const {
  if (!row_sparse_.at(i)) return -1;
  return buckets_[bucket_of_[i]].grad.row_state.last_rows;
}

std::vector<std::vector<size_t>> Reducer::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets_) out.push_back(b.params);
  return out;
}

void Reducer::set_comm_hook(CommHook hook) {
  if (!hook_owner_.empty())
    GZ_THROW(Error, "DistributedDataParallel: the comm hook belongs to ", hook_owner_,
             "; a hook registered now would replace it and leave that optimizer nothing to step");
  if (iter_active_) GZ_THROW(Error, "DistributedDataParallel: cannot change the comm hook during backward");
  options_.comm_hook = hook ? std::move(hook) : allreduce_hook();
}

void Reducer::own_comm_hook(CommHook hook, std::string owner) {
  if (iter_active_) GZ_THROW(Error, "DistributedDataParallel: cannot change the comm hook during backward");
  options_.comm_hook = hook ? std::move(hook) : allreduce_hook();
  hook_owner_ = std::move(owner);
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
  if (timeline_) timeline_->instant("ddp", "ready " + names_[index]);
  mark_ready(index, true);
  used_.data_ptr<uint8_t>()[index] = 1;
  launch_ready_buckets();
}

void Reducer::mark_ready(size_t index, bool observed) {
  torch::NoGradGuard no_grad;
  ready_[index] = 1;
  if (!rebuilt_ && observed) ready_order_.push_back(index);
  if (transient_) {
    mark_ready_transient(index);
    return;
  }
  // A parameter without a gradient in this backward still contributes the one it holds (accumulated
  // under no_sync(), as PyTorch's Reducer does), or zeros.
  auto& view = views_[index];
  const auto& g = params_[index].grad();
  if (!g.defined()) {
    view.zero_();
  } else if (g.is_sparse()) {
    // A sparse gradient (nn::Embedding with sparse(true)) where .grad was unset: densified into the
    // bucket (AccumulateGrad adds later ones in place once .grad is the bucket view).
    view.zero_();
    view.add_(g);
    if (options_.gradient_as_bucket_view) bind_grad(index);
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
    Timeline* tl = timeline_;
    const auto queued = Clock::now();
    const bool release = transient_;
    bk->work = group_->submit([bk, g, hook, div, tl, queued, release] {
      bk->grad.divisor = *div;
      if (!tl) {
        (*hook)(*g, bk->grad);
        if (release) bk->grad.buffer = torch::Tensor();  // transient: the hook kept what it needed
        return;
      }
      // Queued = submitted to started on the progress thread; cpu = that thread's CPU time in the
      // hook (far below the span: it waited on the wire or for a core).
      const auto start = Clock::now();
      const double cpu0 = Timeline::thread_cpu_us();
      (*hook)(*g, bk->grad);
      const double cpu = Timeline::thread_cpu_us() - cpu0;
      const auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
      const auto& buf = bk->grad.buffer;
      int64_t wire = buf.numel() * buf.element_size();  // per rank, dense; rows: all ranks' rows
      std::string rows;
      if (bk->grad.rows.defined() && bk->grad.row_state.last_rows >= 0) {
        const int64_t n = bk->grad.row_state.last_rows;
        wire = n * (wire / std::max<int64_t>(bk->grad.rows.size(0), 1) + 8);
        rows = ",\"rows\":" + std::to_string(n);
      }
      tl->span("comm", "bucket " + std::to_string(bk->grad.index), start, Clock::now(),
               "\"bytes\":" + std::to_string(buf.numel() * buf.element_size()) + ",\"wire_bytes\":" +
                   std::to_string(wire) + rows + ",\"params\":" + std::to_string(bk->params.size()) +
                   ",\"queued_us\":" + std::to_string(us(start - queued)) +
                   ",\"cpu_us\":" + std::to_string(cpu));
      if (release) bk->grad.buffer = torch::Tensor();
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
  const auto t0 = Clock::now();
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
  // A missing parameter that holds a gradient (accumulated in no_sync() micro-steps) counts as
  // used: every rank then writes the average back.
  for (size_t i : missing) {
    if (params_[i].grad().defined()) used_.data_ptr<uint8_t>()[i] = 1;
    mark_ready(i, false);
  }
  launch_ready_buckets();
  torch::Tensor used_global;
  if (options_.find_unused_parameters) {
    ScopedPhase waiting(Phase::comm);
    used_global = used_.clone();
    group_->allreduce(used_global.data_ptr(), params_.size(), DType::u8, comm::ReduceOp::max);
  }
  std::exception_ptr err;
  {
    ScopedPhase waiting(Phase::comm);  // backward's exposed wait for the gradient all-reduces
    for (auto& b : buckets_) settle(b, &err);
  }
  if (timeline_) timeline_->span("ddp", "wait for buckets", t0, Clock::now());
  if (err) std::rethrow_exception(err);
  torch::NoGradGuard no_grad;
  const uint8_t* ug = used_global.defined() ? used_global.data_ptr<uint8_t>() : nullptr;
  for (size_t i = 0; i < params_.size() && !transient_; ++i) {
    if (ug && !ug[i]) continue;  // unused on every rank: leave .grad as it was
    auto& g = params_[i].mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!is_bound_to(g, views_[i])) g = views_[i];
    } else if (!g.defined() || g.is_sparse()) {
      g = views_[i].clone();
    } else {
      g.copy_(views_[i]);
    }
  }
  if (!rebuilt_) rebuild_buckets(join_mode_ ? active_root_ : 0);
}

void Reducer::rebuild_buckets(int root) {
  // Rank `root`'s observed order and row-sparse choice win so every rank builds the same buckets:
  // [order of the P parameters | P flags], one broadcast. The flags come from the averaged
  // gradients of this first iteration (the same on every active rank).
  const size_t np = params_.size();
  std::vector<int64_t> plan(2 * np, -1);
  std::vector<uint8_t> seen(np, 0);
  size_t k = 0;
  for (size_t i : ready_order_)
    if (!seen[i]) {
      seen[i] = 1;
      plan[k++] = static_cast<int64_t>(i);
    }
  for (size_t i = np; i-- > 0;)
    if (!seen[i]) plan[k++] = static_cast<int64_t>(i);
  if (group_->rank() == root)
    for (size_t i = 0; i < np; ++i)
      plan[np + i] = is_row_sparse_candidate(views_[i], options_.row_sparse) ? 1 : 0;
  if (group_->size() > 1) group_->broadcast(plan.data(), plan.size(), DType::i64, root);
  std::vector<size_t> o(np);
  std::vector<uint8_t> used(np, 0);
  for (size_t j = 0; j < np; ++j) {
    const int64_t v = plan[j];
    if (v < 0 || static_cast<size_t>(v) >= np || used[v] || (plan[np + j] != 0 && plan[np + j] != 1))
      GZ_THROW(PeerError, "DistributedDataParallel: rank ", group_->rank(), ": bad bucket plan from rank ",
               root);
    used[v] = 1;
    o[j] = static_cast<size_t>(v);
    row_sparse_[j] = static_cast<uint8_t>(plan[np + j]);
  }
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
      if (transient_)
        bk.grad.buffer = torch::zeros({bk.numel}, params_[bk.params.front()].options().requires_grad(false));
      bk.grad.buffer.zero_();
      bk.grad.divisor = 1;
      options_.comm_hook(*group_, bk.grad);
      if (transient_) bk.grad.buffer = torch::Tensor();
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

namespace gz {

// --- BucketPlan: buckets fixed by the caller (ZeRO) ---

void Reducer::set_bucket_plan(BucketPlan plan) {
  if (iter_active_) GZ_THROW(Error, "DistributedDataParallel: cannot change buckets during backward");
  GZ_CHECK_ARG(plan.pad_multiple > 0, "BucketPlan: pad_multiple must be positive");
  std::vector<uint8_t> seen(params_.size(), 0);
  for (auto& bucket : plan.layout) {
    GZ_CHECK_ARG(!bucket.empty(), "BucketPlan: empty bucket");
    for (size_t i : bucket) {
      GZ_CHECK_ARG(i < params_.size() && !seen[i], "BucketPlan: parameter index ", i,
                   " out of range or in two buckets");
      GZ_CHECK_ARG(params_[i].scalar_type() == params_[bucket.front()].scalar_type() &&
                       params_[i].device() == params_[bucket.front()].device(),
                   "BucketPlan: bucket mixes dtypes or devices ('", names_[i], "')");
      seen[i] = 1;
    }
  }
  for (size_t i = 0; i < params_.size(); ++i)
    GZ_CHECK_ARG(seen[i], "BucketPlan: parameter '", names_[i], "' is in no bucket");
  wait_all_buckets();
  pad_multiple_ = plan.pad_multiple;
  transient_ = plan.transient;
  // The caller's buckets are dense (ZeRO splits each into blocks): no row-sparse exchange.
  row_sparse_.assign(params_.size(), 0);
  allocate_buckets(plan.layout);
  rebuilt_ = true;  // the caller's layout stays
  ready_order_.clear();
}

void Reducer::mark_ready_transient(size_t index) {
  auto& bk = buckets_[bucket_of_[index]];
  auto& p = params_[index];
  if (!bk.grad.buffer.defined()) {
    bk.grad.buffer = torch::empty({bk.numel}, p.options().requires_grad(false));
    int64_t used = 0;
    for (size_t i : bk.params) used += params_[i].numel();
    bk.grad.buffer.narrow(0, used, bk.numel - used).zero_();  // the padding
  }
  auto slot = bk.grad.buffer.narrow(0, offsets_[index], p.numel());
  auto& g = p.mutable_grad();
  if (!g.defined())
    slot.zero_();
  else
    slot.view(p.sizes()).copy_(g);
  g = torch::Tensor();  // the bucket holds it now; freed with the bucket once reduced
  --bk.pending;
}

}  // namespace gz
