#include "torch/zero/state_codec.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <typeinfo>

#include "gz/core/error.h"

namespace gz::zero {

StateFields state_fields(torch::optim::OptimizerParamState& state) {
  namespace o = torch::optim;
  StateFields f;
  if (auto* s = dynamic_cast<o::SGDParamState*>(&state)) {
    f.tensors = {{"momentum_buffer", &s->momentum_buffer()}};
  } else if (auto* s = dynamic_cast<o::AdamParamState*>(&state)) {
    f.tensors = {{"exp_avg", &s->exp_avg()},
                 {"exp_avg_sq", &s->exp_avg_sq()},
                 {"max_exp_avg_sq", &s->max_exp_avg_sq()}};
    f.step = &s->step();
  } else if (auto* s = dynamic_cast<o::AdamWParamState*>(&state)) {
    f.tensors = {{"exp_avg", &s->exp_avg()},
                 {"exp_avg_sq", &s->exp_avg_sq()},
                 {"max_exp_avg_sq", &s->max_exp_avg_sq()}};
    f.step = &s->step();
  } else if (auto* s = dynamic_cast<o::AdagradParamState*>(&state)) {
    f.tensors = {{"sum", &s->sum()}};
    f.step = &s->step();
  } else if (auto* s = dynamic_cast<o::RMSpropParamState*>(&state)) {
    f.tensors = {{"square_avg", &s->square_avg()},
                 {"momentum_buffer", &s->momentum_buffer()},
                 {"grad_avg", &s->grad_avg()}};
    f.step = &s->step();
  } else {
    GZ_THROW(InvalidArgument, "ZeroRedundancyOptimizer: optimizer state of type ", typeid(state).name(),
             " is not one it can shard (SGD, Adam, AdamW, gz::FusedAdamW, Adagrad, RMSprop)");
  }
  return f;
}

std::unique_ptr<torch::optim::OptimizerParamState> new_state(const torch::optim::Optimizer& opt) {
  namespace o = torch::optim;
  // Subclasses first would not matter: each state type is the base optimizer's (FusedAdamW's is AdamW's).
  if (dynamic_cast<const o::SGD*>(&opt)) return std::make_unique<o::SGDParamState>();
  if (dynamic_cast<const o::Adam*>(&opt)) return std::make_unique<o::AdamParamState>();
  if (dynamic_cast<const o::AdamW*>(&opt)) return std::make_unique<o::AdamWParamState>();
  if (dynamic_cast<const o::Adagrad*>(&opt)) return std::make_unique<o::AdagradParamState>();
  if (dynamic_cast<const o::RMSprop*>(&opt)) return std::make_unique<o::RMSpropParamState>();
  GZ_THROW(InvalidArgument, "sharded checkpoint: optimizer of type ", typeid(opt).name(),
           " is not one whose state can be sharded (SGD, Adam, AdamW, gz::FusedAdamW, Adagrad, RMSprop)");
}

}  // namespace gz::zero
