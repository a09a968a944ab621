// A deterministic, learnable in-memory dataset for tests and smoke runs (dataset: synthetic).
#pragma once

#include <cstdint>
#include <vector>

#include "gz/train/data/dataset.h"

namespace gz::train {

/// @brief Sample i: label i % classes (shuffled by seed), input = class prototype + Gaussian noise,
/// both fixed by (seed, i). Thread-safe, no files.
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(size_t size, int64_t num_classes, std::vector<int64_t> shape, uint64_t seed, double noise = 1.0);
  size_t size() const override { return size_; }
  Example get(size_t index) const override;

 private:
  size_t size_;
  int64_t classes_;
  std::vector<int64_t> shape_;
  uint64_t seed_;
  double noise_;
  std::vector<std::vector<float>> prototypes_;
};

}  // namespace gz::train
