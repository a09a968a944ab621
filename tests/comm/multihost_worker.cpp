// One rank of the simulated-cluster tests (tests/comm/multihost.sh, hosts from scripts/cluster.sh):
// rendezvous from the launcher's environment (gzrun or mpirun), build the communicator named by
// GZ_TEST_BACKEND (default auto) and check every op x dtype against the reference, after checking
// that the ranks really sit on the hosts the test put them on:
//   - GZ_NODE_ID must be unset: node identity comes from the hostname (UTS namespace) alone;
//   - the hostname is h<GZ_CLUSTER_HOST> (cluster.sh run sets GZ_CLUSTER_HOST);
//   - GZ_EXPECT_HOSTS distinct hostnames over the ranks, ranks of a host contiguous;
//   - GZ_EXPECT_BACKEND equals backend(), e.g. "hier(shm+gloo)";
//   - GZ_EXPECT_SHM=1: this process maps a gz shm segment (the intra-host path is shared memory),
//     0: it maps none (flat gloo / mpi must not use our shm engine).
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <string>

#include "comm/test_gloo_common.h"
#include "gz/comm/factory.h"
#include "gz/core/env.h"
#include "gz/store/etcd_store.h"
#include "gz/store/rendezvous.h"
#include "gz/store/tcp_store.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;

long long wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);  // one clock for every simulated host: they share the kernel
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Mappings of our shm engine's segments (their names are unlinked once mapped, so they show up
// as "/dev/shm/gz-shm-... (deleted)" in the maps of the processes that use them).
int shm_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line))
    if (line.find("/dev/shm/gz-shm-") != std::string::npos) ++n;
  return n;
}

TEST(MultiHost, CollectivesMatchReference) {
  Env env = Env::from_process();
  ASSERT_FALSE(env.has("GZ_NODE_ID")) << "GZ_NODE_ID is set: the test must find hosts by hostname alone";
  const std::string host = host_name();
  if (auto h = env.get("GZ_CLUSTER_HOST")) EXPECT_EQ(host, "h" + *h) << "UTS namespace of the simulated host";

  const std::string backend = env.get("GZ_TEST_BACKEND", "auto");
  InitOptions io;
  io.timeout = 40s;
  Stopwatch rdz_sw;
  Rendezvous rdz = rendezvous(io, env);
  const long long rdz_ms = rdz_sw.elapsed().count();
  const long long rdz_wall = wall_ns();
  const uint64_t rdz_trips = TcpStore::requests_sent() + EtcdStore::requests_sent();
  comm::CommOptions o;
  o.backend = backend;
  o.rank = rdz.world.rank;
  o.size = rdz.world.world_size;
  o.store = rdz.store;
  o.timeout = 30s;
  auto c = comm::create_communicator(o);
  const long long connected_wall = wall_ns();
  // Store round trips of this rank for rendezvous and connecting (the launcher's TCP store, or
  // HTTP requests to etcd).
  const uint64_t trips = TcpStore::requests_sent() + EtcdStore::requests_sent();
  // For multihost.sh's rendezvous timing (bench/run_rdzv_bench.sh): when this rank was through.
  std::fprintf(stderr, "rank %d: rendezvous %lld ms, done at wall %lld ns, connected at wall %lld ns\n",
               o.rank, rdz_ms, rdz_wall, connected_wall);
  std::fprintf(stderr, "rank %d/%d on %s: backend %s\n", c->rank(), c->size(), host.c_str(), c->backend().c_str());
  std::fprintf(stderr, "rank %d: store round trips %llu (rendezvous %llu)\n", c->rank(),
               static_cast<unsigned long long>(trips), static_cast<unsigned long long>(rdz_trips));
  if (auto want = env.get("GZ_EXPECT_BACKEND")) EXPECT_EQ(c->backend(), *want);

  // Every rank's hostname, gathered through the communicator under test.
  const size_t kName = 64;
  std::vector<char> mine(kName, 0), all(kName * c->size(), 0);
  std::strncpy(mine.data(), host.c_str(), kName - 1);
  c->allgather(mine.data(), all.data(), kName, DType::u8);
  std::set<std::string> hosts;
  std::string order, prev;
  for (int r = 0; r < c->size(); ++r) {
    std::string h(all.data() + r * kName);
    if (h != prev && hosts.count(h)) ADD_FAILURE() << "ranks of host " << h << " are not contiguous";
    hosts.insert(h);
    order += (r ? " " : "") + h;
    prev = h;
  }
  if (c->rank() == 0) std::fprintf(stderr, "hosts by rank: %s\n", order.c_str());
  if (auto n = env.get_int("GZ_EXPECT_HOSTS")) EXPECT_EQ(static_cast<long long>(hosts.size()), *n) << order;

  check_all_collectives(*c, env.get("GZ_TEST_FULL", "0") == "1");
  // The asynchronous path (progress thread) across hosts as well.
  std::vector<float> v(4099, 1.0f);
  c->allreduce_async(v.data(), v.size(), DType::f32, comm::ReduceOp::sum)->wait();
  EXPECT_EQ(v[4098], static_cast<float>(c->size()));

  if (auto shm = env.get("GZ_EXPECT_SHM")) {
    const int maps = shm_mappings();
    if (*shm == "1") EXPECT_GT(maps, 0) << "no gz shm segment mapped: the intra-host path is not shared memory";
    else EXPECT_EQ(maps, 0) << "backend " << c->backend() << " maps our shm segments";
  }
  c->barrier();
  std::fprintf(stderr, "rank %d: all collectives match the reference\n", c->rank());
}

}  // namespace
}  // namespace gz::test
