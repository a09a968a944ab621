// DistributedOptimizer: the autograd hooks that submit gradients (training thread), the step's
// background loop (progress thread, src/torch/horovod/cycle_loop.cpp) and the step boundary.
#include "gz/torch/distributed_optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <utility>

#include "gz/core/error.h"
#include "gz/core/phase.h"
#include "gz/torch/process_group.h"
#include "gz/torch/tensor_adapter.h"
#include "torch/horovod/cycle_loop.h"
#include "torch/horovod/fusion.h"
#include "torch/horovod/gradient_arena.h"

namespace gz {

struct DistributedOptimizer::Impl {
  class Hook;
  Impl(std::shared_ptr<torch::optim::Optimizer> opt, NamedParameters named,
       const DistributedOptimizerOptions& o, comm::CommPtr g);
  void install_hooks();
  void on_ready(size_t index);
  void run_step();
  size_t index_of(const std::string& name) const;

  std::shared_ptr<torch::optim::Optimizer> optimizer;
  comm::CommPtr group;
  DistributedOptimizerOptions options;
  std::vector<std::string> names;     // sorted: the agreed order
  std::vector<torch::Tensor> params;  // same order
  std::unique_ptr<horovod::GradientArena> arena;
  std::unique_ptr<horovod::Fusion> fusion;  // the progress thread's, between synchronize() calls
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;
  std::shared_ptr<std::atomic<Impl*>> alive;  // the hooks' way in; null once destruction began
  std::vector<int> passes;                    // backward passes seen per tensor this step
  horovod::Submissions subs;
  comm::WorkPtr loop;  // the step's background loop; guarded by subs.mu
  // A submit that failed in a hook (an aborted group), rethrown by synchronize(); guarded by
  // subs.mu. Thrown in the hook, it would fail backward(), where Python's autograd turns it into
  // a plain RuntimeError: in-place recovery must see gz::Aborted, from the step.
  std::exception_ptr submit_error;
  int last_cycles = 0;
  bool last_replayed = false;
  Timeline* timeline = Timeline::process();  // GZ_TIMELINE: per-step events, else null
};

// Fires after AccumulateGrad wrote the parameter's .grad.
class DistributedOptimizer::Impl::Hook : public torch::autograd::FunctionPostHook {
 public:
  Hook(std::shared_ptr<std::atomic<Impl*>> owner, size_t index) : owner_(std::move(owner)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto* o = owner_->load()) o->on_ready(index_);
    return outputs;
  }

 private:
  std::shared_ptr<std::atomic<Impl*>> owner_;
  size_t index_;
};

DistributedOptimizer::Impl::Impl(std::shared_ptr<torch::optim::Optimizer> opt, NamedParameters named,
                                 const DistributedOptimizerOptions& o, comm::CommPtr g)
    : optimizer(std::move(opt)), group(resolve_group(g)), options(o) {
  GZ_CHECK_ARG(options.backward_passes_per_step >= 1,
               "backward_passes_per_step = ", options.backward_passes_per_step);
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < named.size(); ++i) {
    auto& [name, p] = named[i];
    if (i > 0 && name == named[i - 1].first)
      GZ_THROW(InvalidArgument, "DistributedOptimizer: duplicate parameter name '", name, "'");
    if (!p.requires_grad()) continue;
    check_device(p, *group, "DistributedOptimizer");
    to_dtype(p.scalar_type(), "DistributedOptimizer");
    names.push_back(name);
    params.push_back(p);
  }
  passes.assign(params.size(), 0);
  subs.submitted.assign(params.size(), 0);
  // Collective, in this order on every rank: the fusion buffer, then the arena.
  fusion = std::make_unique<horovod::Fusion>(group, params, names, options);
  arena = std::make_unique<horovod::GradientArena>(*group, params);
  alive = std::make_shared<std::atomic<Impl*>>(this);
}

void DistributedOptimizer::Impl::install_hooks() {
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    if (!acc) GZ_THROW(InvalidArgument, "DistributedOptimizer: parameter '", names[i], "' is not a leaf");
    hook_keys.push_back(acc->add_post_hook(std::make_unique<Hook>(alive, i)));
    accumulators.push_back(std::move(acc));
  }
}

void DistributedOptimizer::Impl::on_ready(size_t index) {
  arena->rebind(index);
  if (++passes[index] < options.backward_passes_per_step) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(subs.mu);
    if (subs.submitted[index]) return;
    subs.submitted[index] = 1;
    wake = ++subs.count == params.size();
    wake = subs.schedule.submitted(index) || wake;
    if (!loop && !submit_error) {
      try {
        loop = group->submit([this] { run_step(); });
      } catch (...) {
        submit_error = std::current_exception();
      }
    }
  }
  // The loop waits out its cycle time (or, replaying, for its next group); only the last gradient
  // of the step or of a replayed group cuts that short.
  if (wake) subs.cv.notify_all();
}

void DistributedOptimizer::Impl::run_step() {
  auto outcome = horovod::CycleLoop(*group, subs, *fusion, names, options, timeline).run();
  last_cycles = outcome.cycles;
  last_replayed = outcome.replayed;
  // After the first step, before its schedule is recorded: the replayed buckets are sized over the
  // gradients that stay dense.
  if (!fusion->row_sparse_decided()) fusion->decide_row_sparse();
  if (!options.replay_schedule) return;
  std::vector<size_t> dense(params.size());
  for (size_t i = 0; i < params.size(); ++i) dense[i] = fusion->dense_bytes(i);
  BucketLimits limits;
  limits.first_bucket_bytes = std::min(options.replay_bucket_bytes, size_t(1) << 20);
  limits.bucket_bytes = options.replay_bucket_bytes;
  limits.min_buckets = options.replay_min_buckets;
  std::lock_guard<std::mutex> lock(subs.mu);
  subs.schedule.record(outcome.executed, dense, limits);
}

size_t DistributedOptimizer::Impl::index_of(const std::string& name) const {
  auto it = std::lower_bound(names.begin(), names.end(), name);
  if (it == names.end() || *it != name)
    GZ_THROW(InvalidArgument, "DistributedOptimizer: no tensor '", name, "'");
  return static_cast<size_t>(it - names.begin());
}

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                           NamedParameters named_parameters, Compression compression,
                                           int backward_passes_per_step, comm::CommPtr group)
    : DistributedOptimizer(
          std::move(optimizer), std::move(named_parameters),
          [&] {
            DistributedOptimizerOptions o;
            o.compression = compression;
            o.backward_passes_per_step = backward_passes_per_step;
            return o;
          }(),
          std::move(group)) {}

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                           NamedParameters named_parameters,
                                           const DistributedOptimizerOptions& options, comm::CommPtr group)
    : impl_(std::make_unique<Impl>(std::move(optimizer), std::move(named_parameters), options,
                                   std::move(group))) {
  impl_->install_hooks();
}

DistributedOptimizer::~DistributedOptimizer() {
  auto& im = *impl_;
  im.alive->store(nullptr);
  // The loop runs on the progress thread with `im`: it must have returned before any member goes.
  // No more gradients will come, so let it stop waiting for them.
  comm::WorkPtr loop;
  {
    std::lock_guard<std::mutex> lock(im.subs.mu);
    loop = im.loop;
    im.subs.closing = true;
  }
  im.subs.cv.notify_all();
  if (loop)
    comm::finish_or_abort(*im.group, *loop,
                          "DistributedOptimizer destroyed while its step was still running");
  for (size_t i = 0; i < im.accumulators.size(); ++i) im.accumulators[i]->del_post_hook(im.hook_keys[i]);
}

void DistributedOptimizer::synchronize() {
  ScopedPhase waiting(Phase::comm);  // the exposed wait for this step's gradient reductions
  auto& im = *impl_;
  comm::WorkPtr loop;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(im.subs.mu);
    loop = im.loop;
    err = std::exchange(im.submit_error, nullptr);
    im.subs.closing = true;  // no more gradients this step: a replayed group still incomplete never will be
  }
  im.subs.cv.notify_all();
  if (loop) {
    try {
      loop->wait();
    } catch (...) {
      err = std::current_exception();
    }
    // Past its deadline and still running: abort, so it returns before the next step reuses state.
    if (!loop->is_completed())
      comm::finish_or_abort(*im.group, *loop,
                            "DistributedOptimizer: a step's reduction outlived its deadline");
  }
  {
    std::lock_guard<std::mutex> lock(im.subs.mu);
    im.loop.reset();
    std::fill(im.subs.submitted.begin(), im.subs.submitted.end(), 0);
    im.subs.count = 0;
    im.subs.closing = false;
    if (err) im.subs.schedule.clear();  // a failed step's schedule means nothing; negotiate the next one
    im.subs.schedule.rearm();
  }
  std::fill(im.passes.begin(), im.passes.end(), 0);
  if (err) std::rethrow_exception(err);
}

void DistributedOptimizer::submit_zeros() {
  auto& im = *impl_;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : im.params) {
      auto& g = p.mutable_grad();
      if (g.defined())
        g.zero_();
      else
        g = torch::zeros_like(p);
    }
  }
  for (size_t i = 0; i < im.params.size(); ++i) {
    im.passes[i] = im.options.backward_passes_per_step - 1;
    im.on_ready(i);
  }
}

void DistributedOptimizer::step() {
  if (!impl_->optimizer)
    GZ_THROW(InvalidArgument, "DistributedOptimizer::step: constructed without an optimizer");
  synchronize();
  impl_->optimizer->step();
}

void DistributedOptimizer::zero_grad() {
  if (!impl_->optimizer)
    GZ_THROW(InvalidArgument, "DistributedOptimizer::zero_grad: constructed without an optimizer");
  impl_->optimizer->zero_grad();
}

void DistributedOptimizer::set_backward_passes_per_step(int n) {
  GZ_CHECK_ARG(n >= 1, "backward_passes_per_step = ", n);
  std::lock_guard<std::mutex> lock(impl_->subs.mu);
  impl_->options.backward_passes_per_step = n;
}

torch::optim::Optimizer& DistributedOptimizer::optimizer() { return *impl_->optimizer; }
const comm::CommPtr& DistributedOptimizer::group() const { return impl_->group; }
int DistributedOptimizer::last_cycles() const { return impl_->last_cycles; }
bool DistributedOptimizer::last_step_replayed() const { return impl_->last_replayed; }

bool DistributedOptimizer::row_sparse(const std::string& name) const {
  return impl_->fusion->row_sparse(impl_->index_of(name));
}

int64_t DistributedOptimizer::last_rows_exchanged(const std::string& name) const {
  return impl_->fusion->last_rows(impl_->index_of(name));
}

}  // namespace gz
