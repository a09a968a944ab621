// Deep copy of parameters and buffers between two modules of the same architecture (clone_model).
#pragma once

#include <torch/nn/module.h>

namespace gz::train::model_detail {

/// @brief Give every parameter and buffer of `dst` a private copy of the same-named tensor of
/// `src` (values, dtype, device, requires_grad) and copy the train/eval mode. Throws
/// gz::InvalidArgument when the two modules do not have the same tensor names and shapes.
void copy_state(const torch::nn::Module& src, torch::nn::Module& dst);

}  // namespace gz::train::model_detail
