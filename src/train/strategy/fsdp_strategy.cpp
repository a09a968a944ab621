// mode ddp with zero_stage 3: gz::fully_shard over the model's units (ShardUnits::shard_units()
// when the model has it, else picked by size); the optimizer steps this rank's flat shards.
#include "train/strategy/fsdp_strategy.h"

#include <optional>

#include "gz/core/error.h"
#include "gz/core/phase.h"
#include "gz/torch/fully_shard.h"
#include "gz/train/models/shard_units.h"

namespace gz::train {

namespace {

constexpr int64_t kMinUnitBytes = int64_t(1) << 20;  // the size policy, for models without ShardUnits

class FsdpStrategy : public ParallelStrategy, public FsdpHooks {
 public:
  FsdpStrategy(const StrategyOptions& o, ModelPtr model, std::shared_ptr<torch::optim::Optimizer> opt)
      : ParallelStrategy(ParallelMode::ddp, o.group, std::move(model), std::move(opt)) {
    auto& groups = optimizer_->param_groups();
    if (groups.size() != 1 || !optimizer_->state().empty())
      GZ_THROW(InvalidArgument, "zero_stage 3: the optimizer must have one parameter group and no state yet ",
               "(it is pointed at the parameter shards)");
    const auto* named = dynamic_cast<const ShardUnits*>(model_.get());
    auto units = named ? named->shard_units() : std::vector<std::shared_ptr<torch::nn::Module>>{};
    FullyShardOptions fo = o.fsdp;
    fo.find_unused_parameters = fo.find_unused_parameters || o.ddp.find_unused_parameters;
    // Named units run through run_unit() (ShardUnits' contract): the first forward need not gather
    // them all. Units picked by size promise nothing.
    fo.units_only_in_run_unit = !units.empty();
    if (units.empty()) units = units_by_size(model_, kMinUnitBytes);
    fsdp_ = fully_shard(model_, std::move(units), group_, fo);  // collective
    groups[0].params() = fsdp_->parameters();
  }
  ~FsdpStrategy() override {
    no_sync_.reset();
    // fully_shard gathers the parameters back into the model only if someone still holds it.
    model_.reset();
    fsdp_.reset();
  }

  bool replicated_state() const override { return false; }
  void zero_grad() override {
    fsdp_->restore_optimizer(*optimizer_);  // after a save: the shards again
    fsdp_->zero_grad();
  }
  void begin_micro_step(bool sync) override {
    if (!sync) no_sync_.emplace(*fsdp_);
  }
  torch::Tensor forward(const torch::Tensor& input) override {
    fsdp_->restore_optimizer(*optimizer_);
    return fsdp_->forward([&] { return model_->forward(input); });
  }
  void end_micro_step() override { no_sync_.reset(); }
  double clip_grad_norm(double max_norm) override {
    gz::ScopedPhase waiting(gz::Phase::comm);  // collective: the norm over every rank's shards
    return fsdp_->clip_grad_norm_(max_norm);
  }
  void gather_model() override {
    gz::ScopedPhase waiting(gz::Phase::comm);
    fsdp_->unshard();  // the next forward shards it again
  }
  // Checkpoints hold the whole model and the unsharded optimizer state (as ZeRO 1/2's), so they
  // load at any stage and world size: rank 0 saves the optimizer over the module's parameters,
  // which the next zero_grad() or forward() points back at the shards.
  void before_save() override {
    gz::ScopedPhase waiting(gz::Phase::comm);
    fsdp_->restore_optimizer(*optimizer_);
    fsdp_->unshard();
    fsdp_->unshard_optimizer(*optimizer_, 0);
  }
  void begin_load() override {
    fsdp_->restore_optimizer(*optimizer_);
    fsdp_->unshard();                           // the checkpoint's parameters are copied into them
    fsdp_->unshard_optimizer(*optimizer_, -1);  // the unsharded state loads into this
  }
  void end_load() override {
    fsdp_->reshard_module();
    fsdp_->shard_optimizer(*optimizer_);
  }
  std::vector<torch::Tensor> gradient_blocks() const override {
    std::vector<torch::Tensor> out;
    for (auto& s : fsdp_->parameters())
      if (s.grad().defined()) out.push_back(s.grad());
    return out;
  }
  std::vector<torch::Tensor> parameter_shards() const override { return fsdp_->parameters(); }
  FullyShardedDataParallel& fsdp() override { return *fsdp_; }

 private:
  std::shared_ptr<FullyShardedDataParallel> fsdp_;
  std::optional<FullyShardedDataParallel::NoSyncGuard> no_sync_;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_fsdp_strategy(const StrategyOptions& o, ModelPtr model,
                                                     std::shared_ptr<torch::optim::Optimizer> opt) {
  return std::make_unique<FsdpStrategy>(o, std::move(model), std::move(opt));
}

}  // namespace gz::train
