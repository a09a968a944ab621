// The strategy of mode ddp with zero_stage 3 (gz::fully_shard): what the trainer and gz-bench ask
// of it beyond ParallelStrategy. Kept beside ParallelStrategy rather than as more of its virtual
// hooks so that adding it rebuilt only its users; folding it in is mechanical.
#pragma once

#include <memory>

#include "gz/torch/fully_shard.h"
#include "gz/train/parallel_strategy.h"

namespace gz::train {

/// @brief What a zero_stage 3 strategy adds: its parameters hold no memory outside a step.
class FsdpHooks {
 public:
  virtual ~FsdpHooks() = default;
  /// @brief Collective: make the model's parameters whole for reading outside a training step
  /// (evaluation, saving); the next training forward shards them again.
  virtual void gather_model() = 0;
  /// @brief Around loading a checkpoint into model() and optimizer() (every rank loads the same):
  /// begin (collective) makes both whole, end cuts them into this rank's shards again.
  virtual void begin_load() = 0;
  virtual void end_load() = 0;
  virtual FullyShardedDataParallel& fsdp() = 0;
};

/// @brief The zero_stage 3 hooks of `s`, or null when it is another strategy.
inline FsdpHooks* fsdp_hooks(ParallelStrategy& s) { return dynamic_cast<FsdpHooks*>(&s); }

/// @brief make_strategy()'s choice for mode ddp with zero_stage 3. Collective.
std::unique_ptr<ParallelStrategy> make_fsdp_strategy(const StrategyOptions& o, ModelPtr model,
                                                     std::shared_ptr<torch::optim::Optimizer> opt);

}  // namespace gz::train
