#include "gz/train/data/collate.h"

#include <torch/torch.h>

#include "gz/core/error.h"

namespace gz::train {

Batch collate(const std::vector<Example>& examples) {
  if (examples.empty()) GZ_THROW(InvalidArgument, "collate: no examples");
  const auto& first = examples.front().input;
  std::vector<torch::Tensor> inputs;
  inputs.reserve(examples.size());
  std::vector<int64_t> labels;
  labels.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& x = examples[i].input;
    if (!x.defined() || x.sizes() != first.sizes() || x.scalar_type() != first.scalar_type())
      GZ_THROW(InvalidArgument, "collate: example ", i, " has ",
               x.defined() ? detail::concat(x.scalar_type(), " ", x.sizes()) : std::string("no input"),
               ", example 0 has ", first.scalar_type(), " ", first.sizes());
    inputs.push_back(x);
    labels.push_back(examples[i].label);
  }
  Batch b;
  b.input = torch::stack(inputs);
  b.label = torch::tensor(labels, torch::kLong);
  return b;
}

}  // namespace gz::train
