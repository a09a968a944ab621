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
/// Every op fails with gz::TimeoutError / gz::PeerError naming op, peer, sequence and elapsed time
/// rather than hanging; abort() makes every blocked and later op throw gz::Aborted.
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
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op);
  /// @brief In place: every rank gets root's data.
  void broadcast(void* data, size_t count, DType dtype, int root);
  /// @brief recv (size()*count elements) = concatenation of every rank's send in rank order.
  /// send may point into recv at offset rank()*count (in place).
  void allgather(const void* send, void* recv, size_t count, DType dtype);
  /// @brief Variable sizes: rank r contributes recv_counts[r] elements; recv holds their sum.
  void allgatherv(const void* send, void* recv, const std::vector<size_t>& recv_counts, DType dtype);
  /// @brief send holds size()*recv_count elements; rank r gets the reduction of block r.
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op);
  /// @brief In place on root; other ranks' buffers are left unspecified.
  void reduce(void* data, size_t count, DType dtype, ReduceOp op, int root);
  void barrier();
  /// @brief Point-to-point; matched by (peer, tag) in order.
  void send(const void* data, size_t count, DType dtype, int peer, int tag = 0);
  void recv(void* data, size_t count, DType dtype, int peer, int tag = 0);

  WorkPtr allreduce_async(void* data, size_t count, DType dtype, ReduceOp op);
  WorkPtr broadcast_async(void* data, size_t count, DType dtype, int root);
  WorkPtr allgather_async(const void* send, void* recv, size_t count, DType dtype);
  WorkPtr reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op);
  /// @brief Run any sequence of ops of this communicator on the progress thread, in order.
  WorkPtr submit(std::function<void()> fn);

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
  /// Collective over all ranks of this group; returns nullptr on ranks not in `ranks`.
  virtual std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks) = 0;
  /// @brief Fail every blocked and future op with gz::Aborted (and tell peers where possible).
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(); }

  Duration timeout() const { return timeout_; }
  void set_timeout(Duration t) { timeout_ = t; }
  /// @brief Number of ops issued so far (the next op's sequence number).
  uint64_t sequence() const { return seq_.load(); }

 protected:
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
  /// @brief Deadline for an op starting now.
  Deadline op_deadline() const { return Deadline::after(timeout_); }
  /// @brief Sequence number of the op now running (for messages and mismatch checks).
  uint64_t current_seq() const { return current_seq_; }
  /// @brief Stop the progress thread; derived destructors call it before tearing down state.
  void shutdown_executor();

 private:
  void check_rank(int r, const char* what) const;
  void begin_sync();
  WorkPtr enqueue(std::function<void()> fn);
  void executor_loop();

  Duration timeout_;
  std::atomic<uint64_t> seq_{0};
  uint64_t current_seq_ = 0;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;

  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::pair<std::function<void()>, WorkPtr>> queue_;
  size_t in_flight_ = 0;  // queued + running async ops
  bool stop_ = false;
  std::thread executor_;
};

using CommPtr = std::shared_ptr<Communicator>;

}  // namespace gz::comm
