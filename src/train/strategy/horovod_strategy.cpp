// mode horovod: gradients negotiated by name and averaged (DistributedOptimizer) before the step;
// parameters (and, after a load, the optimizer state) broadcast from rank 0.
#include "strategies.h"

namespace gz::train {

namespace {

class HorovodStrategy : public ParallelStrategy {
 public:
  HorovodStrategy(const StrategyOptions& o, ModelPtr model, std::shared_ptr<torch::optim::Optimizer> opt)
      : ParallelStrategy(ParallelMode::horovod, o.group, std::move(model), std::move(opt)) {
    NamedParameters named;
    for (auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
    broadcast_parameters(*model_, 0, group_);
    DistributedOptimizerOptions ho = o.horovod;
    ho.backward_passes_per_step = static_cast<int>(o.accumulation);
    hvd_ = std::make_unique<DistributedOptimizer>(optimizer_, std::move(named), ho, group_);
  }

  void zero_grad() override { hvd_->zero_grad(); }
  void before_update() override { hvd_->synchronize(); }
  void set_accumulation(int64_t accumulation) override {
    hvd_->set_backward_passes_per_step(static_cast<int>(accumulation));
  }
  void after_load() override { broadcast_optimizer_state(*optimizer_, 0, group_); }
  ExchangeBytes last_exchange() const override {
    ExchangeBytes b;
    for (auto& it : model_->named_parameters()) {
      const auto& p = it.value();
      const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
      const int64_t rows = hvd_->last_rows_exchanged(it.key());
      if (rows < 0)
        b.dense_bytes += bytes;
      else
        b.rows_bytes += rows * (bytes / std::max<int64_t>(p.size(0), 1) + 8);
    }
    return b;
  }

 private:
  std::unique_ptr<DistributedOptimizer> hvd_;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_horovod_strategy(const StrategyOptions& o, ModelPtr model,
                                                        std::shared_ptr<torch::optim::Optimizer> opt) {
  return std::make_unique<HorovodStrategy>(o, std::move(model), std::move(opt));
}

}  // namespace gz::train
