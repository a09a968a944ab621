// Worker of the node-fault tests (multihost_faults.sh): rendezvous through the store gzrun hosts,
// build the communicator (GZ_TEST_BACKEND, default auto: shared memory within a host, Gloo across
// hosts) and all-reduce a buffer in a loop, each op with its own deadline, so that a fault lands
// in the middle of an all-reduce.
//   gzrun_fault_worker DIR FLOATS DEADLINE_S
// Writes DIR/pid_<rank> once the first all-reduce succeeded (the test injects faults after every
// rank wrote it). When an op fails it writes the wall-clock time in ns to DIR/raised_<rank>,
// prints "rank R raised after E ms in all-reduce #N: <error>" and exits 3. SIGTERM (gzrun
// stopping it) ends it at once.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "gz/comm/factory.h"
#include "gz/core/env.h"
#include "gz/store/rendezvous.h"

namespace {

long long wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());  // the test sees the file whole or not at all
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: gzrun_fault_worker DIR FLOATS DEADLINE_S\n");
    return 2;
  }
  const std::string dir = argv[1];
  const size_t floats = std::strtoull(argv[2], nullptr, 10);
  const auto deadline = std::chrono::milliseconds(static_cast<long long>(std::atof(argv[3]) * 1000));
  int rank = -1;
  long long iteration = 0;
  auto started = std::chrono::steady_clock::now();
  try {
    gz::Env env = gz::Env::from_process();
    gz::InitOptions io;
    io.timeout = std::chrono::seconds(30);
    gz::Rendezvous rdz = gz::rendezvous(io, env);
    rank = rdz.world.rank;
    gz::comm::CommOptions o;
    o.backend = env.get("GZ_TEST_BACKEND", "auto");
    o.rank = rank;
    o.size = rdz.world.world_size;
    o.store = rdz.store;
    o.timeout = std::chrono::seconds(30);  // connecting; every all-reduce below has its own deadline
    auto c = gz::comm::create_communicator(o);
    std::vector<float> buf(floats, 1.0f);
    gz::comm::OpOptions op;
    op.timeout = deadline;
    for (;; ++iteration) {
      started = std::chrono::steady_clock::now();
      for (auto& x : buf) x = 1.0f;
      c->allreduce(buf.data(), buf.size(), gz::DType::f32, gz::comm::ReduceOp::sum, op);
      if (buf[floats - 1] != static_cast<float>(c->size())) {
        std::fprintf(stderr, "rank %d: wrong all-reduce result %f\n", rank, buf[floats - 1]);
        return 4;
      }
      if (iteration == 0) {
        write_file(dir + "/pid_" + std::to_string(rank), std::to_string(getpid()) + "\n");
        std::printf("rank %d of %d: backend %s, all-reducing %zu floats\n", rank, c->size(),
                    c->backend().c_str(), floats);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    const long long now = wall_ns();
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    if (rank >= 0) write_file(dir + "/raised_" + std::to_string(rank), std::to_string(now) + "\n");
    std::fprintf(stderr, "rank %d raised after %lld ms in all-reduce #%lld: %s\n", rank,
                 static_cast<long long>(ms.count()), iteration, e.what());
    return 3;
  }
}
