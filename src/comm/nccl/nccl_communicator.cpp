// NCCL backend skeleton. Compiled only when GZ_HAVE_NCCL is defined (CMake option GZ_WITH_NCCL
// on a CUDA machine); everything below the guard is UNTESTED: no CUDA machine was available when
// it was written. It shows the seam: store rendezvous of the unique id, one private stream,
// deadline polling with cudaStreamQuery, ncclCommAbort on timeout/abort.
#ifdef GZ_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "gz/comm/nccl.h"
#include "gz/core/error.h"
#include "gz/store/prefix_store.h"

namespace gz::comm {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  GZ_THROW(InvalidArgument, "nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int rank, int size, std::shared_ptr<Store> store, Duration timeout)
      : Communicator(timeout), rank_(rank), size_(size), store_(std::move(store)) {
    ncclUniqueId id;
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store_->set("nccl/unique_id", Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
    } else {
      Bytes b = store_->get("nccl/unique_id", Deadline::after(timeout));
      if (b.size() != sizeof(id)) GZ_THROW(PeerError, "nccl: malformed unique id from rank 0");
      std::memcpy(&id, b.data(), sizeof(id));
    }
    cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Non-blocking init so the deadline also covers a peer that never joins.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &cfg), "ncclCommInitRankConfig");
    wait_comm("init", Deadline::after(timeout));
  }

  ~NcclCommunicator() override {
    shutdown_executor();
    if (comm_) broken_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  std::shared_ptr<Communicator> new_group(const std::vector<int>&) override {
    GZ_THROW(InvalidArgument, "nccl: new_group is not implemented yet (use ncclCommSplit)");
  }

 protected:
  void do_allreduce(void* d, size_t n, DType t, ReduceOp op) override {
    run("allreduce", [&] { return ncclAllReduce(d, d, n, nccl_type(t), nccl_op(op), comm_, stream_); });
  }
  void do_broadcast(void* d, size_t n, DType t, int root) override {
    run("broadcast", [&] { return ncclBroadcast(d, d, n, nccl_type(t), root, comm_, stream_); });
  }
  void do_allgather(const void* s, void* r, size_t n, DType t) override {
    run("allgather", [&] { return ncclAllGather(s, r, n, nccl_type(t), comm_, stream_); });
  }
  void do_allgatherv(const void* s, void* r, const std::vector<size_t>& counts, DType t) override {
    // Grouped broadcasts: rank k's block goes from k to everyone.
    const size_t es = dtype_size(t);
    run("allgatherv", [&] {
      ncclGroupStart();
      size_t off = 0;
      for (int k = 0; k < size_; ++k) {
        auto* dst = static_cast<uint8_t*>(r) + off * es;
        ncclBroadcast(k == rank_ ? s : dst, dst, counts[k] * es, ncclUint8, k, comm_, stream_);
        off += counts[k];
      }
      return ncclGroupEnd();
    });
  }
  void do_reduce_scatter(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    run("reduce_scatter", [&] { return ncclReduceScatter(s, r, n, nccl_type(t), nccl_op(op), comm_, stream_); });
  }
  void do_reduce(void* d, size_t n, DType t, ReduceOp op, int root) override {
    run("reduce", [&] { return ncclReduce(d, d, n, nccl_type(t), nccl_op(op), root, comm_, stream_); });
  }
  void do_barrier() override {
    if (!barrier_buf_) cuda(cudaMalloc(&barrier_buf_, sizeof(float)), "cudaMalloc");
    do_allreduce(barrier_buf_, 1, DType::f32, ReduceOp::sum);
  }
  void do_send(const void* d, size_t n, DType t, int peer, int) override {
    run("send", [&] { return ncclSend(d, n * dtype_size(t), ncclUint8, peer, comm_, stream_); });
  }
  void do_recv(void* d, size_t n, DType t, int peer, int) override {
    run("recv", [&] { return ncclRecv(d, n * dtype_size(t), ncclUint8, peer, comm_, stream_); });
  }
  void do_abort(const std::string&) override {}  // the poll loop sees the flag and aborts NCCL

 private:
  void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress)
      GZ_THROW(PeerError, "nccl ", what, " on rank ", rank_, ": ", ncclGetErrorString(r));
  }
  void cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) GZ_THROW(Error, "cuda ", what, " on rank ", rank_, ": ", cudaGetErrorString(e));
  }
  void wait_comm(const char* op, Deadline dl) {
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) {
      ncclCommGetAsyncError(comm_, &st);
      if (st == ncclInProgress && (dl.expired() || aborted())) fail(op, Stopwatch());
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check(st, op);
  }
  [[noreturn]] void fail(const char* op, const Stopwatch& sw) {
    broken_ = true;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    check_aborted();
    GZ_THROW(TimeoutError, "nccl ", op, " #", current_seq(), " on rank ", rank_, "/", size_, " timed out after ",
             format_duration(sw.elapsed()), "; the NCCL communicator was aborted");
  }
  template <typename F>
  void run(const char* op, F&& enqueue) {
    check_aborted();
    if (!comm_) GZ_THROW(Aborted, "nccl ", op, ": communicator was aborted after an earlier failure");
    Stopwatch sw;
    Deadline dl = op_deadline();
    check(enqueue(), op);
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) cuda(q, op);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      check(async, op);
      if (dl.expired() || aborted()) fail(op, sw);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  int rank_, size_;
  std::shared_ptr<Store> store_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* barrier_buf_ = nullptr;
  bool broken_ = false;
};

}  // namespace

CommPtr create_nccl_communicator(int rank, int size, std::shared_ptr<Store> store, Duration timeout) {
  return std::make_shared<NcclCommunicator>(rank, size, std::move(store), timeout);
}

}  // namespace gz::comm

#endif  // GZ_HAVE_NCCL
