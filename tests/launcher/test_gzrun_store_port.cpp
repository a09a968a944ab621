// Who holds gzrun's store port (label mp): an elastic gzrun that finds MASTER_PORT+1 busy takes it
// for another gzrun of its job, so it must never reveal its token to whatever listens there, and
// two jobs started on adjacent ports must fail clearly instead of sharing a store.
#include <gtest/gtest.h>

#include "gz/core/error.h"
#include "gz/store/tcp_store.h"
#include "gzrun_harness.h"
#include "store/handshake.h"
#include "store/impostor.h"

using namespace gz::test;
namespace wire = gz::wire;

namespace {

const std::string kToken = "0123456789abcdef-adjacent-jobs";
const std::map<std::string, std::string> kEnv = {{"GZ_RDZV_TOKEN", kToken}};

// A port P with P and P + 1 free right now.
int free_pair() {
  for (int i = 0; i < 50; ++i) {
    const int p = free_port();
    if (p > 0 && p < 65535 && port_is_free(p + 1)) return p;
  }
  return 0;
}

std::vector<std::string> elastic(int master_port, std::vector<std::string> prog) {
  std::vector<std::string> a = {"--nnodes",           "1:2",
                                "--master-addr",      "127.0.0.1",
                                "--master-port",      std::to_string(master_port),
                                "--rdzv-timeout",     "5",
                                "--rdzv-join-window", "0.2"};
  a.insert(a.end(), prog.begin(), prog.end());
  return a;
}

}  // namespace

TEST(GzrunStorePort, ElasticNeverRevealsItsTokenToWhateverHoldsTheStorePort) {
  const int p = free_pair();
  ASSERT_GT(p, 0);
  // Another user's listener on MASTER_PORT+1, answering hello with a made-up challenge.
  Impostor impostor(
      [](const wire::Message&) {
        return frame_of(wire::Reply::challenge,
                        {wire::random_bytes(32), wire::random_bytes(16), wire::random_bytes(32), "gzrun"});
      },
      p + 1);
  if (!impostor.ok()) GTEST_SKIP() << "port " << p + 1 << " was taken in between";
  TempDir dir;
  GzrunProcess g(elastic(p, {"true"}), dir, kEnv);
  ASSERT_TRUE(g.wait(20)) << g.describe();
  EXPECT_NE(g.exit_code(), 0) << g.describe();
  EXPECT_LT(g.elapsed_s(), 4) << "a failed proof must end at once, not at --rdzv-timeout";
  EXPECT_NE(g.err().find("store port " + std::to_string(p + 1) +
                         " (MASTER_PORT+1) on this host is taken, but not "
                         "by this job's store"),
            std::string::npos)
      << g.describe();
  EXPECT_NE(g.err().find("did not prove that it knows the rendezvous token"), std::string::npos)
      << g.describe();
  EXPECT_NE(g.err().find("at least 2 apart"), std::string::npos) << g.describe();
  // All the impostor got: hellos (a random nonce each), never the token or a proof.
  const auto got = impostor.received();
  ASSERT_FALSE(got.empty());
  for (const std::string& bytes : got) {
    EXPECT_EQ(bytes.find(kToken), std::string::npos);
    wire::Message m;
    auto r = wire::decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                          wire::Direction::request, wire::Limits{}, m);
    ASSERT_EQ(r.status, wire::DecodeStatus::ok);
    EXPECT_EQ(r.consumed, bytes.size()) << "more than a hello reached the impostor";
    EXPECT_EQ(m.code, static_cast<uint8_t>(wire::Op::hello));
    EXPECT_EQ(m.parts.at(0).size(), wire::kNonceBytes);
  }
}

TEST(GzrunStorePort, AJobOnTheNextPortFailsClearly) {
  const int p = free_pair();
  ASSERT_GT(p, 0);
  ASSERT_TRUE(port_is_free(p + 2));
  TempDir dir;
  // Job A: MASTER_PORT p, its store on p + 1.
  GzrunProcess a(elastic(p, {"sleep", "4"}), dir, kEnv);
  for (int i = 0; i < 100 && port_is_free(p + 1); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_FALSE(port_is_free(p + 1)) << a.describe();
  // Job B, same token, --master-port p + 1: its program's port is A's store.
  GzrunProcess b(elastic(p + 1, {"true"}), dir, kEnv);
  ASSERT_TRUE(b.wait(20)) << b.describe();
  EXPECT_NE(b.exit_code(), 0) << b.describe();
  EXPECT_NE(b.err().find("MASTER_PORT"), std::string::npos) << b.describe();
  EXPECT_NE(b.err().find("port " + std::to_string(p + 1)), std::string::npos) << b.describe();
  EXPECT_NE(b.err().find("already in use"), std::string::npos) << b.describe();
  ASSERT_TRUE(a.wait(20)) << a.describe();
  EXPECT_EQ(a.exit_code(), 0) << "job A was disturbed:\n" << a.describe();
}

TEST(GzrunStorePort, AStoreOfAnotherJobWithTheSameTokenIsNotTakenForOurs) {
  const int p = free_pair();
  ASSERT_GT(p, 0);
  // Job B (--master-port p + 1) runs; its program hosts a gz store on its MASTER_PORT with the
  // same token (a user who exports one GZ_RDZV_TOKEN for all jobs). Job A, --master-port p,
  // finds p + 1 busy: the store there proves the token, but not that it is a gzrun's.
  gz::TcpStoreServerOptions so;
  so.port = p + 1;
  so.token = kToken;
  std::unique_ptr<gz::TcpStoreServer> program;
  try {
    program = std::make_unique<gz::TcpStoreServer>(so);
  } catch (const gz::SystemError&) {
    GTEST_SKIP() << "port " << p + 1 << " was taken in between";
  }
  TempDir dir;
  GzrunProcess a(elastic(p, {"true"}), dir, kEnv);
  ASSERT_TRUE(a.wait(20)) << a.describe();
  EXPECT_NE(a.exit_code(), 0) << a.describe();
  EXPECT_LT(a.elapsed_s(), 4) << a.describe();
  EXPECT_NE(a.err().find("not by this job's store"), std::string::npos) << a.describe();
  EXPECT_NE(a.err().find("not 'gzrun'"), std::string::npos) << a.describe();
  EXPECT_EQ(program->stats().authenticated, 0u) << "job A used the other job's store";
}
