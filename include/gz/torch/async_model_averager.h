// Asynchronous model averaging (as Bagua's async model average): the parameters are averaged in
// the background while training goes on, with a bound on how stale the averaged model may be.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/comm_stats.h"

namespace gz {

namespace averaging {
class FlatTensors;
}

/// @brief Knobs of AsyncModelAverager.
struct AsyncAveragingOptions {
  /// @brief S, the staleness bound in optimizer steps (see AsyncModelAverager). 0 = every step
  /// waits for an average of that very step (synchronous).
  int64_t max_staleness = 4;
  /// @brief No rounds during the first W steps (pair with post_local_sgd_hook(W): plain DDP until
  /// then, so every rank starts the asynchronous phase from the same model).
  int64_t warmup_steps = 0;
  /// @brief Also average floating-point buffers; integer buffers are left alone.
  bool average_buffers = true;
  /// @brief Counts the bytes each round hands to its all-reduces (optional).
  std::shared_ptr<CommStats> stats;
};

/// @brief Averages parameters across a group in the background, never on the training thread's
/// critical path unless the staleness bound says so.
///
/// A round: at a step boundary step() copies the parameters into a snapshot and hands the round to
/// the averager's own communicator (a new_group of the same ranks, so its collectives never
/// interleave with the training thread's), whose progress thread all-reduces the snapshot (avg)
/// and the snapshot's step (min) while this rank trains on. A later step() folds the finished
/// round in, keeping the local progress made meanwhile: param += average - snapshot, and starts
/// the next round. Only the training thread touches the parameters, between optimizer steps, so
/// autograd never sees them change under it.
///
/// Staleness bound: let m be the smallest step, over all ranks, at which the snapshots of the last
/// folded round were taken. When step() returns after this rank's t-th step, t - m <= max_staleness:
/// the model every rank trains on holds every rank's parameters from at most S steps ago. step()
/// blocks (waits for the round in flight, folds, starts another) until that holds. A rank therefore
/// never runs more than S steps ahead of the slowest one.
///
/// Every rank must call step() once per optimizer step and synchronize() at the same steps (before
/// evaluating, saving or stopping); without synchronize() the replicas differ.
class AsyncModelAverager {
 public:
  /// @brief Collective: creates the averager's communicator and buffers. Assumes every rank starts
  /// from the same parameters (DDP broadcasts them), or warmup_steps of DDP.
  AsyncModelAverager(torch::nn::Module& module, comm::CommPtr group, AsyncAveragingOptions options = {});
  AsyncModelAverager(std::vector<torch::Tensor> params, std::vector<torch::Tensor> buffers,
                     comm::CommPtr group, AsyncAveragingOptions options = {});
  /// @brief A round still in flight (no synchronize() after the last step) is aborted: peers then
  /// fail with gz::Aborted rather than wait for it to time out. No round outlives the averager,
  /// nor a step() or synchronize() that threw.
  ~AsyncModelAverager();
  AsyncModelAverager(const AsyncModelAverager&) = delete;
  AsyncModelAverager& operator=(const AsyncModelAverager&) = delete;

  /// @brief Call after every optimizer step: folds a finished round in and starts the next one;
  /// waits only to keep the staleness bound. Rethrows a failed round's error.
  void step();
  /// @brief Collective: finish the rounds in flight and give every rank the same parameters (the
  /// average of all ranks' current ones). The next step() starts a new round.
  void synchronize();

  int64_t steps() const { return step_; }
  /// @brief t - m (see the class comment) now.
  int64_t staleness() const { return step_ - folded_step_; }
  /// @brief m: the oldest rank step the model holds (the warm-up length before any round).
  int64_t folded_step() const { return folded_step_; }
  /// @brief Rounds folded in so far.
  int64_t rounds() const { return rounds_; }
  /// @brief Times step() had to wait for a round to keep the bound.
  int64_t waits() const { return waits_; }

 private:
  void post(bool syncing);
  // Wait for the round in flight and apply it; returns whether every rank was synchronising.
  bool fold();

  comm::CommPtr comm_;
  AsyncAveragingOptions options_;
  std::unique_ptr<averaging::FlatTensors> flat_;  // on comm_; reduced in place by the rounds
  std::vector<torch::Tensor> snapshot_;           // per flat buffer: what this rank sent
  std::vector<int64_t> header_;                   // {step, syncing}: min over ranks
  comm::WorkPtr work_;
  int64_t step_ = 0;
  int64_t folded_step_ = 0;
  int64_t rounds_ = 0;
  int64_t waits_ = 0;
};

}  // namespace gz
