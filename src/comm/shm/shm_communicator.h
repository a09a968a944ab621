// The shm backend's Communicator: ranks of one machine meet in one POSIX shared-memory segment.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/shm/layout.h"
#include "comm/shm/liveness.h"
#include "comm/shm/segment.h"
#include "gz/comm/communicator.h"
#include "gz/comm/shm.h"
#include "gz/core/deadline.h"
#include "gz/core/error.h"
#include "gz/store/store.h"

namespace gz::comm::shm {

/// @brief Communicator over a shared segment. Protocol: every rank owns one 32-bit step counter
/// ("flag"). A collective is a sequence of steps: write what peers must read into my slot
/// (step % 3), publish the step, wait until every peer published it, read the peers' slots.
/// Content written for step X is read by peers before they publish X + 2, and a slot is
/// rewritten at step X + 3 only after every peer published X + 2, so three slots suffice
/// without any extra handshake. Waiting spins, then sleeps on the flag with futex.
///
/// Where the code is: layout.h (what lies where in the segment), protocol.cpp (steps, waiting,
/// errors, barrier), liveness.h (how a dead peer is seen), allreduce.cpp (all-reduce and reduce),
/// broadcast.cpp, allgather.cpp, reduce_scatter.cpp, p2p.cpp (send/recv channels), buffers.cpp
/// (alloc_buffer's zero-copy blocks), shm_communicator.cpp (construction, abort, sub-groups).
class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(int rank, int size, std::shared_ptr<Store> store, const ShmOptions& options,
                  std::shared_ptr<Segment> segment, Layout layout, std::string group_id,
                  std::unique_ptr<RankLock> lock);
  ~ShmCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "shm"; }
  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override;

  /// @brief Bytes of one pipeline slot (after defaults and rounding).
  size_t chunk_bytes() const { return layout_.slot_bytes; }

  friend struct ShmTestAccess;  // tests: fault injection into the control lines

 protected:
  void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void do_broadcast(void* data, size_t count, DType dtype, int root) override;
  void do_allgather(const void* send, void* recv, size_t count, DType dtype) override;
  void do_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) override;
  void do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override;
  void do_reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) override;
  void do_barrier() override;
  void do_send(const void* data, size_t count, DType dtype, int peer, int tag) override;
  void do_recv(void* data, size_t count, DType dtype, int peer, int tag) override;
  void do_abort(const std::string& reason) override;
  /// Memory every rank maps: an all-reduce of it reduces straight between the ranks' buffers.
  std::shared_ptr<void> do_alloc_buffer(size_t bytes) override;

 public:
  /// Per-op context for waits and messages.
  struct OpCtx {
    OpKind kind;
    uint64_t seq;
    Deadline deadline;
    Stopwatch sw;
    OpDesc desc;
    uint32_t first_step;
    bool checked = false;
    int peer = -1;  // point-to-point ops
    int tag = 0;
  };

 private:
  OpCtx begin_op(OpKind kind, size_t count, uint64_t extra, DType dtype, ReduceOp op, int root);
  template <typename Fn>
  void guarded(Fn&& fn);
  void step(OpCtx& ctx);
  void check_descriptors(OpCtx& ctx);
  /// Until *word reaches `target`: spin, then futex in slices, checking abort, `fail_word` and
  /// (when peer >= 0) that peer's liveness. False when the op's deadline passed first.
  [[nodiscard]] bool wait_for(const uint32_t* word, uint32_t target, uint32_t* sleepers, int peer, OpCtx& ctx,
                              const uint32_t* fail_word);
  void check_interrupts(const OpCtx& ctx, const uint32_t* fail_word) const;
  void check_alive(int peer, const OpCtx& ctx) const;
  [[noreturn]] void throw_collective_timeout(const OpCtx& ctx, uint32_t target) const;
  std::string where(const OpCtx& ctx) const;

  void reduce_impl(char* data, size_t count, DType dtype, ReduceOp op, int root, OpCtx& ctx);

  /// One alloc_buffer() block: this rank's object and its mappings of every rank's object.
  struct Shared {
    uint64_t id;  ///< alloc_buffer call number, the same on every rank
    size_t bytes;
    std::vector<char*> base;  ///< per rank: where this process sees that rank's block
    std::vector<std::shared_ptr<Segment>> maps;
  };
  struct SharedTable {
    std::mutex mu;
    std::vector<std::shared_ptr<Shared>> items;
  };
  /// The block holding [p, p + bytes), or null; *offset = p - block start.
  std::shared_ptr<Shared> find_shared(const void* p, size_t bytes, size_t* offset) const;
  void allreduce_shared(const Shared& b, size_t offset, size_t count, DType dtype, ReduceOp op, OpCtx& ctx);
  /// Zero copy: rank r folds block r straight out of every rank's alloc_buffer input (send).
  void reduce_scatter_shared(const Shared& b, size_t offset, char* recv, size_t rc, DType dtype, ReduceOp op,
                             OpCtx& ctx);
  /// Zero copy: each rank copies the peers' pieces straight out of their alloc_buffer outputs (recv).
  void allgather_shared(const Shared& b, size_t offset, const char* send, char* recv, size_t count,
                        DType dtype, OpCtx& ctx);
  /// The alloc_buffer block for a zero-copy op on [p, p + bytes), or null (small ops, one rank,
  /// ordinary memory); *tag = what the op descriptor carries so ranks that disagree fail.
  std::shared_ptr<Shared> zero_copy_block(const void* p, size_t bytes, size_t* offset, uint64_t* tag) const;

  RankCtrl& ctrl(int r) const;
  ChannelCtrl& channel(int src, int dst) const;
  char* channel_slot(int src, int dst, uint32_t i) const;
  char* slot(int r, uint32_t s) const { return base_ + layout_.data_off + (size_t(r) * 3 + s) * layout_.slot_bytes; }

  int rank_;
  int size_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Segment> segment_;
  Layout layout_;
  std::string group_id_;
  char* base_;
  int spin_us_;
  bool oversubscribed_;
  size_t small_bytes_;
  size_t stream_bytes_;  ///< all-reduce results at least this big are written with streaming stores
  std::unique_ptr<RankLock> lock_;  ///< held while this communicator lives: peers test it

  uint32_t phase_ = 0;  ///< last step this rank published
  uint64_t coll_ = 0;   ///< collectives issued (descriptor ring index)
  int subgroups_ = 0;   ///< new_group calls so far (same on every rank)
  std::vector<uint32_t> send_head_;  ///< per destination: chunks sent
  std::vector<uint32_t> recv_tail_;  ///< per source: chunks received
  std::vector<const void*> srcs_;    ///< scratch: reduction sources in rank order (no per-op malloc)
  std::vector<char> scratch_;        ///< one piece of a streamed zero-copy all-reduce
  std::exception_ptr broken_;        ///< first timeout / peer failure: later ops rethrow it
  bool zero_copy_;                   ///< alloc_buffer maps peers' memory (GZ_SHM_ZERO_COPY, default on)
  uint64_t buffers_ = 0;             ///< alloc_buffer calls so far (same on every rank)
  std::shared_ptr<SharedTable> shared_ = std::make_shared<SharedTable>();  ///< outlives us in deleters
};

// Runs one op; a timeout or a dead peer leaves the steps out of line with the peers', so it
// breaks the communicator: every later op rethrows that first error.
template <typename Fn>
void ShmCommunicator::guarded(Fn&& fn) {
  if (broken_) std::rethrow_exception(broken_);
  try {
    fn();
  } catch (const TimeoutError&) {
    broken_ = std::current_exception();
    throw;
  } catch (const PeerError&) {
    broken_ = std::current_exception();
    throw;
  }
}

}  // namespace gz::comm::shm
