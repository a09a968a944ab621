// FullyShardedDataParallel's backward: an autograd node on each unit's output gathers the unit
// again (and prefetches the one before it); hooks on the parameters' gradient accumulators count
// its gradients; once all are in, its flat gradient is reduce-scattered into this rank's shard.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <exception>

#include "gz/core/error.h"
#include "gz/torch/collectives.h"
#include "gz/torch/tensor_adapter.h"
#include "torch/fsdp/fsdp_impl.h"

namespace gz {

namespace {

using Impl = FullyShardedDataParallel::Impl;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Which unit a PreBackward node belongs to; held weakly, so a graph that outlives its
// FullyShardedDataParallel only skips the gather.
struct UnitRef : torch::CustomClassHolder {
  UnitRef(std::weak_ptr<Impl> s, size_t u) : impl(std::move(s)), unit(u) {}
  std::weak_ptr<Impl> impl;
  size_t unit;
};

// Identity in forward; in backward it runs before any node of the unit (all of the unit's
// gradients flow through its output), so the unit is whole when its own nodes read it.
struct PreBackward : torch::autograd::Function<PreBackward> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               c10::intrusive_ptr<UnitRef> ref) {
    ctx->saved_data["unit"] = c10::IValue::make_capsule(std::move(ref));
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = ctx->saved_data["unit"].toCapsule();
    auto* ref = static_cast<UnitRef*>(holder.get());
    if (auto s = ref->impl.lock())
      if (!s->pre_backward(ref->unit)) return {torch::Tensor(), torch::Tensor()};
    return {grads[0], torch::Tensor()};
  }
};

// Fires after AccumulateGrad added the parameter's gradient (same signature in 1.13 and 2.x).
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<Impl> s, size_t unit, size_t param)
      : impl_(std::move(s)), unit_(unit), param_(param) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    if (auto s = impl_.lock()) s->on_grad_ready(unit_, param_);
    return outputs;
  }

 private:
  std::weak_ptr<Impl> impl_;
  size_t unit_, param_;
};

}  // namespace

void Impl::install_hooks() {
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t j = 0; j < units[u].params.size(); ++j) {
      auto acc = torch::autograd::impl::grad_accumulator(units[u].params[j]);
      if (!acc)
        GZ_THROW(InvalidArgument, "fully_shard: parameter '", units[u].param_names[j], "' is not a leaf");
      hook_keys.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(weak_from_this(), u, j)));
      accumulators.push_back(std::move(acc));
    }
}

void Impl::remove_hooks() noexcept {
  for (size_t i = 0; i < accumulators.size(); ++i) accumulators[i]->del_post_hook(hook_keys[i]);
}

torch::Tensor Impl::attach_pre_backward(size_t u, const torch::Tensor& out) {
  return PreBackward::apply(out, c10::make_intrusive<UnitRef>(weak_from_this(), u));
}

bool Impl::pre_backward(size_t i) {
  if (!callback_queued) {
    std::weak_ptr<Impl> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto s = weak.lock()) s->end_backward();
    });
    callback_queued = true;
    // Units the model never runs through run_unit() have no node of their own (they stay whole):
    // their backward starts with the first unit's, the root's.
    for (size_t k = 1; k < units.size(); ++k)
      if (units[k].always_whole) pre_backward(k);
  }
  auto& u = units[i];
  if (u.in_backward || u.params.empty()) return true;  // a unit run twice in the forward: once is enough
  ensure_whole(i);
  if (pos_in_order[i] > 0) prefetch(pos_in_order[i] - 1);  // backward runs the forward order back
  torch::NoGradGuard no_grad;
  if (!u.grad_full.defined()) {
    u.grad_full = torch::zeros({u.layout.padded(world)}, u.shard.options().requires_grad(false));
    track(fsdp_bytes_of(u.grad_full));
  }
  // AccumulateGrad adds in place into a defined .grad: the gradients land in the flat buffer.
  for (size_t j = 0; j < u.params.size(); ++j) {
    auto view = u.grad_full.narrow(0, u.layout.offsets[j], u.layout.numels[j]).view(u.params[j].sizes());
    auto& g = u.params[j].mutable_grad();
    if (g.defined() && !is_bound_to(g, view)) view.add_(g);  // a .grad set by someone else
    g = view;
  }
  u.pending = u.expected;
  u.in_backward = true;
  if (u.pending == 0) grads_ready(i);  // find_unused_parameters: tied, or none of it is reached
  return !u.tied;
}

void Impl::on_grad_ready(size_t i, size_t j) {
  auto& u = units[i];
  if (u.tied) return;  // its zeros are reduced; an undefined gradient passed through its nodes
  if (!u.in_backward)
    GZ_THROW(Error, "FullyShardedDataParallel: rank ", rank, ": parameter '", u.param_names[j],
             "' got a gradient outside its unit's backward: was it used outside forward() or, for a unit, ",
             "outside gz::run_unit()?");
  if (u.pending > 0 && --u.pending == 0) grads_ready(i);
}

void Impl::grads_ready(size_t i) {
  auto& u = units[i];
  u.in_backward = false;
  // Every node that reads the unit has run; with find_unused_parameters a node may read a
  // parameter without a gradient edge (detach()), so a unit not all reached waits for the end.
  if (!u.always_whole && (u.tied || u.expected >= u.params.size())) release_full(u);
  if (!sync) return;                     // no_sync(): grad_full keeps the sum, .grad stays a view of it
  for (auto& p : u.params) p.mutable_grad() = torch::Tensor();
  const auto wire = options.reduce_dtype.value_or(u.grad_full.scalar_type());
  if (wire == u.grad_full.scalar_type()) {
    u.reduced = torch::empty({u.layout.shard}, u.grad_full.options());
    u.reduce = reduce_scatter_async(u.grad_full, u.reduced, comm::ReduceOp::avg, group);
  } else {
    // Divided before the cast, so that the sum of world values stays in the narrow type's range.
    auto narrow = u.grad_full.div_(world).to(wire);  // grad_full is dropped below
    u.reduced = torch::empty({u.layout.shard}, narrow.options());
    u.reduce = reduce_scatter_async(narrow, u.reduced, comm::ReduceOp::sum, group);
  }
  track(-fsdp_bytes_of(u.grad_full));  // the op holds it until it returns, within this backward
  u.grad_full = torch::Tensor();
}

void Impl::end_backward() {
  callback_queued = false;
  // In unit order, the same on every rank: units whose backward began but that some parameter
  // never reached (unused in this pass; with find_unused_parameters also the root and units
  // holding others), and units holding no_sync() gradients that this pass did not reach. The
  // missing gradients count as zero, as DDP's find_unused_parameters.
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].in_backward || (sync && units[i].grad_full.defined())) grads_ready(i);
  std::exception_ptr first;
  torch::NoGradGuard no_grad;
  for (auto& u : units) {
    if (!u.reduce) continue;
    try {
      u.reduce->wait();
      auto& g = u.shard.mutable_grad();
      const auto sum = u.reduced.to(u.shard.scalar_type());  // reduce_dtype: back to the shard's
      if (g.defined())
        g.add_(sum);  // accumulation over several backward passes
      else
        g = sum;
    } catch (...) {
      if (!first) first = std::current_exception();
      comm::finish_or_abort(*group, *u.reduce,
                            "FullyShardedDataParallel: a reduce-scatter past its deadline");
    }
    u.reduce.reset();
    u.reduced = torch::Tensor();
  }
  // A prefetch that backward did not use must not outlive it, nor a unit grads_ready() kept.
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].state != FsdpUnit::State::sharded && !units[i].always_whole && !units[i].params.empty()) {
      ensure_whole(i);
      release_full(units[i]);
    }
  if (first) std::rethrow_exception(first);
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  auto& im = *impl_;
  torch::NoGradGuard no_grad;
  double local = 0;  // padding gradients are zero: they add nothing
  for (auto& u : im.units)
    if (u.shard.defined() && u.shard.grad().defined())
      local += u.shard.grad().to(torch::kDouble).pow(2).sum().item<double>();
  im.group->allreduce(&local, 1, DType::f64, comm::ReduceOp::sum);
  const double total = std::sqrt(local);
  const double coef = max_norm / (total + 1e-6);  // torch::nn::utils::clip_grad_norm_'s rule
  if (coef < 1)
    for (auto& u : im.units)
      if (u.shard.defined() && u.shard.grad().defined()) u.shard.mutable_grad().mul_(coef);
  return total;
}

void FullyShardedDataParallel::zero_grad() {
  for (auto& u : impl_->units) {
    if (u.shard.defined()) u.shard.mutable_grad() = torch::Tensor();
    for (auto& p : u.params) p.mutable_grad() = torch::Tensor();
    if (u.grad_full.defined()) impl_->track(-fsdp_bytes_of(u.grad_full));
    u.grad_full = torch::Tensor();
  }
}

}  // namespace gz
