// FullyShardedDataParallel's optimizer state in the unsharded format: the state an optimizer over
// the module's parameters would have, so that checkpoints move between stage 3, ZeRO 1/2, plain
// DDP and any world size. A shard's state is cut into per-parameter tensors (consolidation) and
// per-parameter tensors are laid out flat again and cut into this rank's block (loading).
#include <unordered_set>

#include "gz/core/error.h"
#include "gz/torch/collectives.h"
#include "gz/torch/tensor_adapter.h"
#include "torch/fsdp/fsdp_impl.h"
#include "torch/zero/state_codec.h"

namespace gz {

namespace {

using Optimizer = torch::optim::Optimizer;
using StateMap = FullyShardedDataParallel::Impl::StateMap;

torch::optim::OptimizerParamState* find_state(StateMap& map, const torch::Tensor& p) {
  auto it = map.find(zero::state_key(map, p));
  return it == map.end() ? nullptr : it->second.get();
}

// The one parameter group of an optimizer over the shards (or over the module's parameters).
torch::optim::OptimizerParamGroup& only_group(Optimizer& opt) {
  if (opt.param_groups().size() != 1)
    GZ_THROW(InvalidArgument,
             "FullyShardedDataParallel: the optimizer must have one parameter group, it has ",
             opt.param_groups().size());
  return opt.param_groups()[0];
}

}  // namespace

std::vector<torch::Tensor> FullyShardedDataParallel::Impl::sharded_module_params() const {
  std::unordered_set<const void*> sharded;
  for (auto& u : units)
    for (auto& p : u.params) sharded.insert(p.unsafeGetTensorImpl());
  std::vector<torch::Tensor> out;
  for (auto& p : module->parameters())
    if (sharded.count(p.unsafeGetTensorImpl())) out.push_back(p);
  return out;
}

void FullyShardedDataParallel::unshard_optimizer(Optimizer& opt, int root) {
  auto& im = *impl_;
  auto& group = only_group(opt);
  if (group.params().size() != parameters().size())
    GZ_THROW(InvalidArgument, "FullyShardedDataParallel: unshard_optimizer() needs the optimizer over ",
             "parameters() (", parameters().size(), " shards), it has ", group.params().size(),
             " parameters");
  im.stash = std::make_unique<StateMap>(std::move(opt.state()));
  opt.state().clear();
  im.stash_params = group.params();
  group.params() = im.sharded_module_params();
  if (root < 0) return;
  torch::NoGradGuard no_grad;
  for (auto& u : im.units) {
    auto* st = u.params.empty() ? nullptr : find_state(*im.stash, u.shard);
    if (!st) continue;  // no step yet: the same on every rank
    auto fields = zero::state_fields(*st);
    std::vector<torch::Tensor> flats;
    for (auto& [name, t] : fields.tensors) {
      if (!t->defined()) {
        flats.emplace_back();
        continue;
      }
      auto flat = torch::empty({u.layout.padded(im.world)}, t->options());
      allgather_async(t->detach().reshape({-1}), flat, im.group)->wait();
      flats.push_back(flat);
    }
    if (im.rank != root) continue;
    for (size_t j = 0; j < u.params.size(); ++j) {
      auto ps = st->clone();
      auto pf = zero::state_fields(*ps);
      for (size_t f = 0; f < flats.size(); ++f)
        *pf.tensors[f].second = flats[f].defined() ? flats[f]
                                                         .narrow(0, u.layout.offsets[j], u.layout.numels[j])
                                                         .view(u.params[j].sizes())
                                                         .clone()
                                                   : torch::Tensor();
      opt.state()[zero::state_key(opt.state(), u.params[j])] = std::move(ps);
    }
  }
}

void FullyShardedDataParallel::restore_optimizer(Optimizer& opt) {
  auto& im = *impl_;
  if (!im.stash) return;
  opt.state() = std::move(*im.stash);
  only_group(opt).params() = im.stash_params;
  im.stash.reset();
  im.stash_params.clear();
}

void FullyShardedDataParallel::shard_optimizer(Optimizer& opt) {
  auto& im = *impl_;
  auto& group = only_group(opt);
  torch::NoGradGuard no_grad;
  StateMap shard_state;
  for (auto& u : im.units) {
    if (u.params.empty()) continue;
    auto* first = find_state(opt.state(), u.params[0]);
    for (auto& p : u.params)
      if ((find_state(opt.state(), p) != nullptr) != (first != nullptr))
        GZ_THROW(InvalidArgument, "FullyShardedDataParallel: unit '", u.name,
                 "' has optimizer state for some of its parameters only");
    if (!first) continue;
    auto ss = first->clone();
    auto sf = zero::state_fields(*ss);
    for (size_t f = 0; f < sf.tensors.size(); ++f) {
      if (!sf.tensors[f].second->defined()) continue;
      auto flat = torch::zeros({u.layout.padded(im.world)}, sf.tensors[f].second->options());
      for (size_t j = 0; j < u.params.size(); ++j) {
        auto pf = zero::state_fields(*find_state(opt.state(), u.params[j]));
        flat.narrow(0, u.layout.offsets[j], u.layout.numels[j]).copy_(pf.tensors[f].second->reshape({-1}));
      }
      const auto [lo, hi] = u.layout.block(im.rank);
      *sf.tensors[f].second = flat.narrow(0, lo, hi - lo).clone();
    }
    shard_state[zero::state_key(shard_state, u.shard)] = std::move(ss);
  }
  opt.state() = std::move(shard_state);
  group.params() = parameters();
  im.stash.reset();
  im.stash_params.clear();
}

void FullyShardedDataParallel::reshard_module() {
  auto& im = *impl_;
  torch::NoGradGuard no_grad;
  for (auto& u : im.units) {
    if (u.params.empty()) continue;
    if (u.state != FsdpUnit::State::whole)
      GZ_THROW(Error,
               "FullyShardedDataParallel: reshard_module() needs the whole module: call unshard() first");
    for (size_t j = 0; j < u.params.size(); ++j) {
      auto view = u.full.narrow(0, u.layout.offsets[j], u.layout.numels[j]).view(u.params[j].sizes());
      if (is_bound_to(u.params[j], view)) continue;
      view.copy_(u.params[j].detach());  // loaded by replacing the tensor (torch::load's set_)
      u.params[j].set_data(view);
    }
    const auto [lo, hi] = u.layout.block(im.rank);
    u.shard.detach().copy_(u.full.narrow(0, lo, hi - lo));
  }
}

}  // namespace gz
