// ZeRO's shard layout: parameters grouped into flat buckets, each bucket split into one equal,
// contiguous block per rank. Plain bookkeeping (no LibTorch, no communication).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gz::zero {

/// @brief One flat bucket: parameters back to back, padded to `world * shard` elements.
struct ShardBucket {
  std::vector<size_t> params;    ///< parameter indices (the Reducer's), in flat order
  std::vector<int64_t> offsets;  ///< flat offset of each parameter
  std::vector<int64_t> numels;   ///< element count of each parameter
  int64_t numel = 0;             ///< real elements (sum of numels)
  int64_t shard = 0;             ///< elements per rank (a multiple of kAlign)
  size_t group = 0;              ///< optimizer parameter group of every parameter in the bucket
  int64_t padded(int world) const { return shard * world; }
  /// @brief Flat range [first, second) of rank r's block.
  std::pair<int64_t, int64_t> block(int r) const { return {shard * r, shard * (r + 1)}; }
};

/// @brief What the planner needs to know of one parameter.
struct ParamInfo {
  int64_t numel = 0;
  int64_t element_size = 4;
  size_t group = 0;  ///< optimizer parameter group
  int dtype = 0;     ///< any key that must not mix inside a bucket (scalar type)
};

/// @brief Blocks start at multiples of this many elements (64 bytes of float32), so every rank's
/// shard is as aligned as the bucket for vector kernels.
constexpr int64_t kAlign = 16;

/// @brief Buckets over `order` (parameter indices, the order gradients usually become ready),
/// planned by gz::plan_buckets (DDP's rule) with one key per (group, dtype) and no min_buckets.
std::vector<ShardBucket> plan_shards(const std::vector<size_t>& order, const std::vector<ParamInfo>& params,
                                     int world, size_t first_bucket_bytes, size_t bucket_bytes);

/// @brief Elements per rank of a flat bucket of `numel` real elements over `world` ranks:
/// ceil(numel / world) rounded up to kAlign, and at least one aligned block, so that a rank whose
/// block is all padding still holds a (zero) shard and runs the same collectives.
int64_t shard_numel(int64_t numel, int world);

/// @brief One bucket over parameters with these element counts, back to back (offsets, numel and
/// shard filled in; params are 0..n-1).
ShardBucket flat_bucket(const std::vector<int64_t>& numels, int world);

/// @brief The part of parameter j of bucket b that lies in rank r's block: flat range
/// [first, second) (empty when first >= second).
std::pair<int64_t, int64_t> owned_part(const ShardBucket& b, size_t j, int r);

}  // namespace gz::zero
