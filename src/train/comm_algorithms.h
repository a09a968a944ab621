// The Trainer's communication algorithms: gradient compression (DDP hook or Horovod compressor),
// local SGD and asynchronous model averaging, built from the config's compression: and averaging:
// blocks, with one byte counter for all of them.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "gz/comm/communicator.h"
#include "gz/torch/async_model_averager.h"
#include "gz/torch/comm_hooks.h"
#include "gz/torch/comm_stats.h"
#include "gz/torch/distributed_optimizer.h"
#include "gz/torch/local_sgd.h"
#include "gz/train/config.h"

namespace gz::train {

class CommAlgorithms {
 public:
  /// @brief The DDP hook: compression.method's, or post-local SGD's when averaging is on.
  CommHook ddp_hook(const TrainConfig& c);
  /// @brief Horovod mode's options with compression.method's compressor.
  DistributedOptimizerOptions horovod_options(const TrainConfig& c);
  /// @brief Collective: the model averager averaging.method asks for (none: nothing).
  void build_averager(const TrainConfig& c, torch::nn::Module& model, const comm::CommPtr& group);
  /// @brief After every optimizer step.
  void after_step();
  /// @brief Collective: make every rank's model the same (averaging on) before evaluating.
  void sync_replicas();
  /// @brief Whether sync_replicas() may write into the model's parameters (an averager is on).
  bool averages() const { return local_sgd_ || async_; }
  /// @brief Bytes handed to collectives for gradients / parameters since construction.
  uint64_t bytes() const { return stats_->bytes.load(); }
  /// @brief The counter behind bytes(), for other gradient traffic (ZeRO's).
  const std::shared_ptr<CommStats>& stats() const { return stats_; }

 private:
  std::shared_ptr<CommStats> stats_ = std::make_shared<CommStats>();
  std::unique_ptr<PeriodicModelAverager> local_sgd_;
  std::unique_ptr<AsyncModelAverager> async_;
};

}  // namespace gz::train
