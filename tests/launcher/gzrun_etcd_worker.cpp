// Worker of the etcd fault tests (multihost_etcd.sh): a training job in miniature whose every
// rank reaches the job's store (an etcd cluster, GZ_STORE_BACKEND=etcd) through gz::rendezvous,
// builds a communicator (Gloo across hosts) and runs steps, each one all-reduce that is checked,
// resuming from the step rank 0 checkpointed after every step (the file system is shared by the
// simulated hosts).
//   gzrun_etcd_worker DIR STEPS STEP_MS
// Rank 0 appends "step S world W round R" to DIR/steps.log per step and writes DIR/ckpt (the next
// step). Every rank writes DIR/pid_<rank> once its first all-reduce succeeded. At the end:
// "done rank=R world=W round=T resumed_at=S steps=N". Exit 3 on any failure (gzrun restarts).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gz/comm/factory.h"
#include "gz/core/env.h"
#include "gz/store/rendezvous.h"

namespace {

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());  // whole or absent
  }
}

int read_step(const std::string& path) {
  int step = 0;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    if (std::fscanf(f, "%d", &step) != 1) step = 0;
    std::fclose(f);
  }
  return step;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: gzrun_etcd_worker DIR STEPS STEP_MS\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int steps = std::atoi(argv[2]);
  const int step_ms = std::atoi(argv[3]);
  int rank = -1;
  try {
    const gz::Env env = gz::Env::from_process();
    gz::InitOptions io;
    io.timeout = std::chrono::seconds(60);
    gz::Rendezvous rdz = gz::rendezvous(io, env);
    rank = rdz.world.rank;
    const int world = rdz.world.world_size;
    gz::comm::CommOptions o;
    o.backend = env.get("GZ_TEST_BACKEND", "auto");
    o.rank = rank;
    o.size = world;
    o.store = rdz.store;
    o.timeout = std::chrono::seconds(30);
    auto c = gz::comm::create_communicator(o);
    const std::string round = env.get("GZ_RESTART_COUNT", "?");
    const int resumed = read_step(dir + "/ckpt");
    std::vector<float> buf(1024);
    gz::comm::OpOptions op;
    op.timeout = std::chrono::seconds(10);
    int step = resumed;
    for (; step < steps; ++step) {
      for (auto& x : buf) x = static_cast<float>(rank + 1);
      c->allreduce(buf.data(), buf.size(), gz::DType::f32, gz::comm::ReduceOp::sum, op);
      const float want = static_cast<float>(world) * (world + 1) / 2;
      if (buf.back() != want) {
        std::fprintf(stderr, "rank %d: step %d: all-reduce gave %f, expected %f\n", rank, step, buf.back(),
                     want);
        return 3;
      }
      if (step == resumed) write_file(dir + "/pid_" + std::to_string(rank), std::to_string(getpid()) + "\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      if (rank == 0) {
        if (FILE* f = std::fopen((dir + "/steps.log").c_str(), "a")) {
          std::fprintf(f, "step %d world %d round %s\n", step, world, round.c_str());
          std::fclose(f);
        }
        write_file(dir + "/ckpt", std::to_string(step + 1) + "\n");
      }
    }
    c->barrier();
    std::printf("done rank=%d world=%d round=%s resumed_at=%d steps=%d\n", rank, world, round.c_str(),
                resumed, step);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
    return 3;
  }
}
