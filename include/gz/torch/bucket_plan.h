// The one rule that groups gradients into buckets: DDP's Reducer, ZeRO's shard layout and Horovod
// mode's replayed schedule all plan with it (as c10d has one compute_bucket_assignment_by_size).
// Plain bookkeeping: no LibTorch, no communication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gz {

/// @brief One unit the planner places: a gradient, or a group of gradients that stays together.
struct BucketItem {
  /// @brief Bytes the item adds to its bucket.
  size_t bytes = 0;
  /// @brief Items with different keys never share a bucket (the dtype; ZeRO: optimizer group and
  /// dtype). Each key has its own first bucket.
  uint64_t key = 0;
  /// @brief The item gets a bucket of its own (a row-sparse gradient) and counts in no limit.
  bool alone = false;
};

/// @brief Size limits of the buckets.
struct BucketLimits {
  /// @brief Limit of the first bucket of each key (small: communication starts early in backward).
  size_t first_bucket_bytes = size_t(1) << 20;
  /// @brief Limit of every later bucket (the cap).
  size_t bucket_bytes = size_t(25) << 20;
  /// @brief When above 1, the cap shrinks to the items' total bytes / min_buckets (not below
  /// first_bucket_bytes), so that small models still get about this many buckets.
  size_t min_buckets = 1;
};

/// @brief The cap `plan_buckets` uses for buckets after the first of a key: bucket_bytes, shrunk
/// by min_buckets over the bytes of the items in `order` that are not `alone`.
size_t bucket_cap(const std::vector<BucketItem>& items, const std::vector<size_t>& order,
                  const BucketLimits& limits);

/// @brief Buckets over the items named by `order` (indices into `items`, each at most once; the
/// order gradients usually become ready). Returns each bucket's item indices, buckets in the order
/// they open (their launch order), items in `order`'s order.
///
/// The rule, per key: an item joins the key's open bucket; a bucket closes once it holds at least
/// its limit (first_bucket_bytes for the key's first bucket, bucket_cap() after). An item that
/// alone reaches the open bucket's limit does not join a non-empty bucket: that bucket closes and
/// the item starts the next one, so a big gradient never holds back the smaller ones before it,
/// and a bucket of several items stays below twice its limit. An `alone` item closes every open
/// bucket (so buckets still open in the order their items come) and gets a bucket of its own.
/// Throws gz::InvalidArgument on an index out of range or named twice, or a zero limit.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<BucketItem>& items,
                                              const std::vector<size_t>& order, const BucketLimits& limits);

}  // namespace gz
