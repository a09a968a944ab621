// ZeroRedundancyOptimizer's sharded checkpoints: its buckets as flat groups of the sharded format
// (sharded_format.h); the blocks are the local optimizer's parameters and keys.
#include "gz/core/error.h"
#include "gz/torch/tensor_adapter.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "torch/zero/sharded_format.h"
#include "torch/zero/zero_impl.h"

namespace gz {

namespace {

zero::ShardSet shard_set(ZeroRedundancyOptimizer::Impl& im, torch::optim::Optimizer& front) {
  zero::ShardSet set;
  set.rank = im.rank;
  set.world = im.world;
  set.state_opt = im.local.get();
  set.options_opt = &front;  // the model-facing groups carry the options (step() copies them)
  for (size_t k = 0; k < im.buckets.size(); ++k) {
    const auto& b = im.buckets[k];
    zero::FlatGroup g;
    g.name = "bucket" + std::to_string(k);
    for (size_t i : b.params) {
      g.params.push_back(im.reducer->param_names()[i]);
      g.shapes.push_back(im.params[i].sizes().vec());
    }
    g.layout = b;
    g.block = g.key = im.shard_params[k];
    g.opt_group = b.group;
    set.groups.push_back(std::move(g));
  }
  return set;
}

std::vector<std::string> shard_param_names(const zero::ShardSet& set) {
  std::vector<std::string> out;
  for (const auto& g : set.groups) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

}  // namespace

std::function<std::string()> ZeroRedundancyOptimizer::snapshot_shard(const ShardedCheckpointMeta& meta,
                                                                     std::vector<std::string>* params) {
  auto& im = *impl_;
  im.wait_gathers();
  im.rebind_params();
  const auto set = shard_set(im, *this);
  if (params) *params = shard_param_names(set);
  return zero::shard_snapshot(set, meta);
}

void ZeroRedundancyOptimizer::load_shard_bytes(const std::string& bytes, const std::string& where,
                                               const ShardedCheckpointMeta& expect) {
  auto& im = *impl_;
  im.wait_gathers();
  im.rebind_params();
  auto set = shard_set(im, *this);
  zero::load_shard_bytes_collective(set, im.group.get(), bytes, where, expect,
                                    "ZeroRedundancyOptimizer::load_shard_bytes");
  gather_loaded();
}

void ZeroRedundancyOptimizer::load_shard_snapshots(const std::vector<std::string>& shards,
                                                   const std::string& where,
                                                   const ShardedCheckpointMeta& expect) {
  auto& im = *impl_;
  im.wait_gathers();
  im.rebind_params();
  auto set = shard_set(im, *this);
  zero::load_shard_snapshots_collective(set, im.group.get(), shards, where, expect,
                                        "ZeroRedundancyOptimizer::load_shard_snapshots");
  gather_loaded();
}

void ZeroRedundancyOptimizer::save_sharded(const std::string& dir, const ShardedCheckpointMeta& meta) {
  auto& im = *impl_;
  im.wait_gathers();
  im.rebind_params();
  zero::save_shards(shard_set(im, *this), im.group.get(), dir, meta);
}

void ZeroRedundancyOptimizer::load_sharded(const std::string& dir, const ShardedCheckpointMeta& expect) {
  auto& im = *impl_;
  im.wait_gathers();
  im.rebind_params();
  auto set = shard_set(im, *this);
  // Every rank installs its blocks or none does: the all-gather below needs them all.
  zero::load_shards_collective(set, im.group.get(), dir, expect, "ZeroRedundancyOptimizer::load_sharded");
  gather_loaded();
}

void ZeroRedundancyOptimizer::gather_loaded() {
  auto& im = *impl_;
  im.consolidated.clear();
  im.consolidated_at = -1;
  // Every rank has its blocks: all-gather them into the whole parameters.
  for (size_t k = 0; k < im.buckets.size(); ++k) {
    auto& f = im.flat[k];
    const auto [lo, hi] = im.buckets[k].block(im.rank);
    char* base = static_cast<char*>(f.data_ptr());
    im.group->allgather(base + lo * f.element_size(), base, static_cast<size_t>(hi - lo),
                        to_dtype(f.scalar_type(), "allgather"));
  }
}

}  // namespace gz
