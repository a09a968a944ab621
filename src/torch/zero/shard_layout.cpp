#include "torch/zero/shard_layout.h"

#include <algorithm>

#include "gz/core/error.h"
#include "gz/torch/bucket_plan.h"

namespace gz::zero {

std::vector<ShardBucket> plan_shards(const std::vector<size_t>& order, const std::vector<ParamInfo>& params,
                                     int world, size_t first_bucket_bytes, size_t bucket_bytes) {
  GZ_CHECK_ARG(world > 0, "plan_shards: world must be positive");
  // One optimizer group and dtype per bucket, DDP's rule otherwise (gz/torch/bucket_plan.h).
  std::vector<BucketItem> items(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    items[i] = {static_cast<size_t>(params[i].numel * params[i].element_size),
                (static_cast<uint64_t>(params[i].group) << 16) | static_cast<uint16_t>(params[i].dtype),
                false};
  BucketLimits limits;
  limits.first_bucket_bytes = first_bucket_bytes;
  limits.bucket_bytes = bucket_bytes;
  std::vector<ShardBucket> out;
  for (auto& layout : plan_buckets(items, order, limits)) {
    ShardBucket b;
    b.group = params[layout.front()].group;
    for (size_t i : layout) {
      b.params.push_back(i);
      b.offsets.push_back(b.numel);
      b.numels.push_back(params[i].numel);
      b.numel += params[i].numel;
    }
    out.push_back(std::move(b));
  }
  for (auto& b : out) b.shard = shard_numel(b.numel, world);
  return out;
}

int64_t shard_numel(int64_t numel, int world) {
  GZ_CHECK_ARG(world > 0, "shard_numel: world must be positive");
  const int64_t per = std::max<int64_t>(1, (numel + world - 1) / world);
  return (per + kAlign - 1) / kAlign * kAlign;
}

ShardBucket flat_bucket(const std::vector<int64_t>& numels, int world) {
  ShardBucket b;
  for (size_t i = 0; i < numels.size(); ++i) {
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numels.push_back(numels[i]);
    b.numel += numels[i];
  }
  b.shard = shard_numel(b.numel, world);
  return b;
}

std::pair<int64_t, int64_t> owned_part(const ShardBucket& b, size_t j, int r) {
  const auto [lo, hi] = b.block(r);
  const int64_t first = std::max(lo, b.offsets[j]);
  const int64_t last = std::min(hi, b.offsets[j] + b.numels[j]);
  return {first, std::max(first, last)};
}

}  // namespace gz::zero
