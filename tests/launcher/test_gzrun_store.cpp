// Workers rendezvous through the TcpStore that gzrun hosts (label mp; built once the TcpStore
// and rendezvous implementations exist).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <regex>

#include "gzrun_harness.h"

using namespace gz::test;

namespace {
const std::string kStoreWorker = GZ_BUILD_DIR "/tests/launcher/gzrun_test_store_worker";
// Several gzruns share one store: they need one token, on loopback too.
const std::map<std::string, std::string> kJobToken = {{"GZ_RDZV_TOKEN", "0123456789abcdef-gzrun-store-test"}};

}  // namespace

class GzrunStore : public ::testing::TestWithParam<int> {};

TEST_P(GzrunStore, WorkersMeetInTheHostedStore) {
  const int n = GetParam();
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", std::to_string(n), kStoreWorker}, dir, {{"GZ_RDZV_TOKEN", "tok"}}, {});
  ASSERT_TRUE(g.wait(40)) << g.describe();
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  long long expect = 0;
  for (int r = 0; r < n; ++r) expect += r * r + 1;
  for (int r = 0; r < n; ++r) {
    std::string want = "[" + std::to_string(r) + "] rank=" + std::to_string(r) + " world=" + std::to_string(n) +
                       " launcher=gzrun hosts_server=0 sum=" + std::to_string(expect);
    EXPECT_NE(g.out().find(want), std::string::npos) << want << "\n" << g.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, GzrunStore, ::testing::Values(1, 3));

TEST(GzrunStore, TwoNodesMeetAndGetDistinctRanks) {
  int port;
  {
    // A port free right now for node 0's store (multi-node needs a known port).
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    socklen_t len = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    port = ntohs(sa.sin_port);
    ::close(fd);
  }
  TempDir dir;
  auto node = [&](int r) {
    return std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(r), "--master-addr", "127.0.0.1",
                                    "--master-port", std::to_string(port), "--rdzv-timeout", "20",
                                    "--nproc-per-node", "2", kStoreWorker};
  };
  GzrunProcess n0(node(0), dir, kJobToken);
  GzrunProcess n1(node(1), dir, kJobToken);
  ASSERT_TRUE(n0.wait(40)) << n0.describe();
  ASSERT_TRUE(n1.wait(40)) << n1.describe();
  if (n0.exit_code() != 0 && n0.err().find("in use") != std::string::npos)
    GTEST_SKIP() << "port " << port << " was taken in between";
  ASSERT_EQ(n0.exit_code(), 0) << n0.describe();
  ASSERT_EQ(n1.exit_code(), 0) << n1.describe();
  const long long expect = 1 + 2 + 5 + 10;
  std::string all = n0.out() + n1.out();
  for (int r = 0; r < 4; ++r) {
    std::string want = "[" + std::to_string(r) + "] rank=" + std::to_string(r) + " world=4 launcher=gzrun hosts_server=0 sum=" +
                       std::to_string(expect);
    EXPECT_NE(all.find(want), std::string::npos) << want << "\n" << n0.describe() << n1.describe();
  }
  // One run id for the whole job: node 0's launch id (pid.random) and the attempt.
  auto env = parse_env_output(all);
  ASSERT_EQ(env.size(), 4u) << all;
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(std::regex_match(env[r]["RUN_ID"], std::regex(std::to_string(n0.pid()) + "\\.[0-9a-f]{8}-0")))
        << "rank " << r << ": " << env[r]["RUN_ID"];
}

TEST(GzrunStore, MissingNodeIsAClearTimeout) {
  TempDir dir;
  GzrunProcess n0({"--nnodes", "2", "--node-rank", "0", "--master-port", "0", kStoreWorker}, dir, kJobToken);
  ASSERT_TRUE(n0.wait(10));
  EXPECT_EQ(n0.exit_code(), 2);  // port 0 needs one node
  int port;
  {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    socklen_t len = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    port = ntohs(sa.sin_port);
    ::close(fd);
  }
  GzrunProcess alone({"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(port), "--rdzv-timeout",
                      "2", kStoreWorker},
                     dir, kJobToken);
  ASSERT_TRUE(alone.wait(15)) << alone.describe();
  EXPECT_EQ(alone.exit_code(), 1) << alone.describe();
  EXPECT_NE(alone.err().find("1 of 2 nodes"), std::string::npos) << alone.describe();
  EXPECT_EQ(alone.out(), "");
}

TEST(GzrunStore, HostedStoreEnforcesTheToken) {
  TempDir dir;
  // gzrun hosts the store with token "tok"; the worker presents another one.
  GzrunProcess g({"sh", "-c", "GZ_RDZV_TOKEN=wrong exec \"$0\"", kStoreWorker}, dir, {{"GZ_RDZV_TOKEN", "tok"}}, {});
  ASSERT_TRUE(g.wait(40)) << g.describe();
  EXPECT_EQ(g.exit_code(), 1) << g.describe();
  EXPECT_NE(g.err().find("token"), std::string::npos) << g.describe();
}

TEST(GzrunStore, NodeZeroWaitsForTheOtherNodesBeforeExiting) {
  // Node 0's workers finish at once, node 1's take 4 s: node 0 must keep the store up until node
  // 1 is done (exit barrier), here bounded by --rdzv-timeout 2 -> a clear error on both nodes.
  const int port = free_port();
  ASSERT_GT(port, 0);
  TempDir dir;
  auto node = [&](int r) {
    return std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(r), "--master-port",
                                    std::to_string(port), "--rdzv-timeout", "2", "sh", "-c",
                                    "if [ $NODE_RANK = 1 ]; then sleep 4; fi"};
  };
  GzrunProcess n0(node(0), dir, kJobToken);
  GzrunProcess n1(node(1), dir, kJobToken);
  ASSERT_TRUE(n0.wait(20)) << n0.describe();
  ASSERT_TRUE(n1.wait(20)) << n1.describe();
  if (n0.err().find("in use") != std::string::npos) GTEST_SKIP() << "port " << port << " was taken in between";
  EXPECT_EQ(n0.exit_code(), 1) << n0.describe();
  EXPECT_NE(n0.err().find("only 1 of 2 nodes reached gzrun/round0/exit"), std::string::npos) << n0.describe();
  EXPECT_GE(n0.elapsed_s(), 1.9);
  EXPECT_NE(n1.exit_code(), 0) << n1.describe();  // its store went away
}

TEST(GzrunStore, SignalWhileWaitingForNodesStopsAtOnce) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  TempDir dir;
  GzrunProcess n0({"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(port), "--rdzv-timeout", "30",
                   kStoreWorker},
                  dir, kJobToken);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let it reach the node barrier
  ASSERT_EQ(::kill(n0.pid(), SIGINT), 0);
  ASSERT_TRUE(n0.wait(5)) << "gzrun ignored SIGINT while waiting for nodes";
  if (n0.err().find("in use") != std::string::npos) GTEST_SKIP() << "port " << port << " was taken in between";
  EXPECT_EQ(n0.exit_code(), 128 + SIGINT) << n0.describe();
  EXPECT_EQ(n0.out(), "");
}
