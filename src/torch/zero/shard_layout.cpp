#include "torch/zero/shard_layout.h"

#include <algorithm>
#include <map>

#include "gz/core/error.h"

namespace gz::zero {

std::vector<ShardBucket> plan_shards(const std::vector<size_t>& order, const std::vector<ParamInfo>& params,
                                     int world, size_t first_bucket_bytes, size_t bucket_bytes) {
  GZ_CHECK_ARG(world > 0, "plan_shards: world must be positive");
  GZ_CHECK_ARG(first_bucket_bytes > 0 && bucket_bytes > 0, "plan_shards: bucket sizes must be positive");
  std::vector<ShardBucket> out;
  using Key = std::pair<size_t, int>;  // (group, dtype)
  std::map<Key, size_t> open;          // key -> open bucket
  std::map<Key, size_t> open_bytes;
  std::map<Key, bool> first_done;
  for (size_t i : order) {
    GZ_CHECK_ARG(i < params.size(), "plan_shards: parameter index ", i, " out of range");
    const ParamInfo& p = params[i];
    const Key key{p.group, p.dtype};
    auto it = open.find(key);
    if (it == open.end()) {
      out.emplace_back();
      out.back().group = p.group;
      it = open.emplace(key, out.size() - 1).first;
      open_bytes[key] = 0;
    }
    ShardBucket& b = out[it->second];
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numels.push_back(p.numel);
    b.numel += p.numel;
    open_bytes[key] += static_cast<size_t>(p.numel * p.element_size);
    if (open_bytes[key] >= (first_done[key] ? bucket_bytes : first_bucket_bytes)) {
      open.erase(key);
      first_done[key] = true;
    }
  }
  for (auto& b : out) {
    // ceil(numel / world) rounded up to the alignment; at least one aligned block per rank, so a
    // rank whose block is all padding still holds a (zero) shard and runs the same collectives.
    const int64_t per = std::max<int64_t>(1, (b.numel + world - 1) / world);
    b.shard = (per + kAlign - 1) / kAlign * kAlign;
  }
  return out;
}

std::pair<int64_t, int64_t> owned_part(const ShardBucket& b, size_t j, int r) {
  const auto [lo, hi] = b.block(r);
  const int64_t first = std::max(lo, b.offsets[j]);
  const int64_t last = std::min(hi, b.offsets[j] + b.numels[j]);
  return {first, std::max(first, last)};
}

}  // namespace gz::zero
