// Private: one factory per parallel mode (each in its own file), called by make_strategy().
#pragma once

#include <memory>

#include "gz/train/parallel_strategy.h"

namespace gz::train {

std::unique_ptr<ParallelStrategy> make_single_strategy(ModelPtr model,
                                                       std::shared_ptr<torch::optim::Optimizer> opt);
std::unique_ptr<ParallelStrategy> make_ddp_strategy(const StrategyOptions& o, ModelPtr model,
                                                    std::shared_ptr<torch::optim::Optimizer> opt);
std::unique_ptr<ParallelStrategy> make_horovod_strategy(const StrategyOptions& o, ModelPtr model,
                                                        std::shared_ptr<torch::optim::Optimizer> opt);
std::unique_ptr<ParallelStrategy> make_dp_strategy(const StrategyOptions& o, ModelPtr model,
                                                   std::shared_ptr<torch::optim::Optimizer> opt);

}  // namespace gz::train
