// DDP communication hooks: how one bucket of flattened gradients is reduced across ranks.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/comm_stats.h"
#include "gz/torch/row_sparse.h"

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
  /// @brief Defined when the bucket holds one row-sparse gradient (RowSparseOptions: e.g. an
  /// embedding table's): `buffer` seen in the parameter's shape. The built-in hooks then call
  /// reduce_rows(); a custom hook may ignore it and reduce `buffer` like any other bucket.
  torch::Tensor rows;
  RowSparseOptions row_sparse;
  RowSparseState row_state;
  /// @brief The gradients in the bucket: views of `buffer`, back to back in this order and covering
  /// it (DDP: param-shaped). Empty means one flat tensor, `buffer` itself.
  std::vector<torch::Tensor> gradients;
  /// @brief A stable id per entry of `gradients`, the same on every rank and every step (the
  /// parameter's index): stateful hooks (error feedback, PowerSGD's Q) key their state on it, so
  /// it survives bucket rebuilds and Horovod's changing fusion groups.
  std::vector<size_t> param_ids;
};

/// @brief For hooks: bucket.rows averaged across the group with only its non-zero rows on the wire
/// (allreduce_row_sparse, full precision). Returns false (and does nothing) for a dense bucket.
bool reduce_rows(comm::Communicator& group, GradBucket& bucket);
/// @brief Bytes the last reduce_rows() of `bucket` handed to the wire: every rank's rows (index +
/// row), or the dense bucket when it went dense (for CommStats).
uint64_t rows_wire_bytes(const GradBucket& bucket);

/// @brief Reduces one bucket. Runs on the group's progress thread while backward continues; must
/// leave `buffer` = (sum over ranks) / divisor, and every rank must issue the same collectives.
using CommHook = std::function<void(comm::Communicator& group, GradBucket& bucket)>;

/// @brief Default: all-reduce (sum) in the gradients' dtype, then divide; row-sparse buckets
/// through reduce_rows(). `stats` (optional) counts the bytes it hands to the wire.
CommHook allreduce_hook(std::shared_ptr<CommStats> stats = nullptr);
/// @brief Divide, cast to float16, all-reduce in float16, cast back (half the bytes on the wire).
/// Row-sparse buckets go through reduce_rows() uncompressed (their rows are few).
CommHook fp16_compress_hook(std::shared_ptr<CommStats> stats = nullptr);
/// @brief Like fp16_compress_hook with bfloat16 (wider range, fewer mantissa bits).
CommHook bf16_compress_hook(std::shared_ptr<CommStats> stats = nullptr);
// PowerSGD, 8-bit min-max and top-k hooks (with error feedback): gz/torch/compression.h.

}  // namespace gz
