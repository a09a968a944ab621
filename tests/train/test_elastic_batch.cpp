// Sample accounting across world sizes (gz/train/elastic_batch.h): which samples each rank reads
// per step, on any world, when a run resumes mid-epoch after a resize.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "gz/core/error.h"
#include "gz/train/elastic_batch.h"

using namespace gz::train;

namespace {

BatchPlan plan(size_t n, int world, int64_t batch, int64_t accum, ElasticBatchPolicy policy,
               int64_t reference = 0) {
  BatchPlanOptions o;
  o.dataset_size = n;
  o.world = world;
  o.batch_size = batch;
  o.accumulation = accum;
  o.policy = policy;
  o.reference_global_batch = reference;
  return plan_batches(o);
}

// Every rank of `world` runs `steps` steps from `start`; returns the positions of each step (all
// ranks), checking per step that the ranks' shares are disjoint and that each rank's micro-batches
// number `accumulation` and hold at most `max_micro` samples.
std::vector<std::vector<size_t>> run(size_t n, size_t start, const BatchPlan& p, int world, size_t steps,
                                     int64_t max_micro) {
  std::vector<std::vector<size_t>> out(steps);
  for (int r = 0; r < world; ++r) {
    EpochPlan e(n, start, p.global_batch, p.accumulation, world, r);
    EXPECT_LE(steps, e.steps());
    for (size_t s = 0; s < steps; ++s) {
      auto mbs = e.micro_batches(s);
      EXPECT_EQ(mbs.size(), static_cast<size_t>(p.accumulation));
      for (auto& mb : mbs) {
        EXPECT_FALSE(mb.empty());
        EXPECT_LE(mb.size(), static_cast<size_t>(max_micro));
        out[s].insert(out[s].end(), mb.begin(), mb.end());
      }
    }
  }
  return out;
}

}  // namespace

// 3 ranks -> 2 -> 3 in the middle of an epoch, keeping the global batch: the union of what every
// rank read is the epoch's first steps x G positions, each exactly once, and every step reads the
// same positions an uninterrupted 3-rank run reads in that step.
TEST(ElasticBatch, ThreeTwoThreeMidEpochReadsEachSampleOnce) {
  const size_t n = 1000;
  const int64_t b = 32;
  const BatchPlan p3 = plan(n, 3, b, 1, ElasticBatchPolicy::keep_global);
  ASSERT_EQ(p3.global_batch, 96);
  ASSERT_EQ(p3.steps_per_epoch, 10);  // 1000 / 96; the last 40 positions are not read
  const BatchPlan p2 = plan(n, 2, b, 1, ElasticBatchPolicy::keep_global, p3.global_batch);
  EXPECT_EQ(p2.global_batch, 96);
  EXPECT_EQ(p2.accumulation, 2);  // 48 per rank in micro-batches of at most 32
  EXPECT_EQ(p2.steps_per_epoch, p3.steps_per_epoch);

  auto uninterrupted = run(n, 0, p3, 3, 10, b);
  auto a = run(n, 0, p3, 3, 3, b);       // 3 ranks, steps 0-2
  auto m = run(n, 3 * 96, p2, 2, 4, b);  // 2 ranks resume at sample 288, steps 3-6
  auto z = run(n, 7 * 96, p3, 3, 3, b);  // 3 ranks resume at sample 672, steps 7-9
  std::vector<std::vector<size_t>> resized = a;
  resized.insert(resized.end(), m.begin(), m.end());
  resized.insert(resized.end(), z.begin(), z.end());
  ASSERT_EQ(resized.size(), uninterrupted.size());
  std::vector<size_t> all;
  for (size_t s = 0; s < resized.size(); ++s) {
    std::set<size_t> got(resized[s].begin(), resized[s].end()),
        want(uninterrupted[s].begin(), uninterrupted[s].end());
    EXPECT_EQ(got.size(), resized[s].size()) << "step " << s << ": a position read twice";
    EXPECT_EQ(got, want) << "step " << s << " reads other samples than the uninterrupted run";
    all.insert(all.end(), resized[s].begin(), resized[s].end());
  }
  std::sort(all.begin(), all.end());
  std::vector<size_t> expect(10 * 96);
  std::iota(expect.begin(), expect.end(), size_t{0});
  EXPECT_EQ(all, expect);
}

TEST(ElasticBatch, EvenSplitIsTheUninterruptedLayout) {
  // W divides G: rank r's micro-batch k of step s holds s G + (k b + j) W + r, j < b (the layout
  // of a fixed-world run, so a run that never resizes reads what it always read).
  const int world = 4;
  const int64_t b = 5, accum = 3;
  const BatchPlan p = plan(1000, world, b, accum, ElasticBatchPolicy::keep_global);
  ASSERT_EQ(p.global_batch, 60);
  ASSERT_EQ(p.accumulation, 3);
  for (int r = 0; r < world; ++r) {
    EpochPlan e(1000, 0, p.global_batch, p.accumulation, world, r);
    for (size_t s : {0u, 7u}) {
      auto mbs = e.micro_batches(s);
      for (int64_t k = 0; k < accum; ++k)
        for (int64_t j = 0; j < b; ++j)
          EXPECT_EQ(mbs[static_cast<size_t>(k)][static_cast<size_t>(j)],
                    s * 60 + static_cast<size_t>((k * b + j) * world + r));
    }
  }
}

TEST(ElasticBatch, WeightsMakeTheMeanOverTheGlobalBatch) {
  // Averaged over ranks, the micro-batch weights n W / G sum to 1 per step, uneven split or not.
  for (int world : {1, 2, 3, 5, 7}) {
    const int64_t g = 96;
    for (int64_t accum : {1, 2, 3}) {
      double total = 0;
      for (int r = 0; r < world; ++r) {
        EpochPlan e(500, 13, g, accum, world, r);
        for (auto& mb : e.micro_batches(1)) total += e.weight(mb.size());
      }
      EXPECT_NEAR(total / world, 1.0, 1e-12) << "world " << world << " accumulation " << accum;
    }
  }
}

TEST(ElasticBatch, UnevenShareGoesToTheFirstRanks) {
  EpochPlan e0(100, 0, 10, 1, 3, 0), e2(100, 0, 10, 1, 3, 2);
  EXPECT_EQ(e0.share(0), 4u);
  EXPECT_EQ(e0.share(1), 3u);
  EXPECT_EQ(e0.share(2), 3u);
  EXPECT_EQ(e0.micro_batches(0)[0], (std::vector<size_t>{0, 3, 6, 9}));
  EXPECT_EQ(e2.micro_batches(0)[0], (std::vector<size_t>{2, 5, 8}));
  EXPECT_EQ(e0.steps(), 10u);
  EpochPlan late(100, 95, 10, 1, 3, 0);  // 5 positions left: no full step
  EXPECT_EQ(late.steps(), 0u);
  EXPECT_EQ(late.end(), 95u);
}

TEST(ElasticBatch, ScaleLrKeepsThePerRankBatch) {
  const BatchPlan p4 = plan(1000, 4, 16, 2, ElasticBatchPolicy::scale_lr);
  EXPECT_EQ(p4.global_batch, 128);
  EXPECT_DOUBLE_EQ(p4.lr_scale, 1.0);
  const BatchPlan p2 = plan(1000, 2, 16, 2, ElasticBatchPolicy::scale_lr, p4.global_batch);
  EXPECT_EQ(p2.global_batch, 64);
  EXPECT_EQ(p2.accumulation, 2);
  EXPECT_DOUBLE_EQ(p2.lr_scale, 0.5);
  EXPECT_EQ(p2.steps_per_epoch, 15);
  EXPECT_EQ(p4.steps_per_epoch, 7);
}

TEST(ElasticBatch, KeepGlobalOnABiggerWorldNeedsFewerMicroBatches) {
  const BatchPlan p = plan(10000, 8, 64, 4, ElasticBatchPolicy::keep_global, 2 * 64 * 4);
  EXPECT_EQ(p.global_batch, 512);
  EXPECT_EQ(p.accumulation, 1);  // 64 per rank
  EXPECT_EQ(plan(10000, 1, 64, 1, ElasticBatchPolicy::keep_global, 512).accumulation, 8);
}

TEST(ElasticBatch, ImpossiblePlansAreClearErrors) {
  // More ranks than samples per step; batch_size 1 with an uneven split; no full step at all.
  EXPECT_THROW(plan(1000, 8, 4, 1, ElasticBatchPolicy::keep_global, 6), gz::InvalidArgument);
  EXPECT_THROW(plan(1000, 2, 1, 1, ElasticBatchPolicy::keep_global, 3), gz::InvalidArgument);
  EXPECT_THROW(plan(50, 2, 32, 1, ElasticBatchPolicy::keep_global), gz::InvalidArgument);
  EXPECT_THROW(EpochPlan(10, 11, 2, 1, 1, 0), gz::InvalidArgument);
  EXPECT_THROW(parse_elastic_batch_policy("keep_local"), gz::InvalidArgument);
  EXPECT_EQ(parse_elastic_batch_policy("scale_lr"), ElasticBatchPolicy::scale_lr);
}
