// One rank of the attack test (multihost_attack.sh): rendezvous through the store gzrun hosts,
// note when that completed (CLOCK_REALTIME, comparable across the simulated hosts, which share
// the kernel's clock), connect the communicator (backend auto: shm inside a host, Gloo across)
// and run a few all-reduce steps, each checked. Rank 0 then looks, with the job's token, for the
// keys the attacker tried to write. One line on stdout:
//   rank=R world=W start_ns=T0 rdzv_ns=T1 steps_ok=K steps_ns=T2 backend=B attack_keys=absent|PRESENT
#include <time.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gz/comm/factory.h"
#include "gz/core/env.h"
#include "gz/store/rendezvous.h"
#include "gz/store/tcp_store.h"

namespace {

long long realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// What rdzv_attacker tries to write or bump (tests/launcher/rdzv_attacker.cpp).
bool attack_keys_present(const gz::Env& env) {
  gz::TcpStoreOptions co;
  co.token = env.get("GZ_RDZV_TOKEN", "");
  co.timeout = std::chrono::seconds(10);
  // gzrun's store (GZ_STORE_*), not the program's MASTER_PORT.
  gz::TcpStore s(env.get("GZ_STORE_ADDR", "127.0.0.1"), static_cast<int>(env.get_int("GZ_STORE_PORT", 0)),
                 co);
  return s.check({"attack/owned"}) || s.check({"attack/appended"}) || s.check({"attack/counter"});
}

}  // namespace

int main() {
  const long long start_ns = realtime_ns();
  try {
    const gz::Env env = gz::Env::from_process();
    gz::InitOptions io;
    io.timeout = std::chrono::seconds(30);
    gz::Rendezvous rv = gz::rendezvous(io, env);
    const long long rdzv_ns = realtime_ns();

    gz::comm::CommOptions o;
    o.backend = env.get("GZ_TEST_BACKEND", "auto");
    o.rank = rv.world.rank;
    o.size = rv.world.world_size;
    o.store = rv.store;
    o.timeout = std::chrono::seconds(30);
    auto c = gz::comm::create_communicator(o);
    const int world = c->size();
    const int steps = 5;
    int ok = 0;
    std::vector<float> v(1 << 14);
    for (int step = 0; step < steps; ++step) {
      for (auto& x : v) x = static_cast<float>(c->rank() + step);
      c->allreduce(v.data(), v.size(), gz::DType::f32, gz::comm::ReduceOp::sum);
      const float want = static_cast<float>(world * step + world * (world - 1) / 2);
      bool all = true;
      for (float x : v) all = all && x == want;
      ok += all ? 1 : 0;
    }
    c->barrier();
    const long long steps_ns = realtime_ns();
    std::string keys = "unchecked";
    if (c->rank() == 0) keys = attack_keys_present(env) ? "PRESENT" : "absent";
    std::printf(
        "rank=%d world=%d start_ns=%lld rdzv_ns=%lld steps_ok=%d steps_ns=%lld backend=%s attack_keys=%s\n",
        c->rank(), world, start_ns, rdzv_ns, ok, steps_ns, c->backend().c_str(), keys.c_str());
    std::fflush(stdout);
    c->barrier();  // rank 0's check is done before anyone leaves
    return ok == steps ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attack worker failed: %s\n", e.what());
    return 1;
  }
}
