// mode ddp: DistributedDataParallel, optionally with ZeRO sharding the optimizer state (stage 1)
// and the gradients (stage 2).
#include <optional>

#include "gz/core/phase.h"
#include "strategies.h"

namespace gz::train {

namespace {

class DdpStrategy : public ParallelStrategy {
 public:
  DdpStrategy(const StrategyOptions& o, ModelPtr model, std::shared_ptr<torch::optim::Optimizer> opt)
      : ParallelStrategy(ParallelMode::ddp, o.group, std::move(model), std::move(opt)) {
    // Broadcasts rank 0's parameters and buffers (collective).
    ddp_ = std::make_unique<DistributedDataParallel>(model_, group_, o.ddp);
    if (o.zero_stage > 0) {  // the optimizer steps this rank's shard; checkpoints stay whole
      ZeroOptions zo = o.zero;
      zo.stage = o.zero_stage;
      zero_ = std::make_shared<ZeroRedundancyOptimizer>(*ddp_, optimizer_, zo);
      optimizer_ = zero_;
    }
  }
  ~DdpStrategy() override {
    no_sync_.reset();
    optimizer_.reset();
    zero_.reset();  // holds a reference to the DDP object: goes first
    ddp_.reset();
  }

  torch::optim::Optimizer& state_optimizer() override {
    return zero_ ? zero_->local_optimizer() : *optimizer_;
  }
  bool replicated_state() const override { return !zero_; }
  void begin_micro_step(bool sync) override {
    if (!sync) no_sync_.emplace(ddp_->reducer());
  }
  torch::Tensor forward(const torch::Tensor& input) override {
    return ddp_->forward([&] { return model_->forward(input); });
  }
  void end_micro_step() override { no_sync_.reset(); }
  double clip_grad_norm(double max_norm) override {
    // ZeRO: only the owned gradient blocks are averaged.
    if (!zero_) return ParallelStrategy::clip_grad_norm(max_norm);
    gz::ScopedPhase waiting(gz::Phase::comm);  // collective: the norm over every rank's blocks
    return zero_->clip_grad_norm_(max_norm);
  }
  void before_save() override {
    if (zero_) zero_->consolidate_state_dict(0);  // collective: rank 0 saves the whole state
  }
  void synchronize() override {
    if (!zero_) return;
    // Waiting for the other ranks' all-gathers: comm, or the straggler report would count the
    // fast ranks' wait for a slow one as their optimizer time.
    gz::ScopedPhase waiting(gz::Phase::comm);
    zero_->synchronize();  // the last step's parameter all-gathers
  }
  ExchangeBytes last_exchange() const override {
    ExchangeBytes b;
    const auto& red = ddp_->reducer();
    for (size_t i = 0; i < red.params().size(); ++i) {
      const auto& p = red.params()[i];
      const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
      const int64_t rows = red.last_rows_exchanged(i);
      if (rows < 0)
        b.dense_bytes += bytes;
      else
        b.rows_bytes += rows * (bytes / std::max<int64_t>(p.size(0), 1) + 8);
    }
    return b;
  }
  std::vector<torch::Tensor> gradient_blocks() const override {
    return zero_ ? zero_->local_gradients() : std::vector<torch::Tensor>{};
  }
  DistributedDataParallel* ddp() override { return ddp_.get(); }

 private:
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::shared_ptr<ZeroRedundancyOptimizer> zero_;
  std::optional<DistributedDataParallel::NoSyncGuard> no_sync_;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_ddp_strategy(const StrategyOptions& o, ModelPtr model,
                                                    std::shared_ptr<torch::optim::Optimizer> opt) {
  return std::make_unique<DdpStrategy>(o, std::move(model), std::move(opt));
}

}  // namespace gz::train
