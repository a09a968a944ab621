// Map-style datasets: random access by index, read from any thread.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <memory>

namespace gz::train {

/// @brief One sample: input tensor (image [C, H, W] float, or token ids [T] int64) and class label.
struct Example {
  torch::Tensor input;
  int64_t label = 0;
};

/// @brief A batch: inputs stacked along dim 0 and labels [N] int64.
struct Batch {
  torch::Tensor input;
  torch::Tensor label;
  int64_t size() const { return label.defined() ? label.size(0) : 0; }
};

/// @brief Random-access dataset. get() must be thread-safe (loader workers call it concurrently).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual Example get(size_t index) const = 0;
  /// @brief Select the epoch for random augmentation (seeded by (seed, epoch, index), so results do
  /// not depend on thread scheduling). Call before the epoch's first get(); default: no-op.
  virtual void set_epoch(int64_t /*epoch*/) {}
};
using DatasetPtr = std::shared_ptr<Dataset>;

}  // namespace gz::train
