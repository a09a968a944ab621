// 2x2 max pooling and ReLU in one pass, the block that follows each convolution in small CNNs.
#pragma once

#include <torch/types.h>

namespace gz {

/// @brief relu(max_pool2d(x, 2)) with kernel 2, stride 2, no padding, floor: same values and the
/// same gradients as LibTorch (the gradient goes to the first maximum of each window, none where the
/// ReLU clips).
///
/// LibTorch 1.13's CPU max_pool2d_with_indices is a generic strided loop that stores int64 indices
/// (it took a third of the Fashion-MNIST CNN's step); ReLU then costs two more passes forward and a
/// threshold_backward. Here forward reads the input once and writes the output plus one byte per
/// output; backward writes the whole input gradient once, with no zero fill and no scatter. Planes
/// are split over LibTorch's intra-op threads. Float32 CPU tensors of 3 or 4 dimensions take the
/// fused path; anything else falls back to torch::relu(torch::max_pool2d(x, 2)).
torch::Tensor max_pool2d_relu(const torch::Tensor& x);

}  // namespace gz
