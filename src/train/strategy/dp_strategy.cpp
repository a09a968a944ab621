// mode dp: one process, the model replicated on several devices (CPU replicas in threads).
#include "strategies.h"

namespace gz::train {

namespace {

class DpStrategy : public ParallelStrategy {
 public:
  DpStrategy(const StrategyOptions& o, ModelPtr model, std::shared_ptr<torch::optim::Optimizer> opt)
      : ParallelStrategy(ParallelMode::dp, nullptr, std::move(model), std::move(opt)) {
    DataParallelOptions dpo;
    dpo.devices = o.dp_devices;
    dp_ = std::make_unique<DataParallel>(
        model_,
        [](const torch::nn::Module& m, const torch::Device& d) -> std::shared_ptr<torch::nn::Module> {
          auto copy = dynamic_cast<const ModelImpl&>(m).clone_model();
          copy->to(d);
          return copy;
        },
        [](torch::nn::Module& m, const torch::Tensor& x) { return dynamic_cast<ModelImpl&>(m).forward(x); },
        dpo);
  }

  torch::Tensor forward(const torch::Tensor& input) override { return dp_->forward(input); }
  void end_micro_step() override { dp_->reduce_gradients(); }

 private:
  std::unique_ptr<DataParallel> dp_;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_dp_strategy(const StrategyOptions& o, ModelPtr model,
                                                   std::shared_ptr<torch::optim::Optimizer> opt) {
  return std::make_unique<DpStrategy>(o, std::move(model), std::move(opt));
}

}  // namespace gz::train
