// Opt-in interface of models that name their fully sharded units (zero_stage 3).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <vector>

namespace gz::train {

/// @brief A model (ModelImpl) that also derives from this names the submodules fully sharded
/// training (zero_stage 3) gathers one at a time; each must run through gz::run_unit() in the
/// model's forward (bert_small: its encoder blocks). Models without it get units picked by size
/// among the modules their forward runs through gz::run_unit().
class ShardUnits {
 public:
  virtual ~ShardUnits() = default;
  /// @brief The units, in the order forward runs them.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> shard_units() const = 0;
};

}  // namespace gz::train
