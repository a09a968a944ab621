// How the model is spread over processes and devices (config key `mode`): one strategy object,
// chosen once from a ParallelMode, drives the training step for the Trainer and for gz-bench.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/data_parallel.h"
#include "gz/torch/ddp.h"
#include "gz/torch/distributed_optimizer.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "gz/train/models/model.h"

namespace gz::train {

/// @brief Config key `mode` / gz-bench `--mode`.
enum class ParallelMode {
  single,   ///< one process, no communication
  ddp,      ///< DistributedDataParallel: gradients averaged during backward (optionally ZeRO)
  horovod,  ///< DistributedOptimizer: gradients negotiated by name and averaged before the step
  dp,       ///< one process, CPU replicas in threads (DataParallel)
};

/// @brief "single", "ddp", "horovod", "dp"; anything else throws gz::InvalidArgument naming them.
ParallelMode parse_parallel_mode(const std::string& name);
const char* to_string(ParallelMode mode);
/// @brief ddp and horovod: the modes that need a process group.
bool needs_group(ParallelMode mode);

/// @brief What make_strategy() builds. Only the block of the chosen mode is read.
struct StrategyOptions {
  ParallelMode mode = ParallelMode::single;
  /// @brief ddp, horovod: the group (never null there).
  comm::CommPtr group;
  DDPOptions ddp;
  /// @brief ddp: ZeRO stage (0 = plain DDP); zero.stage is set from it.
  int zero_stage = 0;
  ZeroOptions zero;
  /// @brief ddp with zero_stage 3: gz::fully_shard's options (prefetch, reshard_after_forward).
  FullyShardOptions fsdp;
  DistributedOptimizerOptions horovod;
  /// @brief horovod: backward passes per optimizer step (gradient accumulation).
  int64_t accumulation = 1;
  /// @brief dp: one replica per device (devices[0] holds the model).
  std::vector<torch::Device> dp_devices;
};

/// @brief Bytes the last step exchanged for gradients (gz-bench's accounting): dense_bytes
/// all-reduced, rows_bytes = all ranks' rows (index + row) of row-sparse gradients.
struct ExchangeBytes {
  int64_t dense_bytes = 0;
  int64_t rows_bytes = 0;
};

/// @brief One training step's distribution work, whatever the mode. Call order per optimizer step:
/// zero_grad(); per micro-batch: begin_micro_step(last), forward(), backward of the loss,
/// end_micro_step(); then before_update() and optimizer().step() (or step() for both).
///
/// Built collectively (DDP and Horovod mode broadcast rank 0's parameters); destroying it aborts
/// nothing by itself: the owner aborts the group first when it gives the group up (recovery).
class ParallelStrategy {
 public:
  virtual ~ParallelStrategy() = default;
  ParallelStrategy(const ParallelStrategy&) = delete;
  ParallelStrategy& operator=(const ParallelStrategy&) = delete;

  ParallelMode mode() const { return mode_; }
  /// @brief The group (null in single and dp mode).
  const comm::CommPtr& group() const { return group_; }
  const ModelPtr& model() const { return model_; }
  /// @brief The optimizer to step: the ZeRO wrapper when sharded, else the one given.
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const std::shared_ptr<torch::optim::Optimizer>& optimizer_ptr() const { return optimizer_; }
  /// @brief The optimizer holding this rank's state: ZeRO's local optimizer (this rank's shard
  /// of flat blocks), else optimizer().
  virtual torch::optim::Optimizer& state_optimizer() { return *optimizer_; }
  /// @brief False when ranks hold different optimizer state (ZeRO shards).
  virtual bool replicated_state() const { return true; }

  virtual void zero_grad() { optimizer_->zero_grad(); }
  /// @brief Before a micro-batch's forward; `sync` false: its backward accumulates locally (DDP's
  /// no_sync, for every micro-batch of an accumulated step but the last).
  virtual void begin_micro_step(bool sync) {}
  /// @brief The model's forward in this mode (DDP's pre-forward, DP's replicas).
  virtual torch::Tensor forward(const torch::Tensor& input) { return model_->forward(input); }
  /// @brief After the micro-batch's backward (DP reduces the replicas' gradients).
  virtual void end_micro_step() {}
  /// @brief After the last backward, before clipping and the update (Horovod mode waits for the
  /// averaged gradients here).
  virtual void before_update() {}
  /// @brief before_update(), then optimizer().step().
  void step();
  /// @brief Clip the averaged gradients to a global L2 norm (ZeRO: over the owned blocks,
  /// collective); returns the norm before.
  virtual double clip_grad_norm(double max_norm);
  /// @brief Backward passes per optimizer step changed (elastic resize).
  virtual void set_accumulation(int64_t accumulation) {}
  /// @brief After a checkpoint was loaded on every rank (Horovod mode broadcasts rank 0's
  /// optimizer state: the wrapped optimizer's state is not synchronised otherwise).
  virtual void after_load() {}
  /// @brief Collective, before the main process saves optimizer() (ZeRO gathers its shards there).
  virtual void before_save() {}
  /// @brief Wait for asynchronous parameter updates (ZeRO's all-gathers) to land.
  virtual void synchronize() {}
  /// @brief What the last step exchanged (zeros without communication).
  virtual ExchangeBytes last_exchange() const { return {}; }
  /// @brief ZeRO: this rank's averaged gradient blocks; empty otherwise.
  virtual std::vector<torch::Tensor> gradient_blocks() const { return {}; }
  /// @brief ZeRO stage 3: the flat shards that hold this rank's parameters between steps (the
  /// model's own parameters hold no memory then); empty where the model's parameters are whole.
  virtual std::vector<torch::Tensor> parameter_shards() const { return {}; }
  /// @brief DDP: the wrapper (for comm hooks, join); null in other modes.
  virtual DistributedDataParallel* ddp() { return nullptr; }

 protected:
  ParallelStrategy(ParallelMode mode, comm::CommPtr group, ModelPtr model,
                   std::shared_ptr<torch::optim::Optimizer> optimizer)
      : mode_(mode), group_(std::move(group)), model_(std::move(model)), optimizer_(std::move(optimizer)) {}
  ParallelMode mode_;
  comm::CommPtr group_;
  ModelPtr model_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
};

/// @brief Build the strategy of options.mode around `model` (already on its device) and
/// `optimizer` (over the model's parameters). Collective in ddp and horovod mode. Throws
/// gz::InvalidArgument when the mode needs a group and has none, or zero_stage without ddp.
std::unique_ptr<ParallelStrategy> make_strategy(const StrategyOptions& options, ModelPtr model,
                                                std::shared_ptr<torch::optim::Optimizer> optimizer);

}  // namespace gz::train
