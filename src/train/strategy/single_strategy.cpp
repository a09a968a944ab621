// mode single: the model and optimizer as they are.
#include "strategies.h"

namespace gz::train {

namespace {
class SingleStrategy : public ParallelStrategy {
 public:
  SingleStrategy(ModelPtr model, std::shared_ptr<torch::optim::Optimizer> opt)
      : ParallelStrategy(ParallelMode::single, nullptr, std::move(model), std::move(opt)) {}
};
}  // namespace

std::unique_ptr<ParallelStrategy> make_single_strategy(ModelPtr model,
                                                       std::shared_ptr<torch::optim::Optimizer> opt) {
  return std::make_unique<SingleStrategy>(std::move(model), std::move(opt));
}

}  // namespace gz::train
