// The trainer's bridge to datasets: "synthetic" here, the rest through create_dataset().
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "gz/train/data/dataset.h"

namespace gz::train {

/// @brief What the config says about the data.
struct DataSpec {
  std::string dataset;     ///< fashion_mnist, image_folder, text_lines, synthetic
  std::string train_data;  ///< path (synthetic: sample count, default 2048)
  std::string test_data;   ///< path (synthetic: sample count, default 512)
  int64_t input_size = 28;
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  uint64_t seed = 42;
};

/// @brief (train, test) datasets; test may be null when test_data is empty. Throws
/// gz::InvalidArgument for unknown datasets, gz::Error for unreadable files.
std::pair<DatasetPtr, DatasetPtr> make_datasets(const DataSpec& spec);
/// @brief The first `n` samples of `base`.
DatasetPtr limit_dataset(DatasetPtr base, size_t n);

}  // namespace gz::train
