// Dropout in one pass over memory, with the mask recomputed in backward instead of stored.
#pragma once

#include <torch/types.h>

namespace gz {

/// @brief Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
///
/// Same distribution as torch::dropout, different random stream. LibTorch's CPU dropout draws a
/// Bernoulli tensor element by element (mt19937), divides it and multiplies (four passes and a saved
/// mask). Here the keep bit of element i is a counter-based hash of (seed, i): one pass forward, one
/// backward, no mask in memory. The seed comes from LibTorch's default CPU generator, so
/// torch::manual_seed makes runs repeatable. Float32 CPU tensors take the fused path; anything else
/// falls back to torch::dropout. Identity when !training or p == 0.
torch::Tensor fused_dropout(const torch::Tensor& input, double p, bool training);

}  // namespace gz
