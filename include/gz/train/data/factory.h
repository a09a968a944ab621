// The one dataset factory: create_dataset() builds a file-backed dataset from DataOptions;
// make_datasets() is the Trainer's entry (config fields -> train/test pair, synthetic included).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gz/torch/sharded_line_reader.h"
#include "gz/train/data/dataset.h"
#include "gz/train/data/image_io.h"

namespace gz::train {

/// @brief What to load. Fields a kind does not use are ignored.
struct DataOptions {
  std::string kind = "fashion_mnist";  ///< fashion_mnist | image_folder | text_lines
  /// @brief fashion_mnist: folder of the IDX .gz files (empty = /usr/share/datasets/fashion-mnist).
  /// image_folder: root with one folder per class, or with <split>/ sub-folders.
  /// text_lines: a file, a comma-separated list of files, or a folder with <split>.tsv or <split>.txt.
  std::string path;
  std::string split = "train";  ///< train | test
  bool augment = false;         ///< random flip / crop (images)
  uint64_t seed = 0;            ///< augmentation seed (with epoch and index)
  int64_t input_size = 0;       ///< image side or sequence length; 0 = 28 / 224 / 128 by kind
  int64_t channels = 0;         ///< image channels; 0 = 1 for fashion_mnist, 3 for image_folder
  std::vector<float> mean;      ///< normalisation; empty = the kind's default
  std::vector<float> std;
  int64_t resize = 0;           ///< image_folder: shorter side before the crop (0 = input_size)
  int64_t max_image_bytes = kDefaultMaxImageBytes;  ///< image_folder: decoded size cap (read_image())
  size_t max_line_bytes = kDefaultMaxLineBytes;      ///< text_lines: longest line accepted
  int64_t vocab_size = 30522;   ///< text_lines
  int64_t num_classes = 0;      ///< text_lines: > 0 validates labels
};

/// @brief Build the dataset described by `options`.
/// @throws gz::InvalidArgument for an unknown kind or split; the dataset's own errors otherwise.
DatasetPtr create_dataset(const DataOptions& options);

/// @brief What the trainer config says about the data (see make_datasets()).
struct DataSpec {
  std::string dataset;     ///< fashion_mnist, image_folder, text_lines, synthetic
  std::string train_data;  ///< path (synthetic: sample count, default 2048)
  std::string test_data;   ///< path (synthetic: sample count, default 512)
  int64_t input_size = 28;
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  uint64_t seed = 42;
};

/// @brief (train, test) datasets for the Trainer: "synthetic" here, the other kinds through
/// create_dataset(); test may be null when test_data is empty. Throws gz::InvalidArgument for
/// unknown datasets, gz::Error for unreadable files.
std::pair<DatasetPtr, DatasetPtr> make_datasets(const DataSpec& spec);
/// @brief The first `n` samples of `base`.
DatasetPtr limit_dataset(DatasetPtr base, size_t n);

}  // namespace gz::train
