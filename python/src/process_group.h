// torch.distributed backend "gz": a c10d process group (LibTorch 1.x) / c10d backend (2.x) over
// our Communicator. CPU tensors only. Every op runs on the communicator's progress thread in
// issue order (Communicator::submit) and completes both the c10d Work and its Future.
//
// Files: process_group.cpp (construction, Work, all-reduce, broadcast, reduce, barrier,
// point-to-point), process_group_gather.cpp (all-gather, gather, scatter, reduce-scatter,
// all-to-all), reduce_plan.cpp (ReduceOp x dtype -> our kernels), store_adapter.cpp (torch's store
// as ours).
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"
#include "p2p_links.h"
#include "torch_compat.h"

namespace gz::python {

/// @brief A c10d Work over our Work; its future carries the op's output tensors.
///
/// Completion contract (c10d's): wait() blocks until the op finished and rethrows its failure as a
/// RuntimeError whose message names op, rank, peer and elapsed time; wait(timeout) gives up after
/// `timeout`. The future completes (or fails) on the progress thread right after the op returned.
class GzWork : public ::c10d::Work {
 public:
  GzWork(int rank, ::c10d::OpType type, const char* profiling_title, std::vector<at::Tensor> outputs);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}
  /// @brief Rethrows the op's failure. timeout 0: the op's own deadline plus Work::kGrace.
  bool wait(std::chrono::milliseconds timeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  /// @brief recv: the peer it came from.
  int sourceRank() const override;
  /// @brief Once (later calls return false): complete the c10d Work, which ends its profiler
  /// range, and the future, with the outputs or with `error`.
  bool complete(std::exception_ptr error);

 private:
  friend class ProcessGroupGz;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> completed_{false};
  gz::comm::WorkPtr work_;
  int source_rank_ = -1;
};

/// @brief Options of the "gz" process group beyond what torch's creator passes.
struct GzGroupOptions {
  /// @brief Our backend: "auto" (GZ_BACKEND overrides), "shm", "gloo", "mpi".
  std::string backend = "auto";
  /// @brief Per-op deadline of ops whose c10d options leave it unset (init_process_group's timeout).
  std::chrono::milliseconds timeout{30 * 60 * 1000};
};

/// @brief The "gz" backend: c10d's collectives on CPU tensors over one gz::comm::Communicator.
class ProcessGroupGz : public GzBackendBase {
 public:
  /// @brief Collective over `size` ranks: rendezvous through `store` (torch's, usually a
  /// PrefixStore init_process_group / new_group made) and connect.
  ProcessGroupGz(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size, GzGroupOptions options);
  ~ProcessGroupGz() override;

  const std::string getBackendName() const override { return "gz"; }
  /// @brief The communicator's backend ("shm", "gloo", "hier(shm+gloo)", ...).
  std::string commBackend() const { return comm_->backend(); }
  /// @brief The group's default per-op timeout.
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  /// @brief Abort every queued and running op (they fail with gz::Aborted) and every later one.
  void abortGroup(const std::string& reason);
  /// @brief The communicator (for the Horovod-style module and tests).
  const std::shared_ptr<gz::comm::Communicator>& communicator() const { return comm_; }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const ::c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& outputSplitSizes,
                                                 std::vector<int64_t>& inputSplitSizes,
                                                 const ::c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts = {}) override;
  /// @brief A barrier within opts.timeout whose error names the ranks that did not arrive.
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks = false) override;
  /// @brief c10d's per-group sequence number: the collectives issued so far. Every rank starts at
  /// 0 when the group is made and counts the same collectives in the same order, so the ranks agree
  /// without a handshake (point-to-point ops do not count: only two ranks take part). Nothing to
  /// set up; torch 2.x's debug wrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) calls this on every group.
  void setSequenceNumberForGroup() override {}
  /// @brief The number of collectives issued on this group so far (see setSequenceNumberForGroup).
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

 private:
  using Body = std::function<void(gz::comm::Communicator&, const gz::comm::OpOptions&)>;
  /// @brief allreduce() of a sparse COO tensor (sum, over all-gathered indices and values).
  c10::intrusive_ptr<::c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                    const ::c10d::AllreduceOptions& opts);
  /// @brief Queue `body` with the options `o` on the progress thread (collectives) or, when
  /// `p2p_peer` >= 0, on the point-to-point link to/from that peer. The returned Work's future
  /// completes with `outputs` once body returned (or with body's error).
  c10::intrusive_ptr<GzWork> enqueue(::c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                                     const gz::comm::OpOptions& o, Body body, int p2p_peer = -1,
                                     bool sending = false);
  /// @brief Options with the op's absolute deadline, fixed now (at issue): `timeout` when set
  /// (> 0), else the group's.
  gz::comm::OpOptions issue(std::chrono::milliseconds timeout, int tag = 0) const;

  GzGroupOptions options_;
  std::shared_ptr<gz::Store> store_;  ///< torch's store as ours
  std::shared_ptr<gz::comm::Communicator> comm_;
  std::unique_ptr<P2PLinks> links_;
  std::atomic<uint64_t> seq_{0};  ///< collectives issued (getSequenceNumberForGroup)
};

}  // namespace gz::python
