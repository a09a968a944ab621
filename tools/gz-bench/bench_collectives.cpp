// gz-bench collectives: nccl-tests style bandwidth/latency sweep of one collective over several
// backends in one run, next to a single-thread memcpy bandwidth measured in the same run.
//
//   mpirun -np 2 gz-bench collectives --backend shm,gloo,mpi
//   gzrun --nproc-per-node 2 gz-bench collectives --op allgather --sizes 4K:64M
//   gz-bench collectives --threads 2          (ranks as threads of this process, no launcher)
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/comm/factory.h"
#include "gz/comm/shm.h"
#include "gz/core/dtype.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rendezvous.h"
#ifdef GZ_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // C API only: the C++ bindings need an extra library
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace {

using namespace gz;
using namespace gz::comm;
using BenchClock = std::chrono::steady_clock;

struct BenchOptions {
  // Lists: every op x dtype x reduce (the reduce only where the op reduces) is swept in turn, so
  // that a coverage run starts the ranks (and loads their libraries) once.
  std::vector<std::string> ops = {"allreduce"};
  std::vector<DType> dtypes = {DType::f32};
  std::vector<ReduceOp> reduces = {ReduceOp::sum};
  // The combination being swept (set by run_rank from the lists).
  std::string op = "allreduce";
  std::vector<std::string> backends = {"shm"};
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;
  size_t min_bytes = 4 << 10;
  size_t max_bytes = 256 << 20;
  size_t factor = 2;
  int iters = 0;  // 0 = auto (about 0.25 s per size, 5..2000)
  int warmup = 5;
  int threads = 0;
  std::string csv;
  bool check = true;
};

int usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: gz-bench collectives [options]\n"
               "  --op LIST        comma list of allreduce, broadcast, allgather, reduce_scatter (default allreduce)\n"
               "  --backend LIST   comma list of shm, gloo, mpi, auto (default shm); mpi = raw MPI through\n"
               "                   MPI_COMM_WORLD, needs mpirun\n"
               "  --dtype LIST     comma list of f32 f64 f16 bf16 i8 u8 i32 i64 (default f32)\n"
               "  --reduce LIST    comma list of sum avg min max prod (default sum; allreduce and\n"
               "                   reduce_scatter only): every op x dtype x reduce is swept in turn\n"
               "  --sizes A:B[:xF] byte range with K/M/G suffixes, step factor F (default 4K:256M:x2)\n"
               "  --iters N        timed iterations per size (default: auto, ~0.25 s per size)\n"
               "  --warmup N       untimed iterations per size (default 5)\n"
               "  --no-check       skip the once-per-size correctness check\n"
               "  --csv FILE       also write rows as CSV (rank 0)\n"
               "  --threads N      run N ranks as threads of this process (no launcher needed)\n"
               "Columns: size_bytes (whole buffer: allgather = gathered output, reduce_scatter = input),\n"
               "time_us (mean per op, slowest rank), algbw = size/time, busbw = algbw x factor\n"
               "(allreduce 2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast 1), as in nccl-tests.\n");
  return code;
}

size_t parse_size(const std::string& s) {
  if (s.empty()) GZ_THROW(InvalidArgument, "empty size");
  double mul = 1;
  std::string num = s;
  char last = static_cast<char>(std::toupper(s.back()));
  if (last == 'K' || last == 'M' || last == 'G') {
    mul = last == 'K' ? 1024.0 : last == 'M' ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
    num = s.substr(0, s.size() - 1);
  }
  return static_cast<size_t>(parse_double(num, "size '" + s + "'") * mul);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

BenchOptions parse_args(int argc, char** argv, bool& help) {
  BenchOptions o;
  help = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      auto eq = a.find('=');
      if (eq != std::string::npos) return a.substr(eq + 1);
      if (i + 1 >= argc) GZ_THROW(InvalidArgument, "option ", a, " needs a value");
      return argv[++i];
    };
    std::string key = a.substr(0, a.find('='));
    if (key == "-h" || key == "--help") help = true;
    else if (key == "--op") o.ops = split(value(), ',');
    else if (key == "--backend" || key == "--backends") o.backends = split(value(), ',');
    else if (key == "--dtype") {
      o.dtypes.clear();
      for (const auto& t : split(value(), ',')) o.dtypes.push_back(parse_dtype(t));
    } else if (key == "--reduce") {
      o.reduces.clear();
      for (const auto& t : split(value(), ',')) o.reduces.push_back(parse_reduce_op(t));
    }
    else if (key == "--sizes") {
      auto parts = split(value(), ':');
      if (parts.empty() || parts.size() > 3) GZ_THROW(InvalidArgument, "--sizes wants A:B[:xF]");
      o.min_bytes = parse_size(parts[0]);
      o.max_bytes = parts.size() > 1 ? parse_size(parts[1]) : o.min_bytes;
      if (parts.size() == 3) {
        std::string f = parts[2];
        if (!f.empty() && (f[0] == 'x' || f[0] == 'X')) f = f.substr(1);
        o.factor = static_cast<size_t>(parse_int(f, "--sizes step"));
      }
      if (o.factor < 2 || o.min_bytes == 0 || o.max_bytes < o.min_bytes)
        GZ_THROW(InvalidArgument, "--sizes: need 0 < A <= B and step >= 2");
    } else if (key == "--iters") o.iters = static_cast<int>(parse_int(value(), "--iters"));
    else if (key == "--warmup") o.warmup = static_cast<int>(parse_int(value(), "--warmup"));
    else if (key == "--threads") o.threads = static_cast<int>(parse_int(value(), "--threads"));
    else if (key == "--csv") o.csv = value();
    else if (key == "--no-check") o.check = false;
    else GZ_THROW(InvalidArgument, "unknown option '", a, "' (see --help)");
  }
  for (const auto& op : o.ops)
    if (op != "allreduce" && op != "broadcast" && op != "allgather" && op != "reduce_scatter")
      GZ_THROW(InvalidArgument, "--op must be allreduce, broadcast, allgather or reduce_scatter, not '", op, "'");
  if (o.ops.empty() || o.dtypes.empty() || o.reduces.empty())
    GZ_THROW(InvalidArgument, "--op, --dtype and --reduce need at least one value");
  if (o.warmup < 0 || o.iters < 0) GZ_THROW(InvalidArgument, "--iters/--warmup must be >= 0");
  return o;
}

// ---- element access for the correctness check (values are small integers, exact everywhere) ----

double get_elem(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::i8: return static_cast<const int8_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void set_elem(DType t, void* p, size_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}

// Input pattern: element i of rank r's block b.
double pattern(int r, size_t i) { return (r + 1) + static_cast<double>(i % 3); }

// ---- one backend = a way to run the op on raw buffers ----

class Runner {
 public:
  virtual ~Runner() = default;
  virtual std::string name() const = 0;
  /// Run the op once: allreduce/broadcast in place on `buf`; allgather from buf to out;
  /// reduce_scatter from buf (n * count) to out (count).
  virtual void run(const BenchOptions& o, void* buf, void* out, size_t count) = 0;
  virtual void barrier() = 0;
  virtual double max_over_ranks(double v) = 0;
};

class CommRunner : public Runner {
 public:
  CommRunner(std::string name, CommPtr c) : name_(std::move(name)), c_(std::move(c)) {}
  std::string name() const override { return name_ + (name_ == c_->backend() ? "" : " (" + c_->backend() + ")"); }
  void run(const BenchOptions& o, void* buf, void* out, size_t count) override {
    if (o.op == "allreduce") c_->allreduce(buf, count, o.dtype, o.reduce);
    else if (o.op == "broadcast") c_->broadcast(buf, count, o.dtype, 0);
    else if (o.op == "allgather") c_->allgather(buf, out, count, o.dtype);
    else c_->reduce_scatter(buf, out, count, o.dtype, o.reduce);
  }
  void barrier() override { c_->barrier(); }
  double max_over_ranks(double v) override {
    c_->allreduce(&v, 1, DType::f64, ReduceOp::max);
    return v;
  }

 private:
  std::string name_;
  CommPtr c_;
};

#ifdef GZ_HAVE_MPI
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: GZ_THROW(InvalidArgument, "mpi: dtype ", dtype_name(t), " has no MPI equivalent");
  }
}
MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::prod: return MPI_PROD;
    default: GZ_THROW(InvalidArgument, "mpi: reduce op ", reduce_op_name(op), " has no MPI equivalent");
  }
}

class MpiRunner : public Runner {
 public:
  std::string name() const override { return "mpi"; }
  void run(const BenchOptions& o, void* buf, void* out, size_t count) override {
    const int c = static_cast<int>(count);
    if (o.op == "allreduce") MPI_Allreduce(MPI_IN_PLACE, buf, c, mpi_type(o.dtype), mpi_op(o.reduce), MPI_COMM_WORLD);
    else if (o.op == "broadcast") MPI_Bcast(buf, c, mpi_type(o.dtype), 0, MPI_COMM_WORLD);
    else if (o.op == "allgather") MPI_Allgather(buf, c, mpi_type(o.dtype), out, c, mpi_type(o.dtype), MPI_COMM_WORLD);
    else MPI_Reduce_scatter_block(buf, out, c, mpi_type(o.dtype), mpi_op(o.reduce), MPI_COMM_WORLD);
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  double max_over_ranks(double v) override {
    double r = 0;
    MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return r;
  }
};
#endif

// Single-thread memcpy bandwidth (GB/s, 1e9 bytes) of 64 MiB, best of several.
double memcpy_bandwidth() {
  const size_t bytes = 64 << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int k = 0; k < 7; ++k) {
    auto t0 = BenchClock::now();
    std::memcpy(b.data(), a.data(), bytes);
    double s = std::chrono::duration<double>(BenchClock::now() - t0).count();
    best = std::min(best, s);
    a[k] = b[bytes - 1 - k];  // keep the copies observable
  }
  return bytes / best / 1e9;
}

double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 1.0;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

// Element counts handed to the op for a size in bytes (per rank contribution for allgather,
// output block for reduce_scatter).
size_t op_count(const std::string& op, size_t bytes, size_t es, int n) {
  if (op == "allgather" || op == "reduce_scatter") return bytes / es / n;
  return bytes / es;
}

void fill_inputs(const BenchOptions& o, int rank, int n, void* buf, size_t count) {
  const size_t total = o.op == "reduce_scatter" ? count * n : count;
  for (size_t i = 0; i < total; ++i) set_elem(o.dtype, buf, i, pattern(rank, i));
}

// Returns an empty string when the result is right, else a description of the first error.
std::string verify(const BenchOptions& o, int rank, int n, const void* buf, const void* out, size_t count) {
  auto reduce_ref = [&](size_t i) {  // the op over every rank's pattern(q, i)
    double acc = pattern(0, i);
    for (int q = 1; q < n; ++q) {
      double v = pattern(q, i);
      switch (o.reduce) {
        case ReduceOp::sum:
        case ReduceOp::avg: acc += v; break;
        case ReduceOp::prod: acc *= v; break;
        case ReduceOp::min: acc = std::min(acc, v); break;
        case ReduceOp::max: acc = std::max(acc, v); break;
      }
    }
    if (o.reduce == ReduceOp::avg) acc = (o.dtype == DType::f32 || o.dtype == DType::f64 || o.dtype == DType::f16 ||
                                          o.dtype == DType::bf16) ? acc / n : std::trunc(acc / n);
    return acc;
  };
  auto tol = [&](double want) {
    return o.dtype == DType::f16 || o.dtype == DType::bf16 ? std::abs(want) * 1e-2 : std::abs(want) * 1e-6;
  };
  std::ostringstream err;
  for (size_t i = 0; i < count; ++i) {
    double got, want;
    if (o.op == "allreduce") {
      got = get_elem(o.dtype, buf, i);
      want = reduce_ref(i);
    } else if (o.op == "broadcast") {
      got = get_elem(o.dtype, buf, i);
      want = pattern(0, i);
    } else if (o.op == "reduce_scatter") {
      got = get_elem(o.dtype, out, i);
      want = reduce_ref(size_t(rank) * count + i);
    } else {
      for (int q = 0; q < n; ++q) {
        got = get_elem(o.dtype, out, q * count + i);
        want = pattern(q, i);
        if (std::abs(got - want) > tol(want)) {
          err << "element " << i << " of rank " << q << "'s block: got " << got << ", want " << want;
          return err.str();
        }
      }
      continue;
    }
    if (std::abs(got - want) > tol(want)) {
      err << "element " << i << ": got " << got << ", want " << want;
      return err.str();
    }
  }
  return "";
}

bool op_reduces(const std::string& op) { return op == "allreduce" || op == "reduce_scatter"; }

// The reduce of a sweep, "-" where the op does not reduce (broadcast, allgather).
const char* reduce_name(const BenchOptions& o) { return op_reduces(o.op) ? reduce_op_name(o.reduce) : "-"; }

struct Row {
  std::string backend, op, dtype, reduce;
  size_t bytes;
  double time_us, algbw, busbw;
};

// Runs the sweep for one backend on one rank; rank 0 prints.
void sweep(const BenchOptions& o, Runner& r, int rank, int n, double memcpy_gbps, std::vector<Row>& rows) {
  const size_t es = dtype_size(o.dtype);
  const size_t max_count = op_count(o.op, o.max_bytes, es, n);
  const size_t buf_elems = o.op == "reduce_scatter" ? max_count * n : max_count;
  const size_t out_elems = o.op == "allgather" ? max_count * n : o.op == "reduce_scatter" ? max_count : 1;
  std::vector<char> buf(buf_elems * es + 64), out(out_elems * es + 64);
  if (rank == 0) {
    std::printf("\n# backend %s  op %s  dtype %s  reduce %s  ranks %d\n", r.name().c_str(), o.op.c_str(),
                dtype_name(o.dtype), reduce_name(o), n);
    std::printf("# %12s %12s %12s %12s %14s\n", "size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "busbw/memcpy");
    std::fflush(stdout);
  }
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    const size_t count = op_count(o.op, bytes, es, n);
    if (count == 0) continue;
    const size_t real_bytes = (o.op == "allgather" || o.op == "reduce_scatter") ? count * es * n : count * es;
    if (o.check) {
      fill_inputs(o, rank, n, buf.data(), count);
      r.run(o, buf.data(), out.data(), count);
      std::string e = verify(o, rank, n, buf.data(), out.data(), count);
      if (!e.empty())
        GZ_THROW(Error, "WRONG RESULT: backend ", r.name(), " ", o.op, " ", dtype_name(o.dtype), " ",
                 reduce_op_name(o.reduce), " size ", real_bytes, " on rank ", rank, ": ", e);
    }
    // Timed data stays constant (zeros): no overflow, inf or denormal slow-downs in the sums.
    std::memset(buf.data(), 0, buf.size());
    for (int k = 0; k < o.warmup; ++k) r.run(o, buf.data(), out.data(), count);
    int iters = o.iters;
    if (iters == 0) {  // auto: every rank agrees on the slowest rank's estimate
      r.barrier();
      auto t0 = BenchClock::now();
      r.run(o, buf.data(), out.data(), count);
      double one = r.max_over_ranks(std::chrono::duration<double>(BenchClock::now() - t0).count());
      iters = static_cast<int>(std::clamp(0.25 / std::max(one, 1e-7), 5.0, 2000.0));
    }
    r.barrier();
    auto t0 = BenchClock::now();
    for (int k = 0; k < iters; ++k) r.run(o, buf.data(), out.data(), count);
    double secs = r.max_over_ranks(std::chrono::duration<double>(BenchClock::now() - t0).count());
    double t = secs / iters;
    double algbw = real_bytes / t / 1e9;
    double busbw = algbw * bus_factor(o.op, n);
    if (rank == 0) {
      std::printf("  %12zu %12.2f %12.3f %12.3f %14.2f\n", real_bytes, t * 1e6, algbw, busbw, busbw / memcpy_gbps);
      std::fflush(stdout);
      rows.push_back({r.name(), o.op, dtype_name(o.dtype), reduce_name(o), real_bytes, t * 1e6, algbw, busbw});
    }
    if (bytes > o.max_bytes / o.factor) break;  // no overflow past max
  }
}

std::unique_ptr<Runner> make_runner(const std::string& backend, int rank, int n, std::shared_ptr<Store> store,
                                    bool mpi_ok) {
  if (backend == "shm")
    return std::make_unique<CommRunner>("shm", create_shm_communicator(rank, n, std::make_shared<PrefixStore>("bench/shm", store)));
  if (backend == "mpi") {
#ifdef GZ_HAVE_MPI
    if (!mpi_ok) GZ_THROW(InvalidArgument, "backend mpi needs the program started by mpirun");
    return std::make_unique<MpiRunner>();
#else
    GZ_THROW(InvalidArgument, "backend mpi: this gz-bench was built without MPI");
#endif
  }
  CommOptions co;
  co.backend = backend;
  co.rank = rank;
  co.size = n;
  co.store = std::make_shared<PrefixStore>("bench/" + backend, store);
  return std::make_unique<CommRunner>(backend, create_communicator(co));
}

void write_csv(const BenchOptions& o, int n, const std::vector<Row>& rows) {
  FILE* f = std::fopen(o.csv.c_str(), "w");
  if (!f) throw SystemError("cannot write " + o.csv, errno);
  std::fprintf(f, "backend,op,dtype,ranks,size_bytes,time_us,algbw_GBps,busbw_GBps,reduce\n");
  for (const Row& r : rows)
    std::fprintf(f, "%s,%s,%s,%d,%zu,%.3f,%.4f,%.4f,%s\n", r.backend.c_str(), r.op.c_str(), r.dtype.c_str(), n,
                 r.bytes, r.time_us, r.algbw, r.busbw, r.reduce.c_str());
  std::fclose(f);
}

// One rank's whole run. Ranks run as processes (launcher) or threads (--threads).
void run_rank(const BenchOptions& o, int rank, int n, std::shared_ptr<Store> store, bool mpi_ok) {
  // memcpy bandwidth on rank 0 while the others wait in the store (no competing traffic).
  double memcpy_gbps = 0;
  if (rank == 0) {
    memcpy_gbps = memcpy_bandwidth();
    store->set("bench/memcpy_gbps", to_bytes(std::to_string(memcpy_gbps)));
    std::printf("# gz-bench collectives: %d ranks, %zu op(s), %zu dtype(s)\n", n, o.ops.size(), o.dtypes.size());
    std::printf("# memcpy bandwidth (1 thread, 64 MiB, best of 7): %.2f GB/s\n", memcpy_gbps);
    std::fflush(stdout);
  } else {
    memcpy_gbps = std::stod(to_string(store->get("bench/memcpy_gbps")));
  }
  std::vector<Row> rows;
  for (const std::string& b : o.backends) {
    std::unique_ptr<Runner> r;
    try {
      r = make_runner(b, rank, n, store, mpi_ok);
    } catch (const InvalidArgument& e) {
      if (rank == 0) std::printf("\n# backend %s skipped: %s\n", b.c_str(), e.what());
      continue;
    }
    for (const auto& op : o.ops)
      for (DType dtype : o.dtypes)
        for (size_t k = 0; k < o.reduces.size(); ++k) {
          if (k > 0 && !op_reduces(op)) break;  // the reduce does not matter: one sweep
          BenchOptions one = o;
          one.op = op;
          one.dtype = dtype;
          one.reduce = o.reduces[k];
          try {
            sweep(one, *r, rank, n, memcpy_gbps, rows);
          } catch (const InvalidArgument& e) {  // e.g. f16 through raw MPI: same on every rank
            if (rank == 0) std::printf("# backend %s skipped: %s\n", b.c_str(), e.what());
          }
        }
  }
  if (rank == 0 && !o.csv.empty()) write_csv(o, n, rows);
}

}  // namespace

int bench_collectives(int argc, char** argv) {
  bool help = false;
  BenchOptions o;
  try {
    o = parse_args(argc, argv, help);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "gz-bench collectives: %s\n", e.what());
    return usage(2);
  }
  if (help) return usage(0);

  if (o.threads > 0) {
    auto store = std::make_shared<MemStore>();
    std::vector<std::thread> ts;
    std::exception_ptr first;
    std::mutex mu;
    for (int r = 0; r < o.threads; ++r)
      ts.emplace_back([&, r] {
        try {
          run_rank(o, r, o.threads, store, false);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
      });
    for (auto& t : ts) t.join();
    if (first) std::rethrow_exception(first);
    return 0;
  }

  bool mpi_ok = false;
#ifdef GZ_HAVE_MPI
  bool want_mpi = std::find(o.backends.begin(), o.backends.end(), "mpi") != o.backends.end();
  Env env = Env::from_process();
  if (want_mpi && (env.has("OMPI_COMM_WORLD_SIZE") || env.has("PMI_SIZE"))) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) MPI_Init(nullptr, nullptr);
    mpi_ok = true;
  }
#endif
  Rendezvous rdz = rendezvous(InitOptions{});
  run_rank(o, rdz.world.rank, rdz.world.world_size, rdz.store, mpi_ok);
#ifdef GZ_HAVE_MPI
  if (mpi_ok) MPI_Finalize();
#endif
  return 0;
}
