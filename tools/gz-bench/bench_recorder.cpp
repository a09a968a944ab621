// gz-bench recorder: what the flight recorder costs an op. Communicators over the same ranks, some
// recording and some not, timed in alternating rounds (the order flips every other round) so
// that load changes on a shared machine hit both alike; the result is the median of per-round
// time ratios (on / off), for two pairs created in opposite orders, and their geometric mean.
// Also the recorder's own cost per op (begin + finish) in a tight loop.
//
//   gzrun --nproc-per-node 2 gz-bench recorder --backend shm --bytes 4K --rounds 400
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/comm/factory.h"
#include "gz/comm/flight_recorder.h"
#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rendezvous.h"

namespace {

using namespace gz;
using namespace gz::comm;
using BenchClock = std::chrono::steady_clock;

struct Options {
  std::string backend = "shm";
  size_t bytes = 4096;
  int rounds = 400;
  int iters = 200;       // ops per round and communicator
  bool control = false;  // both communicators without a recorder: the bias of the method itself
};

int usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: gzrun --nproc-per-node N gz-bench recorder [options]\n"
               "  --backend B   shm | gloo | auto (default shm)\n"
               "  --bytes N     f32 all-reduce size in bytes, K/M suffixes (default 4K)\n"
               "  --rounds R    alternating on/off rounds (default 400)\n"
               "  --iters N     all-reduces per round and communicator (default 200)\n"
               "  --control     no recorder on either communicator (an A/A run: the method's own bias)\n"
               "Prints the per-round ratio time(recorder on) / time(recorder off): median, p10, p90 per\n"
               "pair and the pairs' geometric mean, and the recorder's own cost per op (tight loop).\n");
  return code;
}

size_t parse_bytes(std::string s) {
  size_t mul = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mul = 1024, s.pop_back();
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mul = 1024 * 1024, s.pop_back();
  return static_cast<size_t>(std::stoull(s)) * mul;
}

CommPtr make(const Options& o, int rank, int n, std::shared_ptr<Store> store, const std::string& name,
             bool on) {
  CommPtr c;
  if (o.backend == "shm") {
    c = create_shm_communicator(rank, n, std::make_shared<PrefixStore>(name, store));
  } else {
    CommOptions co;
    co.backend = o.backend;
    co.rank = rank;
    co.size = n;
    co.store = std::make_shared<PrefixStore>(name, store);
    co.name = name;
    c = create_communicator(co);
  }
  if (!on) c->set_flight_recorder_capacity(0);
  return c;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// CPU nanoseconds of the recorder alone per op (begin + two arrivals + finish), no communication.
double recorder_ns_per_op() {
  FlightRecorder fr(2000, 0, 2);
  OpInfo info;
  info.kind = OpKind::allreduce;
  info.dtype = DType::f32;
  info.count = 1024;
  const int n = 2000000;
  // Thread CPU time: on a shared machine, wall time would count the time this thread waits for a
  // core. Best of 5.
  auto cpu_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
  };
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = cpu_ns();
    for (int i = 0; i < n; ++i) {
      const uint64_t h = fr.begin(static_cast<uint64_t>(i), info);
      fr.peer_arrived(1, 0);
      fr.finish(h);
    }
    best = std::min(best, (cpu_ns() - t0) / n);
  }
  return best;
}

}  // namespace

namespace {

// Options from argv; returns false with *code set when the program should exit (help, bad use).
bool parse_args(int argc, char** argv, Options* out, int* code) {
  Options& o = *out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) GZ_THROW(InvalidArgument, a, " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") return *code = usage(0), false;
    if (a == "--backend")
      o.backend = next();
    else if (a == "--bytes")
      o.bytes = parse_bytes(next());
    else if (a == "--rounds")
      o.rounds = std::stoi(next());
    else if (a == "--iters")
      o.iters = std::stoi(next());
    else if (a == "--control")
      o.control = true;
    else
      return *code = usage(2), false;
  }
  return true;
}

}  // namespace

int bench_recorder(int argc, char** argv) {
  Options o;
  int code = 0;
  if (!parse_args(argc, argv, &o, &code)) return code;
  Rendezvous rdz = rendezvous(InitOptions{});
  const int rank = rdz.world.rank, n = rdz.world.world_size;
  // Two pairs, created in opposite orders (on, off, off, on): whatever favours the first or the
  // second communicator created (where its segment lands, say) cancels in the geometric mean of
  // the two pairs' ratios.
  CommPtr on1 = make(o, rank, n, rdz.store, "bench_on1", !o.control);
  CommPtr off1 = make(o, rank, n, rdz.store, "bench_off1", false);
  CommPtr off2 = make(o, rank, n, rdz.store, "bench_off2", false);
  CommPtr on2 = make(o, rank, n, rdz.store, "bench_on2", !o.control);
  if ((!on1->flight_recorder() && !o.control) || off1->flight_recorder())
    GZ_THROW(Error,
             "gz-bench recorder: expected communicators with a recorder and without "
             "(is GZ_FLIGHT_RECORDER=0 set?)");
  const size_t count = std::max<size_t>(1, o.bytes / 4);
  std::vector<float> buf(count, 0.0f);
  auto timed = [&](Communicator& c) {
    c.barrier();
    const auto t0 = BenchClock::now();
    for (int k = 0; k < o.iters; ++k) c.allreduce(buf.data(), count, DType::f32, ReduceOp::sum);
    double t = std::chrono::duration<double, std::micro>(BenchClock::now() - t0).count() / o.iters;
    c.allreduce(&t, 1, DType::f64, ReduceOp::max);  // slowest rank
    return t;
  };
  for (int w = 0; w < 3; ++w) timed(*on1), timed(*off1), timed(*off2), timed(*on2);  // warm-up
  std::vector<double> ratio1, ratio2, t_on, t_off;
  for (int r = 0; r < o.rounds; ++r) {
    const bool pair1 = r % 2 == 0;
    Communicator& a = pair1 ? *on1 : *on2;
    Communicator& b = pair1 ? *off1 : *off2;
    double ta, tb;
    if ((r / 2) % 2 == 0) {
      ta = timed(a);
      tb = timed(b);
    } else {
      tb = timed(b);
      ta = timed(a);
    }
    t_on.push_back(ta);
    t_off.push_back(tb);
    (pair1 ? ratio1 : ratio2).push_back(ta / tb);
  }
  if (rank == 0) {
    const double m1 = percentile(ratio1, 0.5), m2 = percentile(ratio2, 0.5), both = std::sqrt(m1 * m2);
    const double own = recorder_ns_per_op();
    std::printf(
        "# gz-bench recorder: backend %s (%s), %d ranks, f32 sum all-reduce of %zu bytes, %d rounds x %d "
        "ops%s\n",
        o.backend.c_str(), on1->backend().c_str(), n, count * 4, o.rounds, o.iters,
        o.control ? " (CONTROL: recorder off on all four)" : "");
    std::printf("time_us median: on %.3f  off %.3f\n", percentile(t_on, 0.5), percentile(t_off, 0.5));
    std::printf(
        "ratio on/off, median per pair: created first %.4f (p10 %.4f, p90 %.4f), created second %.4f "
        "(p10 %.4f, p90 %.4f); geometric mean %.4f\n",
        m1, percentile(ratio1, 0.1), percentile(ratio1, 0.9), m2, percentile(ratio2, 0.1),
        percentile(ratio2, 0.9), both);
    std::printf(
        "recorder alone (begin + arrival + finish, thread CPU time, best of 5): %.1f ns per op, clock %s\n",
        own, flight_clock_source());
    std::printf(
        "RESULT recorder%s backend=%s bytes=%zu ranks=%d ratio=%.4f pair1=%.4f pair2=%.4f on_us=%.3f "
        "off_us=%.3f own_ns=%.1f\n",
        o.control ? "_control" : "", o.backend.c_str(), count * 4, n, both, m1, m2, percentile(t_on, 0.5),
        percentile(t_off, 0.5), own);
  }
  return 0;
}
