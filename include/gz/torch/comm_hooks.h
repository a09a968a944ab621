// DDP communication hooks: how one bucket of flattened gradients is reduced across ranks.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/comm_stats.h"

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
  /// @brief The gradients in the bucket: views of `buffer`, back to back in this order and covering
  /// it (DDP: param-shaped). Empty means one flat tensor, `buffer` itself.
  std::vector<torch::Tensor> gradients;
  /// @brief A stable id per entry of `gradients`, the same on every rank and every step (the
  /// parameter's index): stateful hooks (error feedback, PowerSGD's Q) key their state on it, so
  /// it survives bucket rebuilds and Horovod's changing fusion groups.
  std::vector<size_t> param_ids;
};

/// @brief Reduces one bucket. Runs on the group's progress thread while backward continues; must
/// leave `buffer` = (sum over ranks) / divisor, and every rank must issue the same collectives.
using CommHook = std::function<void(comm::Communicator& group, GradBucket& bucket)>;

/// @brief Default: all-reduce (sum) in the gradients' dtype, then divide. `stats` (optional) counts
/// the bytes it hands to the all-reduce.
CommHook allreduce_hook(std::shared_ptr<CommStats> stats = nullptr);
/// @brief Divide, cast to float16, all-reduce in float16, cast back (half the bytes on the wire).
CommHook fp16_compress_hook(std::shared_ptr<CommStats> stats = nullptr);
/// @brief Like fp16_compress_hook with bfloat16 (wider range, fewer mantissa bits).
CommHook bf16_compress_hook(std::shared_ptr<CommStats> stats = nullptr);
// PowerSGD, 8-bit min-max and top-k hooks (with error feedback): gz/torch/compression.h.

}  // namespace gz
