// DDP communication hooks: how one bucket of flattened gradients is reduced across ranks.
#pragma once

#include <torch/types.h>

#include <functional>

#include "gz/comm/communicator.h"

namespace gz {

/// @brief One bucket of gradients handed to a communication hook.
struct GradBucket {
  size_t index = 0;
  /// @brief Flat contiguous gradients of this bucket (one dtype); reduced in place.
  torch::Tensor buffer;
  /// @brief Number of ranks contributing (world size, or the active ranks under DDP join()).
  double divisor = 1;
  /// @brief Scratch the hook owns, kept across steps (e.g. the fp16 copy), so hooks do not allocate
  /// every step.
  torch::Tensor state;
};

/// @brief Reduces one bucket. Runs on the group's progress thread while backward continues; must
/// leave `buffer` = (sum over ranks) / divisor, and every rank must issue the same collectives.
using CommHook = std::function<void(comm::Communicator& group, GradBucket& bucket)>;

/// @brief Default: all-reduce (sum) in the gradients' dtype, then divide.
CommHook allreduce_hook();
/// @brief Divide, cast to float16, all-reduce in float16, cast back (half the bytes on the wire).
CommHook fp16_compress_hook();
/// @brief Like fp16_compress_hook with bfloat16 (wider range, fewer mantissa bits).
CommHook bf16_compress_hook();

}  // namespace gz
