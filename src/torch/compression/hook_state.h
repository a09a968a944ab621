// Shared pieces of the compressing hooks: the bucket's tensors as (key, offset, shape) slices, the
// error-feedback residuals keyed by parameter, and the step count that start_step reads.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "gz/torch/comm_hooks.h"
#include "gz/torch/comm_stats.h"
#include "gz/torch/compression.h"

namespace gz::compression {

/// @brief One gradient of a bucket: where it sits in the flat buffer.
struct Slice {
  uint64_t key;  ///< the parameter id (or the bucket index, tagged, for a bucket without ids)
  int64_t offset;
  int64_t numel;
  c10::IntArrayRef sizes;
};

/// @brief The bucket's gradients in buffer order. Checks that they tile the buffer.
std::vector<Slice> slices_of(const GradBucket& bucket);

/// @brief Error feedback: per parameter, what the compression left out last step.
class Residuals {
 public:
  /// @brief buffer += residual, tensor by tensor (a new key starts at zero).
  void add_to(const GradBucket& bucket, const std::vector<Slice>& slices);
  /// @brief residual = `error` (flat, the bucket's layout), tensor by tensor.
  void store(const std::vector<Slice>& slices, const torch::Tensor& error);

 private:
  std::unordered_map<uint64_t, torch::Tensor> res_;
};

/// @brief State every compressing hook has: options, counters, step count, residuals.
struct HookState {
  HookState(const CompressionOptions& o, std::shared_ptr<CommStats> s) : options(o), stats(std::move(s)) {}
  CompressionOptions options;
  std::shared_ptr<CommStats> stats;
  Residuals residuals;
  /// @brief Steps begun: bucket 0 starts every step (DDP launches buckets in index order; Horovod
  /// mode numbers its groups from 0 each step).
  int64_t step = 0;

  /// @brief Count the step; true while start_step has not passed (the caller all-reduces plainly).
  bool begin(const GradBucket& bucket) {
    if (bucket.index == 0) ++step;
    return step <= options.start_step;
  }
  void count(const torch::Tensor& sent) {
    if (stats) stats->add(static_cast<uint64_t>(sent.numel() * sent.element_size()));
  }
};

/// @brief buffer = sum / divisor with a plain all-reduce (the warm-up steps), counted.
void plain_allreduce(comm::Communicator& group, GradBucket& bucket, HookState& state);

/// @brief A row-sparse bucket (bucket.rows defined) is averaged by the row exchange, uncompressed
/// (its rows are few; compressing them would only add error), and counted. Returns false, doing
/// nothing, for a dense bucket.
bool reduce_rows_uncompressed(comm::Communicator& group, GradBucket& bucket, HookState& state);

}  // namespace gz::compression
