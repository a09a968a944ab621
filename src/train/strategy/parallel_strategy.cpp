// The parallel modes: parsing at the boundary, and the one factory that picks a strategy.
#include "gz/train/parallel_strategy.h"

#include <torch/nn/utils/clip_grad.h>

#include "gz/core/error.h"
#include "strategies.h"
#include "train/strategy/fsdp_strategy.h"

namespace gz::train {

namespace {
constexpr std::pair<ParallelMode, const char*> kModes[] = {
    {ParallelMode::single, "single"},
    {ParallelMode::ddp, "ddp"},
    {ParallelMode::horovod, "horovod"},
    {ParallelMode::dp, "dp"},
};
}  // namespace

ParallelMode parse_parallel_mode(const std::string& name) {
  for (const auto& [mode, text] : kModes)
    if (name == text) return mode;
  GZ_THROW(InvalidArgument, "unknown parallel mode '", name, "' (known: single, ddp, horovod, dp)");
}

const char* to_string(ParallelMode mode) {
  for (const auto& [m, text] : kModes)
    if (m == mode) return text;
  return "?";
}

bool needs_group(ParallelMode mode) { return mode == ParallelMode::ddp || mode == ParallelMode::horovod; }

void ParallelStrategy::step() {
  before_update();
  optimizer_->step();
}

double ParallelStrategy::clip_grad_norm(double max_norm) {
  return torch::nn::utils::clip_grad_norm_(model_->parameters(), max_norm);
}

std::unique_ptr<ParallelStrategy> make_strategy(const StrategyOptions& o, ModelPtr model,
                                                std::shared_ptr<torch::optim::Optimizer> optimizer) {
  GZ_CHECK_ARG(model && optimizer, "make_strategy: null model or optimizer");
  if (needs_group(o.mode) && !o.group)
    GZ_THROW(InvalidArgument, "mode '", to_string(o.mode),
             "' needs a process group: run under gzrun or call gz::init()");
  if (o.zero_stage > 0 && o.mode != ParallelMode::ddp)
    GZ_THROW(InvalidArgument, "zero_stage ", o.zero_stage, " needs mode ddp, got mode '", to_string(o.mode),
             "'");
  switch (o.mode) {
    case ParallelMode::single:
      return make_single_strategy(std::move(model), std::move(optimizer));
    case ParallelMode::ddp:
      if (o.zero_stage == 3) return make_fsdp_strategy(o, std::move(model), std::move(optimizer));
      return make_ddp_strategy(o, std::move(model), std::move(optimizer));
    case ParallelMode::horovod:
      return make_horovod_strategy(o, std::move(model), std::move(optimizer));
    case ParallelMode::dp:
      return make_dp_strategy(o, std::move(model), std::move(optimizer));
  }
  GZ_THROW(InvalidArgument, "make_strategy: bad mode");
}

}  // namespace gz::train
