// gzrun --preflight: the option, the store records, the probed pairs, the GEMM rate and the
// judgement (the table and its flags). The whole check across nodes runs in
// tests/launcher/multihost_preflight.sh and test_preflight_local.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "gz/core/error.h"
#include "options.h"
#include "preflight.h"

namespace gz::launcher {
namespace {

LaunchOptions parse(std::vector<std::string> argv) { return parse_options(argv, 4); }

TEST(Preflight, OptionWithOrWithoutStrictAndProgramOptional) {
  auto o = parse({"--preflight", "prog"});
  EXPECT_TRUE(o.preflight);
  EXPECT_FALSE(o.preflight_strict);
  EXPECT_EQ(o.program, "prog");
  o = parse({"--preflight=strict", "--nnodes", "2", "--master-addr", "10.0.0.1"});  // the check alone
  EXPECT_TRUE(o.preflight_strict);
  EXPECT_TRUE(o.program.empty());
  EXPECT_TRUE(parse({"--preflight=warn", "x"}).preflight);
  EXPECT_THROW(parse({"--preflight=loud", "x"}), InvalidArgument);
  EXPECT_THROW(parse({"--nnodes", "2"}), InvalidArgument);                        // no program, no preflight
  EXPECT_THROW(parse({"--preflight", "--nnodes", "1:3", "x"}), InvalidArgument);  // elastic
  EXPECT_NE(usage_text().find("--preflight[=warn|strict]"), std::string::npos);
}

// Written before the etcd backend: with etcd every node advertised 127.0.0.1 (the default master
// address) and the probe stalled for its 60 s deadline. Refused at once instead, as is --status,
// which only knows gzrun's own store.
TEST(Preflight, RefusedWithEtcdAsIsStatus) {
  const std::vector<std::string> etcd = {"--rdzv-backend", "etcd", "--rdzv-endpoints", "127.0.0.1:2379",
                                         "--rdzv-id", "j", "--nnodes", "2", "--rdzv-insecure"};
  auto with = [&](std::vector<std::string> extra) {
    auto argv = etcd;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  EXPECT_NO_THROW(parse(with({"prog"})));
  EXPECT_THROW(parse(with({"--preflight", "prog"})), InvalidArgument);
  EXPECT_THROW(parse(with({"--status"})), InvalidArgument);
}

TEST(Preflight, RecordsRoundTripAndBadOnesAreErrors) {
  NodeFacts f;
  f.node = 3;
  f.host = "h3";
  f.addr = "10.77.0.4";
  f.boot_id = "abc";
  f.shm_free = 1e9;
  f.mem_avail = 2e10;
  f.gflops = {1.5, 1.25};
  const NodeFacts g = decode_facts(encode_facts(f));
  EXPECT_EQ(g.node, 3);
  EXPECT_EQ(g.host, "h3");
  EXPECT_EQ(g.addr, "10.77.0.4");
  EXPECT_EQ(g.boot_id, "abc");
  EXPECT_DOUBLE_EQ(g.shm_free, 1e9);
  EXPECT_EQ(g.gflops, (std::vector<double>{1.5, 1.25}));
  const std::vector<comm::LinkMeasure> m{{0, 1, 55.5, 1.2e8}, {1, 2, 60, 1.1e7}};
  const auto back = decode_links(encode_links(m));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].b, 2);
  EXPECT_DOUBLE_EQ(back[1].bytes_per_s, 1.1e7);
  EXPECT_TRUE(decode_links("").empty());
  EXPECT_THROW(decode_facts("1|h|a"), Error);
  EXPECT_THROW(decode_links("1,2,3"), Error);
  EXPECT_THROW(decode_facts("x|h|a|b|1|2|"), InvalidArgument);
}

TEST(Preflight, PairsCoverTheRingAndASampleWithinBounds) {
  EXPECT_TRUE(preflight_pairs(1, 7).empty());
  EXPECT_EQ(preflight_pairs(2, 7), (std::vector<std::pair<int, int>>{{0, 1}}));
  for (int n : {3, 4, 5, 8, 16, 33}) {
    const auto pairs = preflight_pairs(n, 12345);
    EXPECT_EQ(pairs, preflight_pairs(n, 12345)) << "deterministic";
    std::set<std::pair<int, int>> set(pairs.begin(), pairs.end());
    EXPECT_EQ(set.size(), pairs.size()) << "no duplicates";
    std::map<int, int> degree;
    for (auto [a, b] : pairs) {
      EXPECT_LT(a, b);
      ++degree[a], ++degree[b];
    }
    for (int i = 0; i < n; ++i) {
      const int j = (i + 1) % n;
      EXPECT_TRUE(set.count({std::min(i, j), std::max(i, j)})) << "ring pair " << i << "-" << j;
      EXPECT_GE(degree[i], n >= 4 ? 3 : 2) << "node " << i << " of " << n;  // a slow node is told apart
    }
    EXPECT_LE(static_cast<int>(pairs.size()), 3 * n);
  }
}

TEST(Preflight, ComputeRateIsPositivePerThread) {
  const auto r = measure_compute(2, 0.05);
  ASSERT_EQ(r.size(), 2u);
  // Only positivity and finiteness: a rate threshold fails under TSan on a loaded CI core
  // (0.0094 GFLOP/s seen); the preflight judges rates relative to the median, never absolutely.
  for (double g : r) {
    EXPECT_GT(g, 0.0);
    EXPECT_TRUE(std::isfinite(g));
  }
}

std::vector<NodeFacts> healthy_nodes(int n) {
  std::vector<NodeFacts> v;
  for (int i = 0; i < n; ++i) {
    NodeFacts f;
    f.node = i;
    f.host = "h" + std::to_string(i);
    f.addr = "10.77.0." + std::to_string(i + 1);
    f.shm_free = 1e9 * (1 + 0.01 * i);
    f.mem_avail = 2e10;
    f.gflops = {3.0 + 0.1 * (i % 3), 3.1};
    v.push_back(f);
  }
  return v;
}

std::vector<comm::LinkMeasure> ring_links(int n, int slow_node) {
  std::vector<comm::LinkMeasure> m;
  for (auto [a, b] : preflight_pairs(n, 1)) {
    const bool slow = a == slow_node || b == slow_node;
    m.push_back({a, b, 80.0 + a, slow ? 11e6 : 110e6 + 1e6 * b});
  }
  return m;
}

// Mutation check: flagging both ends of every slow link (instead of the node whose every link is
// slow) also names nodes 4, 6, 13, ... and fails this test.
TEST(Preflight, FlagsTheSlowLinkAndTheThrottledNodeAndNothingElse) {
  auto nodes = healthy_nodes(16);
  nodes[11].gflops = {0.2, 0.21};  // cgroup-throttled
  const auto r = judge_preflight(nodes, ring_links(16, 5), PreflightOptions{}, "test");
  EXPECT_EQ(r.flagged, 2) << r.table;
  EXPECT_NE(r.flags[5].find("slow link: 11.0 MB/s at best"), std::string::npos) << r.table;
  EXPECT_NE(r.flags[11].find("slow compute: 0.20 GFLOP/s per rank"), std::string::npos) << r.table;
  for (int i = 0; i < 16; ++i)
    if (i != 5 && i != 11) EXPECT_EQ(r.flags[i], "") << "node " << i << ": " << r.flags[i];
  EXPECT_NE(r.table.find("links below 50% of the median"), std::string::npos) << r.table;
  EXPECT_NE(r.table.find("h4-h5 11.0 MB/s"), std::string::npos) << r.table;
  EXPECT_NE(r.verdict.find("flagged 2 of 16 node(s): node 5 (h5): slow link"), std::string::npos)
      << r.verdict;
  EXPECT_NE(r.verdict.find("node 11 (h11): slow compute"), std::string::npos) << r.verdict;
}

TEST(Preflight, HealthyNodesAndSmallShmAndMemory) {
  auto nodes = healthy_nodes(4);
  auto r = judge_preflight(nodes, ring_links(4, -1), PreflightOptions{}, "test");
  EXPECT_EQ(r.flagged, 0) << r.table;
  EXPECT_EQ(r.verdict, "preflight: all 4 node(s) ok");
  nodes[2].shm_free = 32e6;
  nodes[3].mem_avail = 1e9;
  r = judge_preflight(nodes, ring_links(4, -1), PreflightOptions{}, "test");
  EXPECT_NE(r.flags[2].find("little /dev/shm"), std::string::npos) << r.table;
  EXPECT_NE(r.flags[3].find("little memory"), std::string::npos) << r.table;
  // One node alone: no links, judged on its own numbers.
  r = judge_preflight(healthy_nodes(1), {}, PreflightOptions{}, "test");
  EXPECT_EQ(r.flagged, 0) << r.table;
}

}  // namespace
}  // namespace gz::launcher
