// NCCL backend, after the pattern of PyTorch c10d's ProcessGroupNCCL, inside our synchronous
// Communicator contract (an op returns when its result is in memory; *_async ops run the same code
// on the progress thread):
//  - one non-blocking NCCL communicator per rank (blocking = 0): every NCCL call may return
//    ncclInProgress, and the op is only queued on the stream once ncclCommGetAsyncError says
//    ncclSuccess, so that state is polled against the op's deadline before anything else;
//  - one private stream; an op records an event on the caller's stream and makes the private
//    stream wait on it, runs there, records an end event, makes the caller's stream wait on that
//    end event, and completes when the end event has (polled, with the deadline and abort flag);
//  - every CUDA call runs under a DeviceGuard for the rank's device, on whichever thread;
//  - a deadline that passes, an NCCL error or abort() aborts the communicator (ncclCommAbort) —
//    the role of c10d's watchdog — so the op fails (TimeoutError / PeerError / Aborted) and
//    every queued and later op fails with Aborted;
//  - send/recv carry a 32-byte header (tag, size, pair sequence) so recv matches by (peer, tag);
//    messages that arrive for another tag wait in a per-peer mailbox.
#include <cuda_runtime.h>
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL backend needs NCCL 2.14 or newer (non-blocking communicators, ncclCommFinalize)"
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/nccl/cuda_resources.h"
#include "comm/nccl/nccl_support.h"
#include "gz/comm/nccl.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"

namespace gz::comm {
namespace {

using namespace nccl_detail;

// After an abort NCCL's kernels exit; how long an op waits for its stream to drain before it
// reports the failure anyway (so that its buffers are not in use when it returns).
constexpr Duration kDrainGrace{2000};
// A clean destroy (ncclCommFinalize) waits at most this long for the peers, then aborts.
constexpr Duration kFinalizeCap{10000};

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
  GZ_THROW(InvalidArgument, "nccl: unknown dtype ", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;  // integers: sum then divide, truncated (our contract)
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
  }
  GZ_THROW(InvalidArgument, "nccl: unknown reduce op ", static_cast<int>(op));
}

/// Poll pacing: yield for the first polls (latency), then sleep up to 1 ms (abort reaction time).
class Backoff {
 public:
  void pause() {
    if (++n_ < 64) return std::this_thread::yield();
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int n_ = 0;
  std::chrono::microseconds sleep_{10};
};

/// Memory from the stream-ordered allocator: freeing it never synchronises the device (cudaFree
/// would wait for every kernel, including NCCL kernels blocked on a peer).
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, cudaStream_t s) : s_(s) {
    if (bytes) cuda_check(cudaMallocAsync(&p_, bytes, s), "cudaMallocAsync", "nccl recv staging");
  }
  StreamBuffer(StreamBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), s_(o.s_) {}
  StreamBuffer& operator=(StreamBuffer&&) = delete;
  ~StreamBuffer() {
    if (p_) cudaFreeAsync(p_, s_);
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  cudaStream_t s_;
};

struct Op {
  const char* name;
  uint64_t seq;
  Stopwatch watch;
  Deadline deadline;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, std::shared_ptr<Store> store, const NcclOptions& opt)
      : Communicator(opt.timeout), rank_(rank), size_(size), store_(std::move(store)), caller_stream_(static_cast<cudaStream_t>(opt.stream)) {
    GZ_CHECK_ARG(size > 0 && rank >= 0 && rank < size, "nccl: rank ", rank, " of ", size);
    GZ_CHECK_ARG(store_ != nullptr, "nccl: a rendezvous store is required");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      GZ_THROW(InvalidArgument, "nccl: rank ", rank, " sees no usable CUDA device (cudaGetDeviceCount: ",
               cudaGetErrorName(e), ": ", cudaGetErrorString(e), "); the NCCL backend needs one GPU per rank");
    }
    device_ = choose_cuda_device(opt.device, Env::from_process(), rank, count);
    DeviceGuard guard(device_);
    res_ = std::make_unique<Resources>(size_);
    const Deadline deadline = Deadline::after(opt.timeout);
    init(exchange_unique_id(deadline), deadline);
    GZ_LOG(debug, "nccl: rank ", rank_, "/", size_, " on CUDA device ", device_, " ready");
  }

  ~NcclCommunicator() override {
    shutdown_executor();  // queued async ops run (each bounded by its deadline) or fail first
    try {
      DeviceGuard guard(device_);
      close_comm();
      drain_stream();
      res_.reset();  // mailboxes (stream-ordered frees) before the stream, buffers after NCCL
    } catch (const std::exception& e) {
      GZ_LOG(warn, "nccl: rank ", rank_, ": teardown: ", e.what());
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  int device() const { return device_; }
  void set_stream(void* s) { caller_stream_.store(static_cast<cudaStream_t>(s)); }

  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override {
    for (size_t i = 0; i < ranks.size(); ++i)
      GZ_CHECK_ARG(ranks[i] >= 0 && ranks[i] < size_ && (i == 0 || ranks[i] > ranks[i - 1]),
                   "nccl new_group: ranks must be ascending, unique and in [0, ", size_, ")");
    // Collective: every rank counts its calls, so the n-th group has the same key everywhere.
    const uint64_t gen = ++groups_;
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    NcclOptions o;
    o.timeout = timeout();
    o.device = device_;
    o.stream = static_cast<void*>(caller_stream_.load());
    auto sub = std::make_shared<PrefixStore>(key_prefix_ + "group" + std::to_string(gen) + "/", store_);
    return std::make_shared<NcclCommunicator>(static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
                                              sub, o);
  }

 protected:
  void do_allreduce(void* d, size_t n, DType t, ReduceOp op) override {
    const auto type = nccl_type(t);
    const auto rop = nccl_op(op);
    collective("allreduce", [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(d, d, n, type, rop, c, s); });
  }
  void do_broadcast(void* d, size_t n, DType t, int root) override {
    const auto type = nccl_type(t);
    collective("broadcast", [&](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(d, d, n, type, root, c, s); });
  }
  void do_allgather(const void* snd, void* rcv, size_t n, DType t) override {
    const auto type = nccl_type(t);
    collective("allgather", [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(snd, rcv, n, type, c, s); });
  }
  void do_allgatherv(const void* snd, void* rcv, const std::vector<size_t>& counts, DType t) override {
    // One broadcast per rank in a group: rank k's block goes from k to everyone.
    const size_t es = dtype_size(t);
    collective("allgatherv", [&](ncclComm_t c, cudaStream_t s) {
      ncclResult_t first = ncclGroupStart();
      size_t off = 0;
      for (int k = 0; k < size_ && first == ncclSuccess; ++k) {
        auto* dst = static_cast<uint8_t*>(rcv) + off * es;
        first = ncclBroadcast(k == rank_ ? snd : dst, dst, counts[k] * es, ncclUint8, k, c, s);
        off += counts[k];
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group
      return first != ncclSuccess ? first : end;
    });
  }
  void do_reduce_scatter(const void* snd, void* rcv, size_t n, DType t, ReduceOp op) override {
    const auto type = nccl_type(t);
    const auto rop = nccl_op(op);
    collective("reduce_scatter",
               [&](ncclComm_t c, cudaStream_t s) { return ncclReduceScatter(snd, rcv, n, type, rop, c, s); });
  }
  void do_reduce(void* d, size_t n, DType t, ReduceOp op, int root) override {
    const auto type = nccl_type(t);
    const auto rop = nccl_op(op);
    collective("reduce", [&](ncclComm_t c, cudaStream_t s) { return ncclReduce(d, d, n, type, rop, root, c, s); });
  }
  void do_barrier() override {
    // c10d's barrier: an all-reduce of one element, here in a buffer the communicator owns.
    void* buf = res_->barrier.get();
    collective("barrier", [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, c, s); });
  }
  void do_send(const void* d, size_t n, DType t, int peer, int tag) override;
  void do_recv(void* d, size_t n, DType t, int peer, int tag) override;
  void do_abort(const std::string&) override { abort_nccl(); }

 private:
  /// CUDA objects, freed under a DeviceGuard after the NCCL communicator is gone.
  struct Resources {
    explicit Resources(int world)
        : stream(CudaStream::create_non_blocking()),
          start(CudaEvent::create()),
          end(CudaEvent::create()),
          barrier(sizeof(float)),
          header(sizeof(P2pHeader)),
          header_host(sizeof(P2pHeader)),
          send_seq(world, 0),
          recv_seq(world, 0),
          mailbox(world) {}
    CudaStream stream;
    CudaEvent start, end;
    DeviceBuffer barrier;     // barrier()'s one element
    DeviceBuffer header;      // the P2pHeader on the wire
    PinnedBuffer header_host; // its staging copy on the host
    std::vector<uint64_t> send_seq, recv_seq;
    std::vector<TagMailbox<StreamBuffer>> mailbox;  // per peer (declared last: freed first)
  };

  cudaStream_t stream() const { return res_->stream.get(); }

  // ---- setup -------------------------------------------------------------------------------
  ncclUniqueId exchange_unique_id(Deadline deadline) {
    // One namespace per communicator this rank creates on the store (each rank counts its own).
    const int64_t gen = store_->add("nccl/created/" + std::to_string(rank_), 1);
    key_prefix_ = "nccl/" + std::to_string(gen) + "/";
    store_->set(key_prefix_ + "joined/" + std::to_string(rank_), to_bytes("1"));
    ncclUniqueId id;
    const std::string key = key_prefix_ + "unique_id";
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        GZ_THROW(PeerError, "nccl init on rank 0/", size_, ": ncclGetUniqueId: ", ncclGetErrorString(r), " (",
                 ncclGetLastError(nullptr), ")");
      store_->set(key, Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
      return id;
    }
    Bytes b;
    try {
      b = store_->get(key, deadline);
    } catch (const TimeoutError& e) {
      GZ_THROW(TimeoutError, "nccl init on rank ", rank_, "/", size_, ": rank 0 did not publish the NCCL unique id ",
               "within ", format_duration(timeout()), " (", e.what(), ")");
    }
    if (b.size() != sizeof(id))
      GZ_THROW(PeerError, "nccl init on rank ", rank_, ": malformed unique id from rank 0 (", b.size(), " bytes)");
    std::memcpy(&id, b.data(), sizeof(id));
    return id;
  }

  void init(const ncclUniqueId& id, Deadline deadline) {
    Stopwatch watch;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // init and ops return at once; we poll against our deadlines
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&c, size_, id, rank_, &cfg);
    comm_ = c;
    Backoff backoff;
    while (r == ncclInProgress || r == ncclSuccess) {
      if (!comm_) break;
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
      if (r == ncclSuccess) return;
      if (r != ncclInProgress) break;
      if (deadline.expired()) {
        abort_nccl();
        GZ_THROW(TimeoutError, "nccl init on rank ", rank_, "/", size_, " timed out after ",
                 format_duration(watch.elapsed()), "; ", missing_ranks());
      }
      backoff.pause();
    }
    const std::string text = error_text(r);
    abort_nccl();
    GZ_THROW(PeerError, "nccl init on rank ", rank_, "/", size_, " (device ", device_, ") failed: ", text);
  }

  /// Which ranks never reached init, from the store ("joined/<rank>" keys).
  std::string missing_ranks() {
    std::string missing;
    int n = 0;
    try {
      for (int r = 0; r < size_; ++r) {
        if (store_->check({key_prefix_ + "joined/" + std::to_string(r)})) continue;
        if (++n <= 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    } catch (const std::exception& e) {
      return std::string("could not ask the store which ranks joined: ") + e.what();
    }
    if (n == 0) return "every rank reached init, but NCCL could not connect them (see NCCL_DEBUG=WARN)";
    return "rank(s) that never joined: " + missing + (n > 16 ? " and " + std::to_string(n - 16) + " more" : "");
  }

  // ---- one op ------------------------------------------------------------------------------
  using Issue = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

  Op begin(const char* name) {
    check_aborted();
    return Op{name, current_seq(), Stopwatch(), op_deadline()};
  }

  /// The NCCL stream starts after what the caller queued on its stream so far.
  void order_after_caller(const Op& op, cudaStream_t caller) {
    cuda(op, cudaEventRecord(res_->start.get(), caller), "cudaEventRecord(caller stream)");
    cuda(op, cudaStreamWaitEvent(stream(), res_->start.get(), 0), "cudaStreamWaitEvent");
  }

  /// Run `issue` on the communicator and wait until NCCL has queued it (non-blocking mode).
  void enqueue(const Op& op, const Issue& issue) {
    ncclResult_t r = ncclSuccess;
    std::string text;
    bool alive;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      alive = comm_ != nullptr;
      if (alive) {
        r = issue(comm_, stream());
        if (r != ncclSuccess && r != ncclInProgress) text = error_text(r);
      }
    }
    if (!alive) throw_aborted(op);
    Backoff backoff;
    while (r == ncclInProgress) {  // not queued yet: nothing may run on the stream before it is
      interrupt_point(op);
      backoff.pause();
      r = comm_state(op, text);
    }
    if (r != ncclSuccess) fail_nccl(op, r, text);
  }

  /// ncclCommGetAsyncError under the lock; Aborted when the communicator is gone.
  ncclResult_t comm_state(const Op& op, std::string& text) {
    ncclResult_t st = ncclSuccess;
    bool alive;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      alive = comm_ != nullptr;
      if (alive) {
        const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
        if (q != ncclSuccess) st = q;
        if (st != ncclSuccess && st != ncclInProgress) text = error_text(st);
      }
    }
    if (!alive) throw_aborted(op);
    return st;
  }

  /// Record the end event, order the caller's stream after it, wait for it.
  void finish(const Op& op, cudaStream_t caller) {
    cuda(op, cudaEventRecord(res_->end.get(), stream()), "cudaEventRecord(end)");
    cuda(op, cudaStreamWaitEvent(caller, res_->end.get(), 0), "cudaStreamWaitEvent(caller stream)");
    wait_event(op, res_->end.get());
  }

  void wait_event(const Op& op, cudaEvent_t ev) {
    Backoff backoff;
    for (;;) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda(op, q, "cudaEventQuery");
      std::string text;
      const ncclResult_t st = comm_state(op, text);  // a peer's failure shows up here
      if (st != ncclSuccess && st != ncclInProgress) fail_nccl(op, st, text);
      interrupt_point(op);
      backoff.pause();
    }
  }

  void collective(const char* name, const Issue& issue) {
    std::lock_guard<std::mutex> op_lock(op_mu_);
    const Op op = begin(name);
    DeviceGuard guard(device_);
    const cudaStream_t caller = caller_stream_.load();
    order_after_caller(op, caller);
    enqueue(op, issue);
    finish(op, caller);
  }

  P2pHeader recv_header(const Op& op, int peer) {
    void* dev = res_->header.get();
    enqueue(op, [&](ncclComm_t c, cudaStream_t s) { return ncclRecv(dev, sizeof(P2pHeader), ncclUint8, peer, c, s); });
    cuda(op, cudaMemcpyAsync(res_->header_host.get(), dev, sizeof(P2pHeader), cudaMemcpyDeviceToHost, stream()),
         "cudaMemcpyAsync(header)");
    cuda(op, cudaEventRecord(res_->end.get(), stream()), "cudaEventRecord(header)");
    wait_event(op, res_->end.get());
    P2pHeader h;
    std::memcpy(&h, res_->header_host.get(), sizeof(h));
    try {
      check_p2p_header(h, res_->recv_seq[peer], peer, rank_);
    } catch (const PeerError& e) {
      abort(e.what());  // the pair is out of step: nothing later on it can be trusted
      throw;
    }
    ++res_->recv_seq[peer];
    return h;
  }

  // ---- failures ----------------------------------------------------------------------------
  /// Abort (someone else's abort() or timeout) and deadline checks inside every wait loop.
  void interrupt_point(const Op& op) {
    if (aborted()) throw_aborted(op);
    if (!op.deadline.expired()) return;
    const std::string msg = detail::concat(
        op_failure(op.name, -1, op.watch.elapsed()), " (CUDA device ", device_,
        "): deadline passed; a peer did not take part (every rank must issue the same ops in the same order); the "
        "NCCL communicator was aborted");
    abort(msg);  // flags queued and later ops as Aborted and calls do_abort -> ncclCommAbort
    abort_nccl();
    drain_stream();
    GZ_THROW(TimeoutError, msg);
  }

  [[noreturn]] void throw_aborted(const Op& op) {
    abort_nccl();    // returns once the abort (ours or another thread's) is complete
    drain_stream();  // NCCL no longer touches this op's buffers when we return
    try {
      check_aborted();
    } catch (const Aborted& e) {
      GZ_THROW(Aborted, op_failure(op.name, -1, op.watch.elapsed()), ": ", e.what());
    }
    GZ_THROW(Aborted, "nccl ", op.name, " #", op.seq, " on rank ", rank_, ": the NCCL communicator was aborted");
  }

  [[noreturn]] void fail_nccl(const Op& op, ncclResult_t r, const std::string& text) {
    const std::string msg = op_failure(op.name, -1, op.watch.elapsed()) + ": " + text;
    // NCCL documents ncclInvalidArgument as having no effect: the communicator stays usable.
    if (r == ncclInvalidArgument) GZ_THROW(InvalidArgument, msg);
    abort(msg + "; the NCCL communicator was aborted");
    abort_nccl();
    drain_stream();
    GZ_THROW(PeerError, msg, "; the NCCL communicator was aborted");
  }

  void cuda(const Op& op, cudaError_t e, const char* call) {
    if (e == cudaSuccess) return;
    const std::string msg = detail::concat(op_failure(op.name, -1, op.watch.elapsed()), " (CUDA device ", device_,
                                           "): ", call, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
    abort(msg);
    abort_nccl();
    GZ_THROW(Error, msg);
  }

  /// "ncclRemoteError: remote process exited or there was a network error (last error: ...)".
  /// Call with comm_mu_ held (or before other threads can see the communicator).
  std::string error_text(ncclResult_t r) const {
    std::string s = ncclGetErrorString(r);
    const char* last = ncclGetLastError(comm_);
    if (last && *last) s += std::string(" (last NCCL error: ") + last + ")";
    return s;
  }

  /// ncclCommAbort once, from whichever thread comes first; the others wait for it to finish.
  void abort_nccl() noexcept {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (!comm_) return;
    int prev = -1;
    const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
    if (!have_prev || prev != device_) cudaSetDevice(device_);
    const ncclResult_t r = ncclCommAbort(comm_);
    if (r != ncclSuccess) GZ_LOG(warn, "nccl: rank ", rank_, ": ncclCommAbort: ", ncclGetErrorString(r));
    comm_ = nullptr;
    if (have_prev && prev != device_) cudaSetDevice(prev);
  }

  /// Wait (bounded) until the private stream is idle; after an abort NCCL's kernels exit.
  void drain_stream() noexcept {
    if (!res_) return;
    int prev = -1;
    const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
    if (!have_prev || prev != device_) cudaSetDevice(device_);
    const Deadline grace = Deadline::after(kDrainGrace);
    while (cudaStreamQuery(stream()) == cudaErrorNotReady) {
      if (grace.expired()) {
        GZ_LOG(warn, "nccl: rank ", rank_, ": the NCCL stream is still busy ", format_duration(kDrainGrace),
               " after the abort");
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (have_prev && prev != device_) cudaSetDevice(prev);
  }

  /// Clean destroy: ncclCommFinalize (flushes, waits for the peers, bounded), then ncclCommDestroy;
  /// ncclCommAbort when that fails or takes too long.
  void close_comm() {
    std::unique_lock<std::mutex> lock(comm_mu_);
    if (!comm_) return;
    const Deadline deadline = Deadline::after(std::min(timeout(), kFinalizeCap));
    ncclResult_t st = ncclCommFinalize(comm_);
    Backoff backoff;
    while (st == ncclInProgress || st == ncclSuccess) {
      if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) break;
      if (st == ncclSuccess) {
        ncclCommDestroy(comm_);
        comm_ = nullptr;
        return;
      }
      if (st != ncclInProgress || deadline.expired()) break;
      backoff.pause();
    }
    GZ_LOG(warn, "nccl: rank ", rank_, ": ncclCommFinalize did not complete (", ncclGetErrorString(st),
           "); aborting the communicator");
    lock.unlock();
    abort_nccl();
  }

  const int rank_, size_;
  int device_ = -1;
  std::shared_ptr<Store> store_;
  std::string key_prefix_;
  std::atomic<cudaStream_t> caller_stream_;
  uint64_t groups_ = 0;
  std::mutex op_mu_;    // one op at a time (sync ops, the progress thread, misuse from threads)
  std::mutex comm_mu_;  // guards comm_: NCCL calls on it vs ncclCommAbort from another thread
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<Resources> res_;
};

void NcclCommunicator::do_send(const void* d, size_t n, DType t, int peer, int tag) {
  std::lock_guard<std::mutex> op_lock(op_mu_);
  const Op op = begin("send");
  DeviceGuard guard(device_);
  const cudaStream_t caller = caller_stream_.load();
  const uint64_t bytes = n * dtype_size(t);
  const P2pHeader h = make_p2p_header(tag, bytes, res_->send_seq[peer]);
  order_after_caller(op, caller);
  // The pinned staging copy is free: the previous op has completed.
  std::memcpy(res_->header_host.get(), &h, sizeof(h));
  void* dev = res_->header.get();
  cuda(op, cudaMemcpyAsync(dev, res_->header_host.get(), sizeof(h), cudaMemcpyHostToDevice, stream()),
       "cudaMemcpyAsync(header)");
  enqueue(op, [&](ncclComm_t c, cudaStream_t s) { return ncclSend(dev, sizeof(P2pHeader), ncclUint8, peer, c, s); });
  if (bytes) enqueue(op, [&](ncclComm_t c, cudaStream_t s) { return ncclSend(d, bytes, ncclUint8, peer, c, s); });
  ++res_->send_seq[peer];
  finish(op, caller);
}

void NcclCommunicator::do_recv(void* d, size_t n, DType t, int peer, int tag) {
  std::lock_guard<std::mutex> op_lock(op_mu_);
  const Op op = begin("recv");
  DeviceGuard guard(device_);
  const cudaStream_t caller = caller_stream_.load();
  const uint64_t want = n * dtype_size(t);
  auto size_mismatch = [&](uint64_t got) {
    GZ_THROW(PeerError, "nccl recv #", op.seq, " on rank ", rank_, ": rank ", peer, " sent ", got, " bytes with tag ",
             tag, " but this recv expects ", want, " bytes (", n, " x ", dtype_name(t), ")");
  };
  auto& box = res_->mailbox[peer];
  order_after_caller(op, caller);
  if (auto early = box.take(tag)) {  // arrived while an earlier recv looked for another tag
    if (early->first != want) size_mismatch(early->first);
    if (want)
      cuda(op, cudaMemcpyAsync(d, early->second.get(), want, cudaMemcpyDeviceToDevice, stream()),
           "cudaMemcpyAsync(staged message)");
    finish(op, caller);
    return;
  }
  for (;;) {
    const P2pHeader h = recv_header(op, peer);
    if (h.tag == tag && h.bytes == want) {
      if (want) enqueue(op, [&](ncclComm_t c, cudaStream_t s) { return ncclRecv(d, want, ncclUint8, peer, c, s); });
      finish(op, caller);
      return;
    }
    // Another tag (or a size this recv cannot take): stage it so the pair stays in step.
    StreamBuffer staged(h.bytes, stream());
    void* p = staged.get();
    if (h.bytes)
      enqueue(op, [&](ncclComm_t c, cudaStream_t s) { return ncclRecv(p, h.bytes, ncclUint8, peer, c, s); });
    if (h.tag == tag) size_mismatch(h.bytes);  // the staged copy is dropped, stream-ordered
    box.put(h.tag, h.bytes, std::move(staged));
    GZ_LOG(debug, "nccl recv #", op.seq, " on rank ", rank_, ": waiting for tag ", tag, " from rank ", peer,
           "; held: ", box.describe());
  }
}

NcclCommunicator* as_nccl(const Communicator& c) {
  auto* n = dynamic_cast<const NcclCommunicator*>(&c);
  if (!n) GZ_THROW(InvalidArgument, "not an NCCL communicator (backend '", c.backend(), "')");
  return const_cast<NcclCommunicator*>(n);
}

}  // namespace

CommPtr create_nccl_communicator(int rank, int size, std::shared_ptr<Store> store, const NcclOptions& options) {
  return std::make_shared<NcclCommunicator>(rank, size, std::move(store), options);
}

CommPtr create_nccl_communicator(int rank, int size, std::shared_ptr<Store> store, Duration timeout) {
  NcclOptions o;
  o.timeout = timeout;
  return create_nccl_communicator(rank, size, std::move(store), o);
}

void set_nccl_stream(Communicator& comm, void* stream) { as_nccl(comm)->set_stream(stream); }

int nccl_device(const Communicator& comm) { return as_nccl(comm)->device(); }

}  // namespace gz::comm
