// One rank of the two-simulated-hosts test (tests/comm/netns/two_hosts.sh): rendezvous from the
// launcher's environment (gzrun or torchrun variables), build the "auto" communicator and check
// every collective against the reference. GZ_EXPECT_BACKEND, when set, must equal backend().
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/test_gloo_common.h"
#include "gz/comm/factory.h"
#include "gz/core/env.h"
#include "gz/store/rendezvous.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;

TEST(TwoHosts, AutoBackendMatchesReference) {
  Env env = Env::from_process();
  InitOptions io;
  io.timeout = 60s;
  Rendezvous rdz = rendezvous(io, env);
  comm::CommOptions o;
  o.backend = env.get("GZ_TEST_BACKEND", "auto");
  o.rank = rdz.world.rank;
  o.size = rdz.world.world_size;
  o.store = rdz.store;
  o.timeout = 30s;
  auto c = comm::create_communicator(o);
  std::fprintf(stderr, "rank %d/%d node %s: backend %s\n", c->rank(), c->size(),
               env.get("GZ_NODE_ID", "?").c_str(), c->backend().c_str());
  if (auto want = env.get("GZ_EXPECT_BACKEND")) {
    EXPECT_EQ(c->backend(), *want);
  }
  check_all_collectives(*c, false);
  c->barrier();
  std::fprintf(stderr, "rank %d: all collectives match the reference\n", c->rank());
}

}  // namespace
}  // namespace gz::test
