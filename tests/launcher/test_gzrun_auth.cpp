// gzrun's rendezvous authentication end to end (label mp): a single node's generated token
// reaches its workers (and only they get in), several nodes beyond loopback refuse to start
// without a token, --rdzv-insecure warns and lets the workers through, a token file is used.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "gzrun_harness.h"

using namespace gz::test;

namespace {
const std::string kStoreWorker = GZ_BUILD_DIR "/tests/launcher/gzrun_test_store_worker";

// Each worker prints its token's length and a fingerprint that does not reveal it, then meets
// the others through the store.
std::vector<std::string> token_worker() {
  return {"sh", "-c",
          "echo TOKEN_LEN=${#GZ_RDZV_TOKEN}; echo TOKEN=$(printf %s \"$GZ_RDZV_TOKEN\" | cksum); "
          "echo INSECURE=${GZ_RDZV_INSECURE:-0}; exec \"$0\"",
          kStoreWorker};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace

TEST(GzrunAuth, OneNodeGeneratesATokenOnlyItsWorkersHave) {
  TempDir dir;
  std::set<std::string> tokens;
  for (int run = 0; run < 2; ++run) {
    GzrunProcess g(with({"--nproc-per-node", "2"}, token_worker()), dir);
    ASSERT_TRUE(g.wait(40)) << g.describe();
    ASSERT_EQ(g.exit_code(), 0) << g.describe();
    auto env = parse_env_output(g.out());
    ASSERT_EQ(env.size(), 2u) << g.describe();
    EXPECT_EQ(env[0]["TOKEN_LEN"], "64");
    EXPECT_EQ(env[0]["TOKEN"], env[1]["TOKEN"]) << "the ranks of one job share the token";
    tokens.insert(env[0]["TOKEN"]);
    EXPECT_NE(g.out().find("sum=3"), std::string::npos) << g.describe();  // (0*0+1) + (1*1+1): both ranks met
  }
  EXPECT_EQ(tokens.size(), 2u) << "two jobs got the same token";
  // A process of the job's user without the token is refused by the store.
  GzrunProcess stranger({"sh", "-c", "GZ_RDZV_TOKEN= exec \"$0\"", kStoreWorker}, dir);
  ASSERT_TRUE(stranger.wait(40)) << stranger.describe();
  EXPECT_EQ(stranger.exit_code(), 1) << stranger.describe();
  EXPECT_NE(stranger.err().find("has a rendezvous token and this client has none"), std::string::npos)
      << stranger.describe();
}

TEST(GzrunAuth, SeveralNodesBeyondLoopbackWithoutATokenFailAtStart) {
  TempDir dir;
  // Node 0 would bind all interfaces and wait for node 1: it must refuse before doing either.
  GzrunProcess g({"--nnodes", "2", "--node-rank", "0", "--master-addr", "10.255.0.1", "--master-port", "1",
                  "--rdzv-timeout", "2", "true"},
                 dir);
  ASSERT_TRUE(g.wait(10)) << g.describe();
  EXPECT_EQ(g.exit_code(), 2) << g.describe();
  EXPECT_LT(g.elapsed_s(), 1.5);
  EXPECT_NE(g.err().find("needs a rendezvous token shared by every node"), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("--rdzv-token-file"), std::string::npos) << g.describe();
}

TEST(GzrunAuth, InsecureWarnsAndLetsTheWorkersThrough) {
  TempDir dir;
  // 0.0.0.0 as the address: beyond loopback by its name, yet local (connecting to it reaches
  // this machine), so the job can run without a second machine. Without a token the workers'
  // library refuses such a store unless gzrun tells them the opt-out was explicit.
  GzrunProcess g(
      with({"--nproc-per-node", "2", "--master-addr", "0.0.0.0", "--rdzv-insecure"}, token_worker()), dir);
  ASSERT_TRUE(g.wait(40)) << g.describe();
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  EXPECT_NE(g.err().find("warning: --rdzv-insecure: the rendezvous store (0.0.0.0:"), std::string::npos)
      << g.describe();
  auto env = parse_env_output(g.out());
  EXPECT_EQ(env[0]["TOKEN_LEN"], "0");
  EXPECT_EQ(env[0]["INSECURE"], "1");
  EXPECT_NE(g.out().find("sum=3"), std::string::npos) << g.describe();
}

TEST(GzrunAuth, TokenFileReachesTheWorkersAndTheFlagIsHidden) {
  TempDir dir;
  const std::string file = dir.file("token");
  const std::string token = "f00dfeedf00dfeedf00dfeedf00dfeed";
  std::ofstream(file) << token << "\n";
  ::chmod(file.c_str(), 0644);
  std::string expect_sum;
  if (FILE* p = ::popen(("printf %s " + token + " | cksum").c_str(), "r")) {
    char buf[128] = {0};
    if (std::fgets(buf, sizeof buf, p)) expect_sum = buf;
    ::pclose(p);
  }
  while (!expect_sum.empty() && expect_sum.back() == '\n') expect_sum.pop_back();
  ASSERT_FALSE(expect_sum.empty());
  GzrunProcess g(with({"--nproc-per-node", "2", "--rdzv-token-file", file}, token_worker()), dir);
  ASSERT_TRUE(g.wait(40)) << g.describe();
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  EXPECT_EQ(parse_env_output(g.out())[1]["TOKEN"], expect_sum) << g.describe();
  EXPECT_NE(g.err().find("readable by other users"), std::string::npos) << g.describe();
  // --rdzv-token: gzrun's own command line shows stars once it runs.
  GzrunProcess h({"--rdzv-token", token, "sh", "-c", "tr '\\0' ' ' </proc/$PPID/cmdline; echo"}, dir);
  ASSERT_TRUE(h.wait(20)) << h.describe();
  EXPECT_EQ(h.out().find(token), std::string::npos) << h.describe();
  EXPECT_NE(h.out().find("--rdzv-token " + std::string(token.size(), '*')), std::string::npos)
      << h.describe();
}
