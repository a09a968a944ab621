// MPI backend: every op is a non-blocking MPI_I* call polled against the op's deadline, so a
// dead or stuck peer becomes gz::TimeoutError instead of a hang.
// The C API only: OpenMPI's C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/reduce/reduce.h"  // divide_in_place: MPI has no average
#include "gz/comm/mpi.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"

namespace gz::comm {
namespace {

std::once_flag g_init_once;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_mpi_initialised() {
  std::call_once(g_init_once, [] {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) return;
    int provided = 0;
    // Several communicators (and their progress threads) may call MPI at once.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      GZ_THROW(Error, "MPI_Init_thread failed (is this process started by mpirun?)");
    if (provided < MPI_THREAD_SERIALIZED)
      GZ_LOG(warn, "mpi: the MPI library provides thread level ", provided,
             " only; use one communicator from one thread at a time");
    std::atexit(finalize_at_exit);
  });
}

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

int to_int_count(size_t n, const char* op) {
  if (n > static_cast<size_t>(INT_MAX))
    GZ_THROW(InvalidArgument, "mpi ", op, ": count ", n, " exceeds MPI's int limit; split the buffer");
  return static_cast<int>(n);
}

// 16-bit floats travel as f32 (MPI has no half type): widen before, narrow after.
bool widened(DType t) { return t == DType::f16 || t == DType::bf16; }

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: return MPI_FLOAT;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
  }
  GZ_THROW(InvalidArgument, "mpi: unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
  }
  return MPI_SUM;
}

void widen(const void* src, float* dst, size_t n, DType t) {
  auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = t == DType::f16 ? half_to_float(s[i]) : bf16_to_float(s[i]);
}

void narrow(const float* src, void* dst, size_t n, DType t) {
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = t == DType::f16 ? float_to_half(src[i]) : float_to_bf16(src[i]);
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, Duration timeout) : Communicator(timeout), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  ~MpiCommunicator() override {
    shutdown_executor();
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A communicator with an abandoned request cannot be freed safely; leak it.
    if (!finalized && !broken_ && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override {
    check_usable("new_group");
    GZ_CHECK_ARG(!ranks.empty(), "mpi new_group: empty rank list");
    bool member = false;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size_ || (i > 0 && ranks[i] <= ranks[i - 1]))
        GZ_THROW(InvalidArgument, "mpi new_group: ranks must be ascending, unique and in [0, ", size_, ")");
      member = member || ranks[i] == rank_;
    }
    // MPI_Comm_split is blocking and has no deadline; it only needs every rank to arrive.
    MPI_Comm sub = MPI_COMM_NULL;
    check_rc(MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, rank_, &sub), "new_group", Stopwatch());
    if (!member) return nullptr;
    return std::make_shared<MpiCommunicator>(sub, timeout());
  }

 protected:
  void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    int n = to_int_count(count, "allreduce");
    void* buf = data;
    if (widened(dtype)) buf = widen_into(wide_, data, count, dtype);
    run("allreduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(dtype), mpi_op(op), comm_, r);
    });
    if (widened(dtype)) narrow(wide_.data(), data, count, dtype);
    if (op == ReduceOp::avg) reduce::divide_in_place(data, count, dtype, size_);
  }

  void do_broadcast(void* data, size_t count, DType dtype, int root) override {
    if (count == 0) return;
    // Bytes: no conversion needed for any dtype.
    int n = to_int_count(count * dtype_size(dtype), "broadcast");
    run("broadcast", [&](MPI_Request* r) { return MPI_Ibcast(data, n, MPI_BYTE, root, comm_, r); });
  }

  void do_allgather(const void* send, void* recv, size_t count, DType dtype) override {
    do_allgatherv(send, recv, std::vector<size_t>(size_, count), dtype);
  }

  void do_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) override {
    const size_t es = dtype_size(dtype);
    std::vector<int> bytes(size_), displs(size_);
    size_t off = 0;
    for (int r = 0; r < size_; ++r) {
      bytes[r] = to_int_count(counts[r] * es, "allgatherv");
      displs[r] = to_int_count(off, "allgatherv");
      off += counts[r] * es;
    }
    if (off == 0) return;
    auto* out = static_cast<uint8_t*>(recv);
    const void* in = send;
    if (send == out + displs[rank_]) in = MPI_IN_PLACE;
    run("allgatherv", [&](MPI_Request* r) {
      return MPI_Iallgatherv(in, bytes[rank_], MPI_BYTE, out, bytes.data(), displs.data(), MPI_BYTE, comm_, r);
    });
  }

  void do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override {
    if (recv_count == 0) return;
    int n = to_int_count(recv_count, "reduce_scatter");
    to_int_count(recv_count * size_, "reduce_scatter");
    const void* in = send;
    void* out = recv;
    std::vector<float> wide_out;
    if (widened(dtype)) {
      in = widen_into(wide_, send, recv_count * size_, dtype);
      wide_out.resize(recv_count);
      out = wide_out.data();
    }
    run("reduce_scatter", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in, out, n, mpi_type(dtype), mpi_op(op), comm_, r);
    });
    if (widened(dtype)) narrow(wide_out.data(), recv, recv_count, dtype);
    if (op == ReduceOp::avg) reduce::divide_in_place(recv, recv_count, dtype, size_);
  }

  void do_reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) override {
    if (count == 0) return;
    int n = to_int_count(count, "reduce");
    void* buf = data;
    if (widened(dtype)) buf = widen_into(wide_, data, count, dtype);
    const bool is_root = rank_ == root;
    run("reduce", [&](MPI_Request* r) {
      return MPI_Ireduce(is_root ? MPI_IN_PLACE : buf, is_root ? buf : nullptr, n, mpi_type(dtype), mpi_op(op),
                         root, comm_, r);
    });
    if (!is_root) return;
    if (widened(dtype)) narrow(wide_.data(), data, count, dtype);
    if (op == ReduceOp::avg) reduce::divide_in_place(data, count, dtype, size_);
  }

  void do_barrier() override {
    run("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  void do_send(const void* data, size_t count, DType dtype, int peer, int tag) override {
    int n = to_int_count(count * dtype_size(dtype), "send");
    check_tag(tag);
    run("send", [&](MPI_Request* r) { return MPI_Isend(data, n, MPI_BYTE, peer, tag, comm_, r); }, peer);
  }

  void do_recv(void* data, size_t count, DType dtype, int peer, int tag) override {
    int n = to_int_count(count * dtype_size(dtype), "recv");
    check_tag(tag);
    run("recv", [&](MPI_Request* r) { return MPI_Irecv(data, n, MPI_BYTE, peer, tag, comm_, r); }, peer);
  }

  // The poll loop sees the flag; MPI itself has no way to cancel a collective.
  void do_abort(const std::string&) override {}

 private:
  void* widen_into(std::vector<float>& dst, const void* src, size_t n, DType t) {
    dst.resize(n);
    widen(src, dst.data(), n, t);
    return dst.data();
  }

  void check_tag(int tag) {
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
    if (tag < 0 || (flag && ub && tag > *ub))
      GZ_THROW(InvalidArgument, "mpi: tag ", tag, " out of MPI's range [0, ", (flag && ub ? *ub : 32767), "]");
  }

  void check_usable(const char* op) {
    check_aborted();
    if (broken_)
      GZ_THROW(Aborted, "mpi ", op, " on rank ", rank_, ": an earlier op timed out and may still be running "
               "inside MPI; this communicator cannot be used any more");
  }

  void check_rc(int rc, const char* op, const Stopwatch& sw, int peer = -1) {
    if (rc == MPI_SUCCESS) return;
    throw PeerError(op_failure(op, peer, sw.elapsed()) + ": " + mpi_error_text(rc), peer);
  }

  // Start a non-blocking op and poll it until done, deadline or abort.
  template <typename Start>
  void run(const char* op, Start&& start, int peer = -1) {
    check_usable(op);
    Stopwatch sw;
    Deadline dl = op_deadline();
    MPI_Request req = MPI_REQUEST_NULL;
    check_rc(start(&req), op, sw, peer);
    int done = 0;
    auto pause = std::chrono::microseconds(0);
    for (;;) {
      MPI_Status st;
      check_rc(MPI_Test(&req, &done, &st), op, sw, peer);
      if (done) return;
      if (aborted() || dl.expired()) {
        // A receive can be cancelled, and then MPI no longer touches its buffer. A collective or a
        // send cannot: the request stays inside MPI, so the communicator is poisoned for good.
        if (std::strcmp(op, "recv") != 0 || !cancel(req)) broken_ = true;
        check_aborted();
        throw TimeoutError(op_failure(op, peer, sw.elapsed()) + ": deadline passed; a peer is dead, stuck or "
                           "slow, or the ranks issued different ops", peer);
      }
      // Spin briefly, then back off to at most 200 us between polls.
      if (pause < std::chrono::microseconds(200)) pause += std::chrono::microseconds(10);
      if (pause > std::chrono::microseconds(50)) std::this_thread::sleep_for(pause);
      else std::this_thread::yield();
    }
  }

  // For a receive (cancelling a collective is erroneous in MPI): true once the request is
  // cancelled and complete, so MPI no longer touches its buffer.
  static bool cancel(MPI_Request& req) {
    if (MPI_Cancel(&req) != MPI_SUCCESS) return false;
    // Open MPI completes a cancelled receive at once; a send or collective it cannot cancel would
    // block here, so poll briefly instead of MPI_Wait.
    for (int i = 0; i < 1000; ++i) {
      int done = 0;
      MPI_Status st;
      if (MPI_Test(&req, &done, &st) != MPI_SUCCESS) return false;
      if (done) return true;  // cancelled or completed: either way the buffer is free
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return false;
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  bool broken_ = false;
  std::vector<float> wide_;
};

}  // namespace

bool launched_by_mpirun() {
  Env env = Env::from_process();
  return env.has("OMPI_COMM_WORLD_SIZE") || env.has("PMI_SIZE") || env.has("PMIX_RANK");
}

CommPtr create_mpi_communicator(int rank, int size, const MpiOptions& options) {
  ensure_mpi_initialised();
  int r = 0, s = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  if (rank != r || size != s)
    GZ_THROW(InvalidArgument, "mpi: asked for rank ", rank, " of ", size, " but MPI_COMM_WORLD says rank ", r,
             " of ", s, " (start the job with mpirun -np ", size, ")");
  MPI_Comm dup = MPI_COMM_NULL;
  // A private duplicate: our ops never match the application's own MPI traffic.
  if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) GZ_THROW(Error, "MPI_Comm_dup failed");
  return std::make_shared<MpiCommunicator>(dup, options.timeout);
}

}  // namespace gz::comm
