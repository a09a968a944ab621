// gzrun --rdzv-backend etcd on one host, against an etcd member on loopback started by the test:
// the workers meet in etcd (no store hosted by any gzrun), two gzruns form one job, the job's keys
// are removed when it succeeded, a second job with the same --rdzv-id is refused, a node whose
// peer disappears is told so, and the security rule is enforced before anything is sent.
// Exit 77 (skipped) when etcd is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>

#include "gz/store/etcd_store.h"
#include "gzrun_harness.h"
#include "store/etcd_cluster.h"

using namespace gz::test;

namespace {

const std::string kStoreWorker = GZ_BUILD_DIR "/tests/launcher/gzrun_test_store_worker";

gz::test::EtcdCluster& etcd() { return gz::test::shared_etcd(); }

std::vector<std::string> etcd_args(const std::string& id, std::vector<std::string> more) {
  std::vector<std::string> a{"--rdzv-backend",   "etcd",      "--rdzv-endpoints",
                             etcd().endpoint(0), "--rdzv-id", id};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

/// A client of the job's keys ("/gz/<id>").
gz::EtcdStore job_store(const std::string& id) {
  gz::EtcdStoreOptions o;
  o.endpoints = etcd().endpoints();
  o.prefix = "/gz/" + id;
  o.timeout = std::chrono::seconds(10);
  return gz::EtcdStore(o);
}

std::string unique_id(const std::string& name) { return name + "-" + std::to_string(::getpid()); }

}  // namespace

TEST(GzrunEtcd, WorkersMeetInEtcdAndTheJobsKeysAreRemoved) {
  TempDir dir;
  const std::string id = unique_id("one");
  GzrunProcess g(etcd_args(id, {"--nproc-per-node", "3", kStoreWorker}), dir);
  ASSERT_TRUE(g.wait(60)) << g.describe();
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  for (int r = 0; r < 3; ++r) {
    const std::string want = "[" + std::to_string(r) + "] rank=" + std::to_string(r) +
                             " world=3 launcher=gzrun hosts_server=0 sum=" + std::to_string(1 + 2 + 5);
    EXPECT_NE(g.out().find(want), std::string::npos) << want << "\n" << g.describe();
  }
  // Nobody hosted a store: everything went through etcd, and only the end marker is left.
  auto s = job_store(id);
  EXPECT_EQ(s.num_keys(), 1) << g.describe();
  EXPECT_EQ(gz::to_string(s.get("gzrun/ended", gz::Deadline::after(std::chrono::seconds(2)))),
            "done|every worker exited 0");
  EXPECT_NE(g.err().find("removed the job's"), std::string::npos) << g.describe();
  // The same --rdzv-id again: refused, with what to do.
  GzrunProcess again(etcd_args(id, {kStoreWorker}), dir);
  ASSERT_TRUE(again.wait(30)) << again.describe();
  EXPECT_EQ(again.exit_code(), 1) << again.describe();
  EXPECT_NE(again.err().find("already ran to its end"), std::string::npos) << again.describe();
  EXPECT_NE(again.err().find("etcdctl del --prefix /gz/" + id + "/"), std::string::npos) << again.describe();
}

TEST(GzrunEtcd, TwoNodesFormOneJobWithoutAStoreHost) {
  TempDir dir;
  const std::string id = unique_id("two");
  auto node = [&](int r) {
    return etcd_args(id, {"--nnodes", "2", "--node-rank", std::to_string(r), "--rdzv-timeout", "30",
                          "--nproc-per-node", "2", kStoreWorker});
  };
  GzrunProcess n0(node(0), dir);
  GzrunProcess n1(node(1), dir);
  ASSERT_TRUE(n0.wait(60)) << n0.describe();
  ASSERT_TRUE(n1.wait(60)) << n1.describe();
  ASSERT_EQ(n0.exit_code(), 0) << n0.describe();
  ASSERT_EQ(n1.exit_code(), 0) << n1.describe();
  const std::string all = n0.out() + n1.out();
  for (int r = 0; r < 4; ++r) {
    const std::string want = "[" + std::to_string(r) + "] rank=" + std::to_string(r) +
                             " world=4 launcher=gzrun hosts_server=0 sum=" + std::to_string(1 + 2 + 5 + 10);
    EXPECT_NE(all.find(want), std::string::npos) << want << "\n" << n0.describe() << n1.describe();
  }
  auto env = parse_env_output(all);
  ASSERT_EQ(env.size(), 4u) << all;
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(std::regex_match(env[r]["RUN_ID"], std::regex(std::to_string(n0.pid()) + "\\.[0-9a-f]{8}-0")))
        << "rank " << r << ": " << env[r]["RUN_ID"];
  // No store host names the program's rank 0: node 0 does (its host name), for every node's
  // workers. Before, every worker got MASTER_ADDR=127.0.0.1, its own machine.
  char host[256] = {0};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(env[r]["MASTER_ADDR"], host) << "rank " << r;
  EXPECT_EQ(job_store(id).num_keys(), 1);  // the last node out removed the rest
}

// etcd keeps a finished job's end marker: an elastic job rerun with the same --rdzv-id is refused
// like a fixed one. Before, its gzrun read the old "done" while joining and exited 0 at once,
// running nothing.
TEST(GzrunEtcd, ElasticRerunOfAFinishedJobIsRefused) {
  TempDir dir;
  const std::string id = unique_id("elastic-rerun");
  auto node = [&] {
    return etcd_args(id, {"--nnodes", "1:2", "--rdzv-join-window", "0.2", "--rdzv-timeout", "20",
                          "--nproc-per-node", "1", kStoreWorker});
  };
  GzrunProcess first(node(), dir);
  ASSERT_TRUE(first.wait(60)) << first.describe();
  ASSERT_EQ(first.exit_code(), 0) << first.describe();
  GzrunProcess again(node(), dir);
  ASSERT_TRUE(again.wait(30)) << again.describe();
  EXPECT_EQ(again.exit_code(), 1) << again.describe();
  EXPECT_NE(again.err().find("already ran to its end"), std::string::npos) << again.describe();
  EXPECT_EQ(again.out().find("rank="), std::string::npos) << "workers ran\n" << again.describe();
}

// A job whose gzruns were killed never wrote its end marker: its counters stay in etcd. A rerun
// with the same --rdzv-id is refused at once, saying why and what to do, once no old node's
// heartbeat moves within the heartbeat timeout. Before, the rerun's nodes counted the old
// arrivals and waited out --rdzv-timeout.
TEST(GzrunEtcd, RerunOverACrashedJobsKeysIsRefused) {
  TempDir dir;
  const std::string id = unique_id("crashed");
  {
    // What a two-node job killed in round 0 leaves behind.
    auto s = job_store(id);
    s.add("gzrun/attempt0/nodes/arrived", 2);
    s.set("gzrun/attempt0/run_id", gz::to_bytes("123-0"));
    s.add("gzrun/round0/hb/0", 7);
    s.add("gzrun/round0/hb/1", 7);
  }
  auto node = [&](int r) {
    return etcd_args(id, {"--nnodes", "2", "--node-rank", std::to_string(r), "--rdzv-timeout", "8",
                          "--heartbeat-timeout", "1", "--nproc-per-node", "1", kStoreWorker});
  };
  gz::Stopwatch sw;
  GzrunProcess n0(node(0), dir);
  GzrunProcess n1(node(1), dir);
  ASSERT_TRUE(n0.wait(30)) << n0.describe();
  ASSERT_TRUE(n1.wait(30)) << n1.describe();
  for (GzrunProcess* g : {&n0, &n1}) {
    EXPECT_EQ(g->exit_code(), 1) << g->describe();
    EXPECT_NE(g->err().find("none of its nodes heartbeats"), std::string::npos) << g->describe();
    EXPECT_NE(g->err().find("etcdctl del --prefix /gz/" + id + "/"), std::string::npos) << g->describe();
  }
  EXPECT_LT(sw.elapsed().count(), 6000) << "refused only after --rdzv-timeout";
}

TEST(GzrunEtcd, ElasticJobGoesOnWhenANodeIsLost) {
  // Two gzruns of an elastic job (--nnodes 1:2); one is SIGKILLed: the other is told the node was
  // lost, restarts its workers in a new round alone, and the job succeeds. No store died with it.
  TempDir dir;
  const std::string id = unique_id("elastic");
  auto node = [&] {
    return etcd_args(id, {"--nnodes",
                          "1:2",
                          "--rdzv-join-window",
                          "1",
                          "--rdzv-timeout",
                          "30",
                          "--heartbeat-timeout",
                          "3",
                          "--grace-period",
                          "1",
                          "--max-restarts",
                          "2",
                          "--nproc-per-node",
                          "1",
                          kWorker,
                          "job",
                          dir.path(),
                          "-1",
                          "0",
                          "0",
                          "30",
                          "0"});
  };
  GzrunProcess a(node(), dir);
  GzrunProcess b(node(), dir);
  // Both run round 0 (2 nodes) once both workers wrote their pid.
  for (int i = 0; i < 600 && !(file_exists(dir.file("pid_0")) && file_exists(dir.file("pid_1"))); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(file_exists(dir.file("pid_0")) && file_exists(dir.file("pid_1")))
      << a.describe() << b.describe();
  // The node dies whole: its gzrun and its worker.
  const std::string kids =
      read_file("/proc/" + std::to_string(b.pid()) + "/task/" + std::to_string(b.pid()) + "/children");
  ::kill(b.pid(), SIGKILL);
  for (const auto& k : split_lines(kids + "\n"))
    for (size_t p = 0; p < k.size();) {
      size_t e = k.find(' ', p);
      if (e == std::string::npos) e = k.size();
      if (e > p) ::kill(-std::atoi(k.substr(p, e - p).c_str()), SIGKILL);  // its process group
      p = e + 1;
    }
  ASSERT_TRUE(a.wait(60)) << a.describe();
  EXPECT_EQ(a.exit_code(), 0) << a.describe();
  EXPECT_NE(a.err().find("lost"), std::string::npos) << a.describe();
  EXPECT_NE(a.err().find("elastic round 1: node 0 of 1"), std::string::npos) << a.describe();
  EXPECT_NE(a.out().find("done rank=0"), std::string::npos) << a.describe();
}

TEST(GzrunEtcd, PasswordNeverTravelsInClearTextBeyondLoopback) {
  TempDir dir;
  GzrunProcess g({"--rdzv-backend", "etcd", "--rdzv-endpoints", "10.255.255.1:2379", "--rdzv-id", "x",
                  "--rdzv-conf", "user=gz", "--nnodes", "2", "--node-rank", "0", kStoreWorker},
                 dir, {{"GZ_RDZV_TOKEN", "0123456789abcdef0123456789abcdef"}});
  ASSERT_TRUE(g.wait(20)) << g.describe();
  EXPECT_EQ(g.exit_code(), 2) << g.describe();
  EXPECT_NE(g.err().find("clear text"), std::string::npos) << g.describe();
  EXPECT_LT(g.elapsed_s(), 5);
  // Beyond loopback, nobody authenticating: refused too.
  GzrunProcess open({"--rdzv-backend", "etcd", "--rdzv-endpoints", "10.255.255.1:2379", "--rdzv-id", "x",
                     "--nnodes", "2", "--node-rank", "0", kStoreWorker},
                    dir);
  ASSERT_TRUE(open.wait(20)) << open.describe();
  EXPECT_EQ(open.exit_code(), 2) << open.describe();
  EXPECT_NE(open.err().find("must authenticate"), std::string::npos) << open.describe();
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (gz::test::etcd_binary().empty()) {
    std::printf("SKIP: etcd is not installed (apt-get install etcd-server)\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
