// The process group: one narrow interface every backend (shm, gloo, mpi, nccl, hierarchical)
// implements. Works on (pointer, count, dtype) spans; never includes LibTorch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gz/comm/flight_recorder.h"
#include "gz/comm/op_options.h"
#include "gz/comm/types.h"
#include "gz/comm/work.h"
#include "gz/core/deadline.h"
#include "gz/core/dtype.h"

namespace gz::comm {

/// @brief A group of ranks that run collectives together.
///
/// Public methods are non-virtual (validate, order, number the op) and call the protected do_*
/// methods a backend implements. Synchronous calls run on the caller's thread; *_async calls run
/// in issue order on one progress thread per communicator, and a synchronous call first waits for
/// earlier async ones, so every rank sees the same op order. One user thread per communicator.
///
/// The per-op contract: every op carries its own deadline and tag (OpOptions; by default the
/// communicator's timeout from when the op is issued) and fails with gz::TimeoutError /
/// gz::PeerError naming op, peer, sequence and elapsed time rather than hanging. abort() completes
/// every queued and running op with gz::Aborted and makes every later op throw it. Destroying a
/// communicator with ops still pending aborts them and waits until they have returned.
class Communicator {
 public:
  explicit Communicator(Duration timeout) : timeout_(timeout) {}
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// @brief "shm", "gloo", "mpi", "nccl", "hier(shm+gloo)", ...
  virtual std::string backend() const = 0;

  /// @brief In place: data (count elements) becomes the reduction over ranks.
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op, const OpOptions& opts = {});
  /// @brief In place: every rank gets root's data.
  void broadcast(void* data, size_t count, DType dtype, int root, const OpOptions& opts = {});
  /// @brief recv (size()*count elements) = concatenation of every rank's send in rank order.
  /// send may point into recv at offset rank()*count (in place).
  void allgather(const void* send, void* recv, size_t count, DType dtype, const OpOptions& opts = {});
  /// @brief Variable sizes: rank r contributes recv_counts[r] elements; recv holds their sum.
  void allgatherv(const void* send, void* recv, const std::vector<size_t>& recv_counts, DType dtype,
                  const OpOptions& opts = {});
  /// @brief send holds size()*recv_count elements; rank r gets the reduction of block r.
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                      const OpOptions& opts = {});
  /// @brief In place on root; other ranks' buffers are left unspecified.
  void reduce(void* data, size_t count, DType dtype, ReduceOp op, int root, const OpOptions& opts = {});
  void barrier(const OpOptions& opts = {});
  /// @brief Point-to-point; matched by (peer, opts.tag) in order.
  void send(const void* data, size_t count, DType dtype, int peer, const OpOptions& opts);
  void recv(void* data, size_t count, DType dtype, int peer, const OpOptions& opts);
  /// @brief send/recv with tag `tag` and the default deadline.
  void send(const void* data, size_t count, DType dtype, int peer, int tag = 0) {
    send(data, count, dtype, peer, OpOptions::tagged(tag));
  }
  void recv(void* data, size_t count, DType dtype, int peer, int tag = 0) {
    recv(data, count, dtype, peer, OpOptions::tagged(tag));
  }

  WorkPtr allreduce_async(void* data, size_t count, DType dtype, ReduceOp op, const OpOptions& opts = {});
  WorkPtr broadcast_async(void* data, size_t count, DType dtype, int root, const OpOptions& opts = {});
  WorkPtr allgather_async(const void* send, void* recv, size_t count, DType dtype, const OpOptions& opts = {});
  WorkPtr reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                               const OpOptions& opts = {});
  /// @brief Run any sequence of ops of this communicator on the progress thread, in order. The
  /// Work's deadline (opts) bounds wait(); the ops inside carry their own.
  WorkPtr submit(std::function<void()> fn, const OpOptions& opts = {});

  /// @brief Zero-filled memory (64-byte aligned) for a buffer this group all-reduces in place
  /// again and again, such as DDP's gradient buckets.
  ///
  /// Collective: every rank calls it with the same size, in the same order. Where peers can map
  /// each other's memory (the shm backend), an all-reduce of such a buffer reads and writes the
  /// peers' copies directly instead of staging through shared slots: half the memory traffic. That
  /// all-reduce needs every rank to pass the same buffer and offset; ranks that disagree get
  /// gz::InvalidArgument naming both. Other backends return ordinary memory. It stays valid while
  /// the returned pointer or a copy of it lives.
  std::shared_ptr<void> alloc_buffer(size_t bytes);

  /// @brief Sub-group of the given ranks (ranks of this group, ascending order = new ranks).
  /// Collective over all ranks of this group; returns nullptr on ranks not in `ranks`. Its flight
  /// recorder is named after this group's ("<name>/g<n>", the n-th group made from this one).
  std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks);
  /// @brief Complete every queued and running op with gz::Aborted, fail every later one, and
  /// tell peers where the backend can (closing connections, poisoning shared state).
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(); }

  /// @brief Default timeout of an op issued without its own (fixed at construction).
  Duration timeout() const { return timeout_; }
  /// @brief Number of ops issued so far (the next op's sequence number).
  uint64_t sequence() const { return seq_.load(); }

  /// @brief This group's flight recorder (created on first use; size GZ_FLIGHT_RECORDER, default
  /// 2000 ops), or nullptr when it is off (GZ_FLIGHT_RECORDER=0) or paused
  /// (set_flight_recorders_paused()). Readers may use it from any thread (snapshot(), lateness());
  /// it lives as long as the communicator.
  FlightRecorder* flight_recorder() noexcept {
    if (flight_detail::g_paused.load(std::memory_order_relaxed)) return nullptr;
    const int8_t st = fr_state_.load(std::memory_order_acquire);
    return st == 1 ? fr_.get() : st == 2 ? nullptr : init_flight_recorder();
  }
  /// @brief Before the first op: this group's recorder keeps `ops` records instead of
  /// GZ_FLIGHT_RECORDER's number; 0 = no recorder. Ignored once the recorder exists.
  void set_flight_recorder_capacity(size_t ops);
  /// @brief How dumps name this group: `name` must be the same on every member ("comm1",
  /// "comm1/node0"); `ranks` are the members in `parent`'s numbering (global ranks without a
  /// parent; empty = unknown). Creators call it before the first op (the factory, the
  /// hierarchical backend, new_group).
  void set_flight_identity(const std::string& name, std::vector<int> ranks = {},
                           Communicator* parent = nullptr);
  /// @brief The name given by set_flight_identity ("" before).
  std::string flight_name() const;

 protected:
  /// @brief Backend part of new_group().
  virtual std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) = 0;
  /// @brief Called when the group is (re)named: a communicator made of others (hierarchical)
  /// names its parts after it ("<name>/node0", ...). Default: nothing.
  virtual void name_flight_parts(const std::string& name) {}
  virtual void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void do_broadcast(void* data, size_t count, DType dtype, int root) = 0;
  virtual void do_allgather(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual void do_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) = 0;
  virtual void do_reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual void do_barrier() = 0;
  virtual void do_send(const void* data, size_t count, DType dtype, int peer, int tag) = 0;
  virtual void do_recv(void* data, size_t count, DType dtype, int peer, int tag) = 0;
  /// @brief Backend part of alloc_buffer(); the default returns ordinary aligned memory.
  virtual std::shared_ptr<void> do_alloc_buffer(size_t bytes);
  /// @brief Backend part of abort(): wake waiters, poison shared state, close sockets.
  virtual void do_abort(const std::string& reason) = 0;

  /// @brief Throws gz::Aborted when abort() was called; backends call it in wait loops.
  void check_aborted() const;
  /// @brief Deadline of the op now running (its OpOptions, fixed when it was issued).
  Deadline op_deadline() const { return current_deadline_; }
  /// @brief Tag of the op now running.
  int op_tag() const { return current_tag_; }
  /// @brief Sequence number of the op now running (for messages and mismatch checks).
  uint64_t current_seq() const { return current_seq_; }
  /// @brief "<backend> <op> #<seq> on rank r/n[ with peer p] failed after <t>": the one prefix
  /// every backend's op errors start with.
  std::string op_failure(const std::string& op, int peer, Duration elapsed) const;
  /// @brief Abort the async ops still queued or running (none once the owner waited for its
  /// Works) and stop the progress thread. Derived destructors call it first, before tearing down
  /// state: the base destructor can no longer reach the backend's do_abort().
  void shutdown_executor();

 private:
  void check_rank(int r, const char* what) const;
  void begin_sync(const OpOptions& opts);
  void start_op(Deadline deadline, int tag);
  /// Runs `fn` (the backend's part of op `info`, numbered by start_op) as one flight record.
  template <typename Fn>
  void recorded(const OpInfo& info, uint64_t issued, Fn&& fn);
  FlightRecorder* init_flight_recorder() noexcept;
  WorkPtr enqueue(std::function<void()> fn, Deadline deadline, const OpInfo& info, uint64_t issued);
  void fail_queued(const std::string& why);
  void executor_loop();

  Duration timeout_;
  std::atomic<uint64_t> seq_{0};
  uint64_t current_seq_ = 0;
  Deadline current_deadline_ = Deadline::after(Duration(0));
  int current_tag_ = 0;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;

  // Flight recorder: created by the first op (or flight_recorder()); state 0 = not yet, 1 = on,
  // 2 = off. The identity is kept here until then.
  std::atomic<int8_t> fr_state_{0};
  std::unique_ptr<FlightRecorder> fr_;
  mutable std::mutex fr_mu_;
  long long fr_capacity_ = -1;  ///< set_flight_recorder_capacity(), -1 = the environment's
  FlightIdentity fr_identity_;
  uint64_t groups_made_ = 0;  ///< new_group calls that succeeded (same on every member)

  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::pair<std::function<void()>, WorkPtr>> queue_;
  size_t in_flight_ = 0;  // queued + running async ops
  bool executor_stopped_ = false;
  bool stop_ = false;
  std::thread executor_;
};

using CommPtr = std::shared_ptr<Communicator>;

/// @brief For owners of memory an async op uses: wait for `work` within its own deadline; if it
/// has not finished by then, abort `comm` (which completes it) and wait until it has returned.
/// Never throws; the op's failure, if any, is dropped (the caller is tearing down).
void finish_or_abort(Communicator& comm, Work& work, const std::string& why) noexcept;

}  // namespace gz::comm
