// FullyShardedDataParallel with find_unused_parameters: which units and parameters this forward's
// output reaches, agreed with the other ranks before backward. A unit that some rank's loss
// reaches and this rank's does not would otherwise be gathered and reduce-scattered there and not
// here: the collectives would pair with the wrong units (or hang). Tying its output to this
// rank's output with a zero gradient makes its PreBackward run here too, in the engine's usual
// order (it gathers the unit and reduce-scatters zeros; no gradient flows on into the unit);
// counting only the reachable parameters makes each unit's reduce-scatter start when its last
// real gradient arrives, on every rank alike.
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <unordered_set>
#include <vector>

#include "gz/core/error.h"
#include "gz/core/phase.h"
#include "torch/fsdp/fsdp_impl.h"

namespace gz {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Identity on `out`; in backward a zero gradient for `unused` too (on its device and in its
// dtype), which starts the unit's backward; the unit's PreBackward passes nothing on.
struct TieUnused : torch::autograd::Function<TieUnused> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& out, const torch::Tensor& unused) {
    ctx->saved_data["sizes"] = unused.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(unused.scalar_type());
    ctx->saved_data["device"] = unused.device();
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grads[0],
            torch::zeros(sizes, torch::TensorOptions(dtype).device(ctx->saved_data["device"].toDevice()))};
  }
};

// Adds every autograd node reachable from `t` to `seen`.
void reach_nodes(const torch::Tensor& t, std::unordered_set<const Node*>& seen) {
  std::vector<Node*> todo;
  if (auto fn = t.grad_fn()) todo.push_back(fn.get());
  while (!todo.empty()) {
    Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (const auto& e : n->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
}

}  // namespace

// One byte per unit and rank: reached by this rank's output; and one more: not run (with
// gradients) here. Every rank learns both from one all-reduce (max).
torch::Tensor FullyShardedDataParallel::Impl::tie_unused(const torch::Tensor& out) {
  // Known from the first forward, the same on every rank. Such a unit, dropped on some ranks,
  // trained differently from DDP in the one test tried (not root-caused): refused.
  for (const auto& u : units)
    if (u.always_whole)
      GZ_THROW(InvalidArgument, "FullyShardedDataParallel: unit '", u.name, "' does not run through ",
               "gz::run_unit(); with find_unused_parameters every unit must");
  std::unordered_set<const Node*> seen;
  reach_nodes(out, seen);
  const auto n = units.size();
  auto flags = torch::zeros({static_cast<int64_t>(2 * n)}, torch::kUInt8);
  auto* f = flags.data_ptr<uint8_t>();
  f[0] = 1;  // the root: its node is on the output itself
  for (size_t i = 1; i < n; ++i) {
    const auto& u = units[i];
    f[i] = u.output.defined() && seen.count(u.output.grad_fn().get()) ? 1 : 0;
    f[n + i] = !u.params.empty() && !u.output.defined() ? 1 : 0;
  }
  std::vector<uint8_t> here(f, f + n);
  {
    ScopedPhase waiting(Phase::comm);
    group->allreduce(f, 2 * n, DType::u8, comm::ReduceOp::max);
  }
  torch::Tensor tied = out;
  for (size_t i = 1; i < n; ++i) {
    auto& u = units[i];
    if (here[i] || !f[i] || u.params.empty()) continue;
    if (f[n + i])  // every rank sees the same flags: every rank throws
      GZ_THROW(
          Error, "FullyShardedDataParallel: unit '", u.name, "' took part in some rank's loss but did not ",
          "run (with gradients) through gz::run_unit() in every rank's forward: every rank must run the ",
          "same units in the same order");
    tied = TieUnused::apply(tied, u.output);
    u.tied = true;
  }
  // A unit's reduce-scatter waits for the parameters its backward reaches. Not the root's, nor
  // that of a unit holding others: their parameters are used before and after other units, so
  // when their last gradient arrives would depend on what this rank reached; they go at the end.
  size_t k = 0;  // accumulators[] holds every unit's parameters in order (install_hooks)
  for (auto& u : units) {
    u.expected = 0;
    for (size_t j = 0; j < u.params.size(); ++j, ++k)
      if (seen.count(accumulators[k].get())) ++u.expected;
    if (u.tied) u.expected = 0;
    if (&u == &units[0] || u.encloses) u.expected = std::numeric_limits<size_t>::max();
    u.output = torch::Tensor();
  }
  return tied;
}

}  // namespace gz
