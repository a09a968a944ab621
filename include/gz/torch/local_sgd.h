// Local SGD / periodic model averaging: every rank steps on its own gradients; every H steps the
// parameters (and floating-point buffers) are averaged. Optionally after a warm-up of plain DDP
// (post-local SGD, Lin et al. 2020, as PyTorch's PeriodicModelAverager + post_localSGD_hook).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/comm_hooks.h"
#include "gz/torch/comm_stats.h"

namespace gz {

namespace averaging {
class FlatTensors;
}

/// @brief Knobs of PeriodicModelAverager.
struct LocalSGDOptions {
  /// @brief H: average after every H-th optimizer step (1 = every step, which with SGD equals DDP).
  int64_t period = 8;
  /// @brief W: no averaging during the first W steps (pair with post_local_sgd_hook(W), which
  /// all-reduces gradients as plain DDP until then).
  int64_t warmup_steps = 0;
  /// @brief Also average floating-point buffers (batch-norm statistics); integer buffers are left.
  bool average_buffers = true;
  /// @brief Counts the bytes each average hands to the all-reduce (optional).
  std::shared_ptr<CommStats> stats;
};

/// @brief Averages a model's parameters across a group every `period` optimizer steps.
///
/// @code
///   gz::DDPOptions o;
///   o.comm_hook = gz::post_local_sgd_hook(W);          // DDP for W steps, then local gradients
///   gz::DistributedDataParallel ddp(model, group, o);
///   gz::LocalSGDOptions lo;
///   lo.period = 8;
///   lo.warmup_steps = W;
///   gz::PeriodicModelAverager avg(*model, group, lo);
///   for (...) { ...; loss.backward(); opt.step(); avg.step(); }
/// @endcode
/// Each average is one all-reduce (avg) per dtype of a flat copy of the parameters. Optimizer
/// state (momentum, Adam moments) stays local, as in PyTorch. With plain or momentum SGD and H = 1
/// the result equals DDP's (both optimizers are linear in the gradient).
class PeriodicModelAverager {
 public:
  /// @brief Parameters and buffers of `module`. Collective (allocates the flat buffer with the
  /// group); every rank passes the same shapes.
  PeriodicModelAverager(torch::nn::Module& module, comm::CommPtr group, LocalSGDOptions options = {});
  PeriodicModelAverager(std::vector<torch::Tensor> params, std::vector<torch::Tensor> buffers,
                        comm::CommPtr group, LocalSGDOptions options = {});
  ~PeriodicModelAverager();
  PeriodicModelAverager(const PeriodicModelAverager&) = delete;
  PeriodicModelAverager& operator=(const PeriodicModelAverager&) = delete;

  /// @brief Call after every optimizer step (collective when it averages). Counts the step t and
  /// averages when t > warmup_steps and (t - warmup_steps) % period == 0. Returns whether it did.
  bool step();
  /// @brief Average now, whatever the step (collective), e.g. before evaluating or saving.
  void average();
  const LocalSGDOptions& options() const { return options_; }
  /// @brief Optimizer steps counted so far.
  int64_t steps() const { return step_; }
  /// @brief Averages done so far.
  int64_t averages() const { return averages_; }
  /// @brief The step count at the last average (-1: none yet).
  int64_t last_average_step() const { return last_average_step_; }

 private:
  comm::CommPtr group_;
  LocalSGDOptions options_;
  std::unique_ptr<averaging::FlatTensors> flat_;
  int64_t step_ = 0;
  int64_t averages_ = 0;
  int64_t last_average_step_ = -1;
};

/// @brief DDP hook of post-local SGD: `warmup` (default allreduce_hook) for the first
/// `warmup_steps` synchronised backward passes, then nothing: each rank keeps its own gradient (no
/// communication; the model averager takes over).
CommHook post_local_sgd_hook(int64_t warmup_steps, CommHook warmup = {});

}  // namespace gz
