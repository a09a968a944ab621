// DistributedSampler: partition, padding/dropping, per-epoch determinism, exact resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "gz/core/error.h"
#include "gz/torch/distributed_sampler.h"

using gz::DistributedSampler;
using gz::DistributedSamplerOptions;

namespace {

std::vector<std::vector<size_t>> all_ranks(size_t n, int world, DistributedSamplerOptions o, int64_t epoch) {
  std::vector<std::vector<size_t>> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, o);
    s.set_epoch(epoch);
    std::vector<size_t> got;
    for (auto b = s.next_batch(3); !b.empty(); b = s.next_batch(3)) got.insert(got.end(), b.begin(), b.end());
    EXPECT_EQ(got, s.indices());
    EXPECT_EQ(got.size(), s.num_samples());
    out.push_back(got);
  }
  return out;
}

}  // namespace

TEST(DistributedSampler, PartitionCoversAndPadsForAllWorldSizes) {
  for (bool shuffle : {false, true}) {
    for (int world = 1; world <= 7; ++world) {
      for (size_t n : {0, 1, 5, 6, 7, 20, 101}) {
        DistributedSamplerOptions o;
        o.shuffle = shuffle;
        o.seed = 42;
        auto ranks = all_ranks(n, world, o, 3);
        const size_t per = (n + world - 1) / world;
        std::map<size_t, int> count;
        for (const auto& r : ranks) {
          ASSERT_EQ(r.size(), per) << "n=" << n << " world=" << world;
          for (size_t i : r) {
            ASSERT_LT(i, n);
            count[i]++;
          }
        }
        // Every index appears; only the padding repeats, and at most ceil(pad / n) extra times.
        ASSERT_EQ(count.size(), n) << "n=" << n << " world=" << world;
        const size_t pad = per * world - n;
        size_t extra = 0;
        for (const auto& [i, c] : count) extra += c - 1;
        EXPECT_EQ(extra, pad) << "n=" << n << " world=" << world;
      }
    }
  }
}

TEST(DistributedSampler, DropLastIsDisjointAndEqual) {
  for (bool shuffle : {false, true}) {
    for (int world = 1; world <= 7; ++world) {
      for (size_t n : {0, 1, 5, 6, 7, 20, 101}) {
        DistributedSamplerOptions o;
        o.shuffle = shuffle;
        o.drop_last = true;
        auto ranks = all_ranks(n, world, o, 1);
        std::set<size_t> seen;
        for (const auto& r : ranks) {
          ASSERT_EQ(r.size(), n / world);
          for (size_t i : r) {
            ASSERT_LT(i, n);
            ASSERT_TRUE(seen.insert(i).second) << "duplicate " << i << " n=" << n << " world=" << world;
          }
        }
        EXPECT_EQ(seen.size(), (n / world) * world);
      }
    }
  }
}

TEST(DistributedSampler, NoShuffleIsStrided) {
  DistributedSamplerOptions o;
  o.shuffle = false;
  DistributedSampler s(10, 3, 1, o);
  EXPECT_EQ(s.indices(), (std::vector<size_t>{1, 4, 7, 0}));  // 10 wraps to 0
}

TEST(DistributedSampler, StablePerEpochDifferentAcrossEpochsAndSeeds) {
  DistributedSamplerOptions o;
  o.seed = 7;
  auto e0 = all_ranks(1000, 3, o, 0);
  EXPECT_EQ(all_ranks(1000, 3, o, 0), e0);
  auto e1 = all_ranks(1000, 3, o, 1);
  EXPECT_NE(e1, e0);
  o.seed = 8;
  EXPECT_NE(all_ranks(1000, 3, o, 0), e0);
  // A shuffled epoch is a real permutation: not the identity stride.
  std::vector<size_t> identity;
  for (size_t i = 0; i < 1000; i += 3) identity.push_back(i);
  EXPECT_NE(e0[0], identity);
  // set_epoch back and forth reproduces the same order.
  DistributedSampler s(1000, 3, 0, o);
  s.set_epoch(5);
  auto five = s.indices();
  s.set_epoch(6);
  s.set_epoch(5);
  EXPECT_EQ(s.indices(), five);
}

TEST(DistributedSampler, ShuffleIsRoughlyUniform) {
  // Position of index 0 over many epochs should spread over the whole range.
  DistributedSamplerOptions o;
  std::vector<int> hist(10, 0);
  for (int64_t e = 0; e < 2000; ++e) {
    DistributedSampler s(10, 1, 0, o);
    s.set_epoch(e);
    const auto& idx = s.indices();
    hist[std::find(idx.begin(), idx.end(), size_t{0}) - idx.begin()]++;
  }
  for (int h : hist) EXPECT_NEAR(h, 200, 60);
}

TEST(DistributedSampler, ResumeYieldsExactlyTheRemainder) {
  DistributedSamplerOptions o;
  o.seed = 3;
  for (int world : {1, 2, 3, 7}) {
    for (size_t cut : {0, 1, 4, 13, 15}) {
      DistributedSampler a(100, world, world - 1, o);
      a.set_epoch(2);
      auto head = a.next_batch(cut);
      auto saved = a.state();
      std::vector<size_t> rest_a;
      for (auto b = a.next_batch(4); !b.empty(); b = a.next_batch(4)) rest_a.insert(rest_a.end(), b.begin(), b.end());

      DistributedSampler b(100, world, world - 1, o);
      b.load_state(saved);
      b.set_epoch(saved.epoch);  // the training loop's call keeps the restored position
      EXPECT_EQ(b.epoch(), 2);
      EXPECT_EQ(b.position(), head.size());
      std::vector<size_t> rest_b;
      for (auto x = b.next_batch(5); !x.empty(); x = b.next_batch(5)) rest_b.insert(rest_b.end(), x.begin(), x.end());
      EXPECT_EQ(rest_a, rest_b) << "world=" << world << " cut=" << cut;
      head.insert(head.end(), rest_b.begin(), rest_b.end());
      EXPECT_EQ(head, b.indices());
    }
  }
}

TEST(DistributedSampler, BadArgumentsAndStates) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), gz::InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 2, 2), gz::InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 2, -1), gz::InvalidArgument);
  DistributedSampler s(10, 2, 0);
  s.set_epoch(1);
  s.next_batch(2);
  EXPECT_THROW(s.load_state({4, 6}), gz::InvalidArgument);
  EXPECT_EQ(s.epoch(), 1);  // unchanged after the failed load
  EXPECT_EQ(s.position(), 2u);
  s.reset();
  EXPECT_EQ(s.position(), 0u);
  EXPECT_EQ(s.next_batch(100).size(), 5u);
  EXPECT_TRUE(s.next_batch(1).empty());
}

namespace {

// Ranks of one world in lock step: each takes `per_rank` more samples (or all that are left).
std::vector<size_t> run_world(size_t n, int world, DistributedSamplerOptions o, int64_t epoch,
                              size_t consumed, size_t per_rank, size_t* consumed_after) {
  std::vector<size_t> seen;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, o);
    s.load_global_state(epoch, consumed);
    s.set_epoch(epoch);  // the training loop's call keeps the resumed position
    for (size_t left = per_rank; left > 0;) {
      auto b = s.next_batch(std::min<size_t>(left, 7));
      if (b.empty()) break;
      left -= b.size();
      seen.insert(seen.end(), b.begin(), b.end());
    }
    *consumed_after = s.global_position();
  }
  return seen;
}

}  // namespace

TEST(DistributedSampler, ResizedWorldReadsTheRestOfTheEpochExactlyOnce) {
  DistributedSamplerOptions o;
  o.seed = 11;
  const size_t n = 999;
  // 3 ranks read 30 samples each, then 2 ranks 60 each, then 3 ranks the rest (789 = 3 x 263).
  size_t consumed = 0;
  std::vector<size_t> all = run_world(n, 3, o, 4, 0, 30, &consumed);
  EXPECT_EQ(consumed, 90u);
  auto part = run_world(n, 2, o, 4, consumed, 60, &consumed);
  EXPECT_EQ(consumed, 210u);
  all.insert(all.end(), part.begin(), part.end());
  part = run_world(n, 3, o, 4, consumed, n, &consumed);
  EXPECT_EQ(consumed, n);
  all.insert(all.end(), part.begin(), part.end());
  ASSERT_EQ(all.size(), n);
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(all[i], i) << "sample " << i << " repeated or skipped";
  // The rest is the epoch's order from `consumed` on: the same positions whatever the world.
  DistributedSampler one(n, 1, 0, o);
  one.set_epoch(4);
  DistributedSampler rest(n, 1, 0, o);
  rest.load_global_state(4, 210);
  EXPECT_EQ(rest.indices(), std::vector<size_t>(one.indices().begin() + 210, one.indices().end()));
}

TEST(DistributedSampler, GlobalStateSurvivesSaveAndLoadAndReset) {
  DistributedSamplerOptions o;
  o.drop_last = true;
  DistributedSampler a(50, 3, 1, o);
  a.load_global_state(2, 20);  // 30 left: 10 per rank
  EXPECT_EQ(a.num_samples(), 10u);
  a.next_batch(4);
  EXPECT_EQ(a.global_position(), 32u);
  DistributedSampler b(50, 3, 1, o);
  b.load_state(a.state());
  EXPECT_EQ(b.indices(), a.indices());
  EXPECT_EQ(b.next_batch(100), a.next_batch(100));
  EXPECT_THROW(b.load_global_state(2, 51), gz::InvalidArgument);
  EXPECT_THROW(b.load_state({2, 11, 20}), gz::InvalidArgument);  // beyond the shard after the offset
  EXPECT_EQ(b.position(), 10u);                                  // unchanged
  b.reset();                                                     // the whole epoch again
  EXPECT_EQ(b.num_samples(), 16u);
  EXPECT_EQ(b.global_position(), 0u);
}
