// The trainer tests' smallest model: two linear layers over the flattened input (16 features, 4
// classes), built the same way each time so runs from one seed start alike.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "gz/train/models/model.h"

namespace gz::test {

struct TinyNetImpl : gz::train::ModelImpl {
  TinyNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 24));
    fc2 = register_module("fc2", torch::nn::Linear(24, 4));
  }
  torch::Tensor forward(torch::Tensor x) override {
    return fc2->forward(torch::relu(fc1->forward(x.reshape({x.size(0), -1}))));
  }
  std::shared_ptr<gz::train::ModelImpl> clone_model() const override { return nullptr; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace gz::test
