// The straggler report's arithmetic on made-up windows: lateness from the exposed waits (never
// from step times, which DDP equalises), the phase that explains it, the threshold that keeps a
// healthy job quiet, streaks across windows, link probes, and the summary.
#include <gtest/gtest.h>

#include <random>

#include "gz/core/error.h"
#include "gz/train/straggler.h"

namespace gz::train {
namespace {

// A DDP-like window: every rank's step takes the same time (the all-reduce equalises them); a
// rank that is `late` ms behind in phase `cause` spends that much more there and that much less
// waiting for the others.
std::vector<RankWindow> ddp_window(int world, int victim, double late, StragglerCause cause, double noise = 0,
                                   uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> jitter(-noise, noise);
  std::vector<RankWindow> w(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    auto& x = w[static_cast<size_t>(r)];
    x.data_ms = 5 + jitter(rng);
    x.compute_ms = 60 + jitter(rng);
    x.optimizer_ms = 8 + jitter(rng);
    x.other_ms = 1;
    x.comm_ms = 20 + late + jitter(rng);  // everyone waits for the late rank ...
    if (r == victim) {
      x.comm_ms -= late;  // ... but the late rank itself
      switch (cause) {
        case StragglerCause::data:
          x.data_ms += late;
          break;
        case StragglerCause::compute:
          x.compute_ms += late;
          break;
        case StragglerCause::optimizer:
          x.optimizer_ms += late;
          break;
        case StragglerCause::other:
          x.other_ms += late;
          break;
      }
    }
    x.step_ms = x.data_ms + x.compute_ms + x.comm_ms + x.optimizer_ms + x.other_ms;
  }
  return w;
}

TEST(Straggler, NamesTheLateRankAndItsPhaseFromWaitsNotStepTimes) {
  StragglerOptions o;
  for (int world : {2, 3, 8}) {
    for (auto cause : {StragglerCause::data, StragglerCause::compute, StragglerCause::optimizer}) {
      const int victim = world - 1;
      auto w = ddp_window(world, victim, 200, cause);
      // DDP equalised the step times: they carry no information.
      for (size_t r = 1; r < w.size(); ++r) EXPECT_NEAR(w[r].step_ms, w[0].step_ms, 1e-9);
      auto a = analyze_window(w, o);
      EXPECT_EQ(a.late_rank, victim) << "world " << world;
      EXPECT_NEAR(a.ranks[static_cast<size_t>(victim)].late_ms, 200, 1e-6) << "world " << world;
      EXPECT_EQ(a.ranks[static_cast<size_t>(victim)].cause, cause);
      EXPECT_NEAR(a.ranks[static_cast<size_t>(victim)].cause_excess_ms, 200, 1e-6);
      EXPECT_NEAR(a.step_ms, 294, 1e-6);
    }
  }
}

// Mutation check: a threshold of 0 (or lateness from step times) names a rank in healthy windows.
TEST(Straggler, AHealthyJobWithJitterNamesNobody) {
  StragglerOptions o;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    auto a = analyze_window(ddp_window(8, -1, 0, StragglerCause::data, 3, seed), o);
    EXPECT_EQ(a.late_rank, -1) << "seed " << seed;
  }
  // Small but real lateness under the threshold (20% of the step) is not a straggler either.
  EXPECT_EQ(analyze_window(ddp_window(8, 3, 20, StragglerCause::data), o).late_rank, -1);  // 18% of 114 ms
  EXPECT_EQ(analyze_window(ddp_window(8, 3, 40, StragglerCause::data), o).late_rank, 3);   // 30% of 134 ms
}

TEST(Straggler, LatenessThatNoPhaseExplainsIsNotNamed) {
  // Rank 2 waits less, but spends no more time anywhere: noise in the waits, not a straggler.
  auto w = ddp_window(4, -1, 0, StragglerCause::data);
  w[2].comm_ms -= 15;
  w[2].other_ms += 2;
  w[2].step_ms -= 13;
  EXPECT_EQ(analyze_window(w, StragglerOptions{}).late_rank, -1);
  EXPECT_THROW(analyze_window({RankWindow{}}, StragglerOptions{}), InvalidArgument);
}

std::vector<std::string> hosts_4x2() { return {"h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"}; }

TEST(Straggler, WarnsAfterEnoughWindowsInARowNamingRankHostPhaseAndLoss) {
  StragglerOptions o;  // every 10, 3 windows
  StragglerTracker t(o, hosts_4x2());
  const auto late = analyze_window(ddp_window(8, 5, 190, StragglerCause::data), o);
  const auto fine = analyze_window(ddp_window(8, -1, 0, StragglerCause::data), o);
  EXPECT_EQ(t.add_window(late, 11), "");
  EXPECT_EQ(t.add_window(late, 21), "");
  EXPECT_EQ(t.add_window(fine, 31), "");  // the streak breaks
  EXPECT_EQ(t.add_window(late, 41), "");
  EXPECT_EQ(t.add_window(late, 51), "");
  const std::string w = t.add_window(late, 61);
  EXPECT_NE(w.find("rank 5 (h2) is 190 ms/step behind the median, in data loading"), std::string::npos) << w;
  EXPECT_NE(w.find("loses ~67% throughput"), std::string::npos) << w;  // 190 of a 284 ms step
  EXPECT_NE(w.find("steps 32-61"), std::string::npos) << w;
  for (int64_t s = 71; s < 71 + 10 * 29; s += 10) EXPECT_EQ(t.add_window(late, s), "") << s;  // no spam
  EXPECT_NE(t.add_window(late, 361), "");  // a reminder after 10 x windows more
  const std::string sum = t.summary();
  EXPECT_NE(sum.find("rank 5 (h2): late in 35 of 36 windows"), std::string::npos) << sum;
  EXPECT_NE(sum.find("mostly in data loading"), std::string::npos) << sum;
}

TEST(Straggler, ALateRankThatChangesIsNotConsistent) {
  StragglerOptions o;
  StragglerTracker t(o, hosts_4x2());
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(t.add_window(analyze_window(ddp_window(8, i % 2 ? 1 : 6, 100, StragglerCause::compute), o),
                           10 * i + 1),
              "");
  const std::string sum = t.summary();
  EXPECT_NE(sum.find("no straggler"), std::string::npos) << sum;
}

// A slow host link: nobody is late, communication dominates; the tracker asks for a probe of the
// host ring, and names the host once two probes in a row agree.
TEST(Straggler, ProbesLinksWhenCommunicationDominatesAndNamesTheSlowHost) {
  StragglerOptions o;
  StragglerTracker t(o, hosts_4x2());
  auto w = ddp_window(8, -1, 0, StragglerCause::data);
  for (auto& x : w) {
    x.comm_ms += 300;
    x.step_ms += 300;
  }
  const auto a = analyze_window(w, o);
  ASSERT_EQ(a.late_rank, -1);
  EXPECT_EQ(t.add_window(a, 11), "");
  ASSERT_TRUE(t.probe_due(a));
  const auto pairs = t.probe_pairs();
  EXPECT_EQ(pairs, (std::vector<std::pair<int, int>>{{0, 2}, {2, 4}, {4, 6}, {0, 6}}));
  // Host h2 (ranks 4, 5) is slow: its two ring links.
  std::vector<comm::LinkMeasure> m{{0, 2, 60, 110e6}, {2, 4, 60, 11e6}, {4, 6, 60, 12e6}, {0, 6, 60, 105e6}};
  EXPECT_EQ(t.add_probe(m, a, 11), "");  // one probe is not enough
  EXPECT_EQ(t.add_window(a, 21), "");
  ASSERT_TRUE(t.probe_due(a));
  const std::string warn = t.add_probe(m, a, 21);
  EXPECT_NE(warn.find("host h2 (ranks 4, 5) has a slow network link: 12.0 MB/s against"), std::string::npos)
      << warn;
  EXPECT_NE(warn.find("throughput"), std::string::npos) << warn;
  EXPECT_NE(t.summary().find("host h2 (ranks 4, 5): slow network link"), std::string::npos) << t.summary();
  // Backing off: right after the warning no probe is due.
  EXPECT_EQ(t.add_window(a, 31), "");
  EXPECT_FALSE(t.probe_due(a));
}

// Short steps make longer windows (the exchange's share of the time stays small); a straggler
// that slows the steps brings them back to `every`. Mutation check: a fixed window fails it.
TEST(Straggler, WindowsSpanAtLeastMinWindowMs) {
  StragglerOptions o;  // every 10, min 1000 ms
  StragglerTracker t(o, hosts_4x2());
  WindowAnalysis a;
  a.step_ms = 16;
  EXPECT_EQ(t.next_window_steps(a), 63);
  a.step_ms = 250;
  EXPECT_EQ(t.next_window_steps(a), 10);
  a.step_ms = 0.001;
  EXPECT_EQ(t.next_window_steps(a), 1000);  // at most 100 x every
  a.step_ms = 0;
  EXPECT_EQ(t.next_window_steps(a), 10);
  o.min_window_ms = 0;
  a.step_ms = 16;
  EXPECT_EQ(StragglerTracker(o, hosts_4x2()).next_window_steps(a), 10);
  // The window length is used for the steps a warning names.
  const auto late = analyze_window(ddp_window(8, 5, 190, StragglerCause::data), StragglerOptions{});
  StragglerTracker u(StragglerOptions{}, hosts_4x2());
  u.add_window(late, 64, 63);
  u.add_window(late, 74, 10);
  EXPECT_NE(u.add_window(late, 84, 10).find("steps 2-84"), std::string::npos);
}

TEST(Straggler, NoProbeOnOneHostOrWhenComputeDominates) {
  StragglerOptions o;
  StragglerTracker one(o, {"h0", "h0", "h0"});
  auto w = ddp_window(3, -1, 0, StragglerCause::data);
  for (auto& x : w) x.comm_ms += 300, x.step_ms += 300;
  const auto comm_bound = analyze_window(w, o);
  one.add_window(comm_bound, 11);
  EXPECT_FALSE(one.probe_due(comm_bound));
  StragglerTracker four(o, hosts_4x2());
  const auto compute_bound = analyze_window(ddp_window(8, -1, 0, StragglerCause::data), o);
  four.add_window(compute_bound, 11);
  EXPECT_FALSE(four.probe_due(compute_bound));  // 20 of 94 ms in communication
}

}  // namespace
}  // namespace gz::train
