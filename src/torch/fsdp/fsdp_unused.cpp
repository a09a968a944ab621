// FullyShardedDataParallel with find_unused_parameters: which units and parameters this forward's
// output reaches, agreed with the other ranks before backward. A unit that some rank's loss
// reaches and this rank's does not would otherwise be gathered and reduce-scattered there and not
// here: the collectives would pair with the wrong units (or hang). Tying its output to this
// rank's output with a zero gradient makes its backward run here too, in the engine's usual
// order; counting only the reachable parameters makes each unit's reduce-scatter start when its
// last real gradient arrives, on every rank alike.
#include <torch/csrc/autograd/custom_function.h>

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

// Identity on `out`; in backward also a zero gradient for `unused` (whatever its values: no
// arithmetic on them, so a NaN there stays out of the gradients).
struct TieUnused : torch::autograd::Function<TieUnused> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& out, const torch::Tensor& unused) {
    ctx->saved_data["sizes"] = unused.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(unused.scalar_type());
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grads[0], torch::zeros(sizes, grads[0].options().dtype(dtype))};
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

torch::Tensor FullyShardedDataParallel::Impl::tie_unused(const torch::Tensor& out) {
  std::unordered_set<const Node*> seen;
  reach_nodes(out, seen);
  const auto n = static_cast<int64_t>(units.size());
  auto here = torch::zeros({n}, torch::kUInt8);
  auto* h = here.data_ptr<uint8_t>();
  h[0] = 1;  // the root: its node is on the output itself
  for (int64_t i = 1; i < n; ++i) {
    const auto& o = units[static_cast<size_t>(i)].output;
    h[i] = o.defined() && seen.count(o.grad_fn().get()) ? 1 : 0;
  }
  auto anywhere = here.clone();
  {
    ScopedPhase waiting(Phase::comm);
    group->allreduce(anywhere.data_ptr(), static_cast<size_t>(n), DType::u8, comm::ReduceOp::max);
  }
  torch::Tensor tied = out;
  for (int64_t i = 1; i < n; ++i) {
    auto& u = units[static_cast<size_t>(i)];
    if (h[i] || !anywhere.data_ptr<uint8_t>()[i] || u.params.empty()) continue;
    if (!u.output.defined())
      GZ_THROW(
          Error, "FullyShardedDataParallel: rank ", rank, ": unit '", u.name,
          "' took part in another rank's loss but did not run (with gradients) through gz::run_unit() in ",
          "this rank's forward: every rank must run the same units in the same order");
    tied = TieUnused::apply(tied, u.output);
    reach_nodes(u.output, seen);
  }
  // A unit's reduce-scatter waits for the parameters its backward reaches, not for all of them.
  size_t k = 0;  // accumulators[] holds every unit's parameters in order (install_hooks)
  for (auto& u : units) {
    u.expected = 0;
    for (size_t j = 0; j < u.params.size(); ++j, ++k)
      if (seen.count(accumulators[k].get())) ++u.expected;
    u.output = torch::Tensor();
  }
  return tied;
}

}  // namespace gz
