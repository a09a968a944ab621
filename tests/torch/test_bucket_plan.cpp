// The one bucket planner (gz/torch/bucket_plan.h) that DDP's Reducer, ZeRO's shard layout and
// Horovod mode's replayed schedule share: its rule, its limits, its errors, and the property that
// re-planning a plan's buckets gives the same buckets (Horovod records the plan it replayed).
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "gz/core/error.h"
#include "gz/torch/bucket_plan.h"

namespace {
using namespace gz;
using Plan = std::vector<std::vector<size_t>>;

std::vector<size_t> iota(size_t n) {
  std::vector<size_t> o(n);
  std::iota(o.begin(), o.end(), size_t(0));
  return o;
}

std::vector<BucketItem> sized(const std::vector<size_t>& bytes, uint64_t key = 0) {
  std::vector<BucketItem> items;
  for (size_t b : bytes) items.push_back({b, key, false});
  return items;
}

BucketLimits limits(size_t first, size_t cap, size_t min_buckets = 1) {
  BucketLimits l;
  l.first_bucket_bytes = first;
  l.bucket_bytes = cap;
  l.min_buckets = min_buckets;
  return l;
}

TEST(BucketPlan, FirstBucketSmallThenTheCap) {
  // 10 items of 40 bytes: the first bucket closes at 64 (two items), the others at 200 (five).
  auto plan = plan_buckets(sized(std::vector<size_t>(10, 40)), iota(10), limits(64, 200));
  EXPECT_EQ(plan, (Plan{{0, 1}, {2, 3, 4, 5, 6}, {7, 8, 9}}));
}

TEST(BucketPlan, ABigItemStartsItsOwnBucketAndNeverHoldsBackSmallerOnes) {
  // DDP's fixture (test_row_sparse.cpp, ThreeImpl): c.bias 32, c.weight 256, big.bias 128,
  // big.weight 4096, a.bias 32, a.weight 256 with a 64-byte first bucket and a 600-byte cap.
  const auto items = sized({32, 256, 128, 4096, 32, 256});
  auto plan = plan_buckets(items, iota(6), limits(64, 600));
  EXPECT_EQ(plan, (Plan{{0}, {1, 2}, {3}, {4, 5}}));
  // Every bucket of several items stays below twice its limit.
  for (size_t b = 0; b < plan.size(); ++b) {
    size_t bytes = 0;
    for (size_t i : plan[b]) bytes += items[i].bytes;
    if (plan[b].size() > 1) EXPECT_LT(bytes, 2 * (b == 0 ? 64u : 600u)) << "bucket " << b;
  }
}

TEST(BucketPlan, ItemsUnderTheLimitFillPastIt) {
  // ZeRO's fixture (test_zero.cpp, Mlp): l2.bias 16 | l2.weight 256, l1.bias 64 | l1.weight 512 with
  // a 16-byte first bucket and a 300-byte cap: the second bucket closes once it holds 320 bytes.
  auto plan = plan_buckets(sized({16, 256, 64, 512}), iota(4), limits(16, 300));
  EXPECT_EQ(plan, (Plan{{0}, {1, 2}, {3}}));
}

TEST(BucketPlan, KeysNeverShareABucketAndEachHasItsOwnFirstBucket) {
  std::vector<BucketItem> items{{40, 1, false}, {40, 2, false}, {40, 1, false},
                                {40, 2, false}, {40, 1, false}, {40, 2, false}};
  auto plan = plan_buckets(items, iota(6), limits(64, 1000));
  // Key 1: {0, 2} is its first bucket (80 >= 64), then {4}; key 2 likewise.
  EXPECT_EQ(plan, (Plan{{0, 2}, {1, 3}, {4}, {5}}));
}

TEST(BucketPlan, AloneItemsGetTheirOwnBucketAndCloseTheOpenOnes) {
  std::vector<BucketItem> items = sized({8, 8, 1 << 20, 8, 8});
  items[2].alone = true;
  auto plan = plan_buckets(items, iota(5), limits(64, 1000));
  // Bucket {0, 1} closes before the alone item, so buckets open in the order their items come.
  EXPECT_EQ(plan, (Plan{{0, 1}, {2}, {3, 4}}));
}

TEST(BucketPlan, TheOrderDecidesAndEveryItemIsPlacedOnce) {
  const std::vector<size_t> order{3, 1, 4, 0, 2};
  auto plan = plan_buckets(sized({10, 10, 10, 10, 10}), order, limits(15, 25));
  EXPECT_EQ(plan, (Plan{{3, 1}, {4, 0, 2}}));
  // A subset of the items: only those.
  EXPECT_EQ(plan_buckets(sized({10, 10, 10}), {2}, limits(15, 25)), (Plan{{2}}));
}

TEST(BucketPlan, MinBucketsShrinksTheCapNotBelowTheFirstBucket) {
  const auto items = sized(std::vector<size_t>(16, 100));  // 1600 bytes
  EXPECT_EQ(bucket_cap(items, iota(16), limits(64, 1 << 20, 1)), size_t(1) << 20);
  EXPECT_EQ(bucket_cap(items, iota(16), limits(64, 1 << 20, 8)), 200u);
  EXPECT_EQ(bucket_cap(items, iota(16), limits(300, 1 << 20, 8)), 300u);  // not below the first
  EXPECT_EQ(bucket_cap(items, iota(16), limits(64, 150, 8)), 150u);       // never above the cap
  EXPECT_GE(plan_buckets(items, iota(16), limits(64, 1 << 20, 8)).size(), 8u);
  EXPECT_EQ(plan_buckets(items, iota(16), limits(64, 1 << 20, 1)).size(), 2u);
  // Alone items count in no limit.
  auto with_alone = items;
  with_alone[0].bytes = 1 << 20;
  with_alone[0].alone = true;
  EXPECT_EQ(bucket_cap(with_alone, iota(16), limits(64, 1 << 20, 8)), 1500u / 8);
}

TEST(BucketPlan, BadInputIsRefused) {
  EXPECT_THROW(plan_buckets(sized({1, 2}), {0, 2}, limits(1, 1)), InvalidArgument);     // out of range
  EXPECT_THROW(plan_buckets(sized({1, 2}), {0, 1, 0}, limits(1, 1)), InvalidArgument);  // twice
  EXPECT_THROW(plan_buckets(sized({1, 2}), {0, 1}, limits(0, 1)), InvalidArgument);
  EXPECT_THROW(plan_buckets(sized({1, 2}), {0, 1}, limits(1, 0)), InvalidArgument);
  EXPECT_TRUE(plan_buckets({}, {}, limits(1, 1)).empty());
}

TEST(BucketPlan, ReplanningThePlansBucketsGivesTheSameBuckets) {
  // Horovod mode re-plans the groups it replayed: merging must be idempotent.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t n = 1 + rng() % 30;
    std::vector<BucketItem> items;
    for (size_t i = 0; i < n; ++i) items.push_back({static_cast<size_t>(rng() % 700), 0, false});
    const auto lim = limits(1 + rng() % 200, 1 + rng() % 1500, 1 + rng() % 10);
    const auto plan = plan_buckets(items, iota(n), lim);
    std::vector<BucketItem> merged;
    for (const auto& b : plan) {
      BucketItem m;
      for (size_t i : b) m.bytes += items[i].bytes;
      merged.push_back(m);
    }
    const auto again = plan_buckets(merged, iota(merged.size()), lim);
    ASSERT_EQ(again.size(), plan.size()) << "trial " << trial;
    for (size_t b = 0; b < again.size(); ++b)
      EXPECT_EQ(again[b], std::vector<size_t>{b}) << "trial " << trial;
  }
}

}  // namespace
