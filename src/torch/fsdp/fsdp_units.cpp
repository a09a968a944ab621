// FullyShardedDataParallel's units: which parameters each holds, their flat buffers and shards,
// and the size policy.
#include <algorithm>
#include <unordered_map>

#include "gz/core/error.h"
#include "gz/torch/collectives.h"
#include "torch/fsdp/fsdp_impl.h"

namespace gz {

namespace {

using ModulePtr = std::shared_ptr<torch::nn::Module>;

// The unit's name in the model ("blocks.2"), or a gz::InvalidArgument when it is not a submodule.
std::string name_in(const torch::nn::Module& root, const torch::nn::Module& unit) {
  for (const auto& item : root.named_modules("", /*include_self=*/false))
    if (item.value().get() == &unit) return item.key();
  GZ_THROW(InvalidArgument, "fully_shard: a unit (", unit.name(), ") is not a submodule of the module");
}

int64_t unclaimed_bytes(const ModulePtr& m, int64_t min_bytes, std::vector<ModulePtr>& out, bool is_root) {
  int64_t bytes = 0;
  for (const auto& child : m->named_children())
    bytes += unclaimed_bytes(child.value(), min_bytes, out, false);
  for (const auto& p : m->named_parameters(/*recurse=*/false))
    if (p.value().requires_grad())
      bytes += p.value().numel() * static_cast<int64_t>(p.value().element_size());
  if (!is_root && bytes >= min_bytes) {
    out.push_back(m);
    return 0;
  }
  return bytes;
}

}  // namespace

std::vector<ModulePtr> units_by_size(const ModulePtr& module, int64_t min_bytes) {
  GZ_CHECK_ARG(module != nullptr, "units_by_size: null module");
  GZ_CHECK_ARG(min_bytes > 0, "units_by_size: min_bytes must be positive, got ", min_bytes);
  std::vector<ModulePtr> out;
  unclaimed_bytes(module, min_bytes, out, true);
  return out;
}

void FullyShardedDataParallel::Impl::assign_units(const std::vector<ModulePtr>& unit_modules) {
  // A parameter belongs to the smallest unit that holds it (units may nest); the root takes the rest.
  std::vector<std::pair<size_t, const ModulePtr*>> by_size;
  for (const auto& m : unit_modules) {
    GZ_CHECK_ARG(m != nullptr, "fully_shard: null unit");
    GZ_CHECK_ARG(m.get() != module.get(), "fully_shard: the module itself is the root unit; list submodules");
    by_size.emplace_back(m->parameters().size(), &m);
  }
  std::stable_sort(by_size.begin(), by_size.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::unordered_map<const void*, size_t> owner;  // TensorImpl -> unit index (1-based; root 0)
  std::vector<const torch::nn::Module*> mods{nullptr};
  for (const auto& [n, m] : by_size) {
    if (unit_of_module.count(m->get()))
      GZ_THROW(InvalidArgument, "fully_shard: unit '", name_in(*module, **m), "' is listed twice");
    unit_of_module[m->get()] = mods.size();
    for (const auto& p : (*m)->parameters()) owner.emplace(p.unsafeGetTensorImpl(), mods.size());
    mods.push_back(m->get());
  }
  units.resize(mods.size());
  for (size_t u = 1; u < mods.size(); ++u) {
    units[u].module = mods[u];
    units[u].name = name_in(*module, *mods[u]);
  }
  for (const auto& item : module->named_parameters()) {
    const auto& p = item.value();
    if (!p.requires_grad()) continue;  // frozen: stays whole on every rank
    auto it = owner.find(p.unsafeGetTensorImpl());
    auto& u = units[it == owner.end() ? 0 : it->second];
    if (!u.params.empty() &&
        (p.scalar_type() != u.params[0].scalar_type() || p.device() != u.params[0].device()))
      GZ_THROW(InvalidArgument, "fully_shard: unit '", u.name, "' mixes ", u.params[0].scalar_type(), " on ",
               u.params[0].device(), " and ", p.scalar_type(), " on ", p.device(), " ('", item.key(),
               "'): one dtype and device per unit");
    u.params.push_back(p);
    u.param_names.push_back(item.key());
  }
}

void FullyShardedDataParallel::Impl::build_flat(FsdpUnit& u) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> numels;
  for (auto& p : u.params) numels.push_back(p.numel());
  u.layout = zero::flat_bucket(numels, world);
  const auto opts = u.params[0].options().requires_grad(false);
  u.full = torch::zeros({u.layout.padded(world)}, opts);
  for (size_t j = 0; j < u.params.size(); ++j)
    u.full.narrow(0, u.layout.offsets[j], numels[j]).copy_(u.params[j].detach().reshape({-1}));
  broadcast(u.full, options.root_rank, group);  // every rank starts from the root's values
  for (size_t j = 0; j < u.params.size(); ++j)
    u.params[j].set_data(u.full.narrow(0, u.layout.offsets[j], numels[j]).view(u.params[j].sizes()));
  const auto [lo, hi] = u.layout.block(rank);
  u.shard = u.full.narrow(0, lo, hi - lo).clone().requires_grad_(true);
  u.state = FsdpUnit::State::whole;
  track(u.full.numel() * static_cast<int64_t>(u.full.element_size()));
  release_full(u);
}

}  // namespace gz
