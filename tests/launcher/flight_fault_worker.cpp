// Worker of the flight-recorder fault matrix (flight_faults.sh): a training loop in miniature,
// launched by gzrun on every simulated host. Each step marks its phases (data, forward, backward,
// optimizer) and all-reduces two "gradient buckets" of different sizes, each with its own
// deadline, like DDP. TEST-ONLY fault hooks, from the environment:
//   GZ_TEST_FAULT=skip      rank GZ_TEST_VICTIM leaves out the second bucket's all-reduce of step
//                           GZ_TEST_FAULT_STEP
//   GZ_TEST_FAULT=mismatch  rank GZ_TEST_VICTIM all-reduces the second bucket with twice its count
//                           at that step
//   GZ_TEST_FAULT=hang      rank GZ_TEST_VICTIM hangs in its data loading at that step (sleeps an
//                           hour, alive: it answers dump requests)
// (SIGSTOP, a killed node and a pulled cable are injected from outside by the script.)
//   flight_fault_worker DIR STEPS DEADLINE_S
// Writes DIR/pid_<rank> once the first step is done; exits 3 when an op fails (after printing
// the error), 0 after STEPS steps.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gz/comm/factory.h"
#include "gz/core/env.h"
#include "gz/core/phase.h"
#include "gz/store/rendezvous.h"

namespace {

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
  }
}

// Some arithmetic standing in for forward/backward (a few ms).
float compute(std::vector<float>& v, int rounds) {
  float acc = 0;
  for (int r = 0; r < rounds; ++r)
    for (auto& x : v) acc += (x = x * 0.999f + 0.001f);
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: flight_fault_worker DIR STEPS DEADLINE_S\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int steps = std::atoi(argv[2]);
  gz::comm::OpOptions op;
  op.timeout = std::chrono::milliseconds(static_cast<long long>(std::atof(argv[3]) * 1000));
  const gz::Env env = gz::Env::from_process();
  const std::string fault = env.get("GZ_TEST_FAULT", "");
  const int victim = static_cast<int>(env.get_int("GZ_TEST_VICTIM", -1));
  const int fault_step = static_cast<int>(env.get_int("GZ_TEST_FAULT_STEP", 10));
  int rank = -1;
  try {
    gz::InitOptions io;
    io.timeout = std::chrono::seconds(60);
    gz::Rendezvous rdz = gz::rendezvous(io, env);
    rank = rdz.world.rank;
    gz::comm::CommOptions o;
    o.backend = env.get("GZ_TEST_BACKEND", "auto");
    o.rank = rank;
    o.size = rdz.world.world_size;
    o.store = rdz.store;
    o.timeout = std::chrono::seconds(60);
    auto c = gz::comm::create_communicator(o);
    std::vector<float> bucket1(4096, 1.0f), bucket2(2048, 1.0f), weights(16384, 0.5f);
    for (int s = 0; s < steps; ++s) {
      gz::set_phase(gz::Phase::data, s);
      const bool hit = rank == victim && s == fault_step;
      std::this_thread::sleep_for(std::chrono::milliseconds(hit && fault == "hang" ? 3600 * 1000 : 20));
      gz::set_phase(gz::Phase::forward);
      compute(weights, 20);
      gz::set_phase(gz::Phase::backward);
      compute(weights, 20);
      c->allreduce(bucket1.data(), bucket1.size(), gz::DType::f32, gz::comm::ReduceOp::sum, op);
      if (!(hit && fault == "skip")) {
        const size_t n = hit && fault == "mismatch" ? bucket2.size() : bucket2.size() / 2;
        c->allreduce(bucket2.data(), n, gz::DType::f32, gz::comm::ReduceOp::sum, op);
      }
      gz::set_phase(gz::Phase::optimizer);
      compute(weights, 5);
      if (s == 0) write_file(dir + "/pid_" + std::to_string(rank), std::to_string(getpid()) + "\n");
    }
    gz::set_phase(gz::Phase::idle);
    std::printf("rank %d: %d steps done\n", rank, steps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 3;
  }
}
