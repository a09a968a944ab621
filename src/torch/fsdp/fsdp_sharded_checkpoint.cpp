// FullyShardedDataParallel's sharded checkpoints: its units as flat groups of the sharded format
// (torch/zero/sharded_format.h); the blocks are the shards, the optimizer's parameters.
#include "gz/core/error.h"
#include "gz/torch/fully_shard.h"
#include "torch/fsdp/fsdp_impl.h"
#include "torch/zero/sharded_format.h"

namespace gz {

namespace {

zero::ShardSet shard_set(FullyShardedDataParallel::Impl& im, torch::optim::Optimizer& opt) {
  zero::ShardSet set;
  set.rank = im.rank;
  set.world = im.world;
  set.state_opt = set.options_opt = &opt;
  for (auto& u : im.units) {
    if (u.params.empty()) continue;
    zero::FlatGroup g;
    g.name = u.name.empty() ? "<root>" : u.name;
    g.params = u.param_names;
    for (auto& p : u.params) g.shapes.push_back(p.sizes().vec());
    g.layout = u.layout;
    g.block = g.key = u.shard;
    set.groups.push_back(std::move(g));
  }
  return set;
}

}  // namespace

void FullyShardedDataParallel::save_sharded(torch::optim::Optimizer& opt, const std::string& dir,
                                            const ShardedCheckpointMeta& meta) {
  auto& im = *impl_;
  GZ_CHECK_ARG(!im.in_forward, "FullyShardedDataParallel: save_sharded() inside forward()");
  restore_optimizer(opt);  // the state keyed by the shards
  zero::save_shards(shard_set(im, opt), im.group.get(), dir, meta);
}

void FullyShardedDataParallel::load_sharded(torch::optim::Optimizer& opt, const std::string& dir,
                                            const ShardedCheckpointMeta& expect) {
  auto& im = *impl_;
  GZ_CHECK_ARG(!im.in_forward, "FullyShardedDataParallel: load_sharded() inside forward()");
  restore_optimizer(opt);
  auto set = shard_set(im, opt);
  // All ranks or none: a rank left with the old shards would gather a mixed model.
  zero::load_shards_collective(set, im.group.get(), dir, expect, "FullyShardedDataParallel::load_sharded");
  im.mark_stale();  // whole units hold the old parameters: gathered again before any use
}

std::function<std::string()> FullyShardedDataParallel::snapshot_shard(torch::optim::Optimizer& opt,
                                                                      const ShardedCheckpointMeta& meta,
                                                                      std::vector<std::string>* params) {
  auto& im = *impl_;
  GZ_CHECK_ARG(!im.in_forward, "FullyShardedDataParallel: snapshot_shard() inside forward()");
  restore_optimizer(opt);
  const auto set = shard_set(im, opt);
  if (params) {
    params->clear();
    for (const auto& g : set.groups) params->insert(params->end(), g.params.begin(), g.params.end());
  }
  return zero::shard_snapshot(set, meta);
}

void FullyShardedDataParallel::load_shard_bytes(torch::optim::Optimizer& opt, const std::string& bytes,
                                                const std::string& where,
                                                const ShardedCheckpointMeta& expect) {
  auto& im = *impl_;
  GZ_CHECK_ARG(!im.in_forward, "FullyShardedDataParallel: load_shard_bytes() inside forward()");
  restore_optimizer(opt);
  auto set = shard_set(im, opt);
  zero::load_shard_bytes_collective(set, im.group.get(), bytes, where, expect,
                                    "FullyShardedDataParallel::load_shard_bytes");
  im.mark_stale();
}

void FullyShardedDataParallel::load_shard_snapshots(torch::optim::Optimizer& opt,
                                                    const std::vector<std::string>& shards,
                                                    const std::string& where,
                                                    const ShardedCheckpointMeta& expect) {
  auto& im = *impl_;
  GZ_CHECK_ARG(!im.in_forward, "FullyShardedDataParallel: load_shard_snapshots() inside forward()");
  restore_optimizer(opt);
  auto set = shard_set(im, opt);
  zero::load_shard_snapshots_collective(set, im.group.get(), shards, where, expect,
                                        "FullyShardedDataParallel::load_shard_snapshots");
  im.mark_stale();
}

}  // namespace gz
