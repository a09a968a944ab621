// Fashion-MNIST read straight from the IDX .gz files (Debian package dataset-fashion-mnist).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "gz/train/data/dataset.h"

namespace gz::train {

/// @brief Options of FashionMnistDataset.
struct FashionMnistOptions {
  /// @brief Folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.
  std::string root = "/usr/share/datasets/fashion-mnist";
  bool train = true;  ///< train (60,000) or test (10,000) split
  /// @brief Random horizontal flip and random 28x28 crop of the image padded by 2 (zeros), drawn
  /// from (seed, epoch, index).
  bool augment = false;
  uint64_t seed = 0;
  float mean = 0.2860f;
  float std = 0.3530f;
  int64_t input_size = 28;  ///< other sizes resize bilinearly (slower)
  int64_t channels = 1;     ///< 3 repeats the gray channel (for RGB models)
};

/// @brief All images in one contiguous uint8 tensor [N, 28, 28] loaded once; get(i) returns a
/// normalised float [C, S, S] image and the label. Thread-safe.
class FashionMnistDataset : public Dataset {
 public:
  /// @throws gz::SystemError for missing/unreadable files, gz::Error for corrupt ones (bad magic
  /// number, dimensions, truncated data, label out of range, image/label count mismatch).
  explicit FashionMnistDataset(FashionMnistOptions options);
  size_t size() const override { return static_cast<size_t>(labels_.size(0)); }
  Example get(size_t index) const override;
  void set_epoch(int64_t epoch) override { epoch_.store(epoch); }

  const torch::Tensor& images() const { return images_; }  ///< uint8 [N, 28, 28]
  const torch::Tensor& labels() const { return labels_; }  ///< int64 [N]

  /// @brief Parse one IDX file (gzip or plain): uint8 data with the given magic number and number
  /// of dimensions. Exposed for tests and tools.
  static torch::Tensor read_idx(const std::string& path, uint32_t magic, int dims);

 private:
  FashionMnistOptions options_;
  torch::Tensor images_;
  torch::Tensor labels_;
  float lut_[256];  // pixel value -> normalised float
  std::atomic<int64_t> epoch_{0};
};

}  // namespace gz::train
