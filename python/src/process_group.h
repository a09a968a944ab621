// torch.distributed backend "gz": a c10d process group (LibTorch 1.x) / c10d backend (2.x) over
// our Communicator. CPU tensors only. Every op runs on the communicator's progress thread in
// issue order (Communicator::submit) and completes both our Work and a c10::ivalue::Future.
#pragma once

#include <ATen/core/ivalue.h>

#include <chrono>
#include <atomic>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "torch_compat.h"

namespace gz::python {

/// @brief A c10d Work over our Work; its future carries the op's output tensors.
class GzWork : public ::c10d::Work {
 public:
  GzWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs);
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

 private:
  friend class ProcessGroupGz;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  gz::comm::WorkPtr work_;
  int source_rank_ = -1;
};

/// @brief Options of the "gz" process group beyond what torch's creator passes.
struct GzGroupOptions {
  /// @brief Our backend: "auto" (GZ_BACKEND overrides), "shm", "gloo", "mpi", "hier".
  std::string backend = "auto";
  /// @brief Per-op deadline of ops whose c10d options leave it unset.
  std::chrono::milliseconds timeout{30 * 60 * 1000};
};

class ProcessGroupGz : public GzBackendBase {
 public:
  /// @brief Collective over `size` ranks: rendezvous through `store` and connect.
  ProcessGroupGz(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size, GzGroupOptions options);
  ~ProcessGroupGz() override;

  const std::string getBackendName() const override { return "gz"; }
  /// @brief The communicator's backend ("shm", "gloo", "hier(shm+gloo)", ...).
  std::string commBackend() const { return comm_->backend(); }
  /// @brief Abort every queued and running op (they fail with gz::Aborted) and every later one.
  void abortGroup(const std::string& reason) { comm_->abort(reason); }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::AllreduceCoalescedOptions& opts = {}) override;
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
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& outputSplitSizes,
                                                 std::vector<int64_t>& inputSplitSizes,
                                                 const ::c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts = {}) override;

 private:
  /// @brief Queue `fn` on the progress thread; the returned Work's future completes with
  /// `outputs` once fn returned (or with fn's error).
  c10::intrusive_ptr<GzWork> enqueue(::c10d::OpType type, std::vector<at::Tensor> outputs,
                                     const gz::comm::OpOptions& o, std::function<void()> fn);
  /// @brief Options with the op's absolute deadline, fixed now (at issue): `timeout` when set
  /// (> 0), else the group's.
  gz::comm::OpOptions issue(std::chrono::milliseconds timeout, int tag = 0) const;
  /// @brief Fail the futures of ops that will never run (queued when the group was aborted or
  /// destroyed) so nothing waiting on them (DDP's reducer) hangs.
  void fail_pending(const std::string& why);

  /// A future and the flag that says whether someone completed it already.
  struct Pending {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::shared_ptr<std::atomic<bool>> done;
  };

  GzGroupOptions options_;
  std::shared_ptr<gz::comm::Communicator> comm_;
  std::mutex pending_mu_;
  std::vector<Pending> pending_;
};

}  // namespace gz::python
