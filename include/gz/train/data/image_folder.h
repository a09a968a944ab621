// Images in one sub-folder per class (root/<class>/<image>.png|jpg|jpeg), decoded on demand.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "gz/train/data/dataset.h"
#include "gz/train/data/image_io.h"

namespace gz::train {

/// @brief Options of ImageFolderDataset.
struct ImageFolderOptions {
  std::string root;
  int64_t channels = 3;      ///< 1 = grayscale, 3 = RGB (converted on decode)
  int64_t input_size = 224;  ///< output side S: images are [channels, S, S]
  /// @brief Shorter side after the bilinear resize, before cropping S x S (0 = S, i.e. no margin).
  int64_t resize = 0;
  /// @brief Training transforms: random crop (instead of center) and random horizontal flip,
  /// drawn from (seed, epoch, index).
  bool augment = false;
  uint64_t seed = 0;
  std::vector<float> mean = {0.485f, 0.456f, 0.406f};  ///< per channel (one value = all channels)
  std::vector<float> std = {0.229f, 0.224f, 0.225f};
  /// @brief Largest decoded image accepted, width x height x channels bytes (see read_image()).
  int64_t max_image_bytes = kDefaultMaxImageBytes;
};

/// @brief Class names are the sorted sub-folder names (label = position); samples are sorted by
/// path. get() decodes (PNG via libpng, JPEG via libjpeg), resizes so the shorter side is
/// `resize`, crops S x S (center, or random with augment), flips (augment) and normalises.
class ImageFolderDataset : public Dataset {
 public:
  /// @throws gz::InvalidArgument when the root has no class folders or no images.
  explicit ImageFolderDataset(ImageFolderOptions options);
  size_t size() const override { return samples_.size(); }
  Example get(size_t index) const override;
  void set_epoch(int64_t epoch) override { epoch_.store(epoch); }

  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& path(size_t index) const { return samples_.at(index).first; }

 private:
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int64_t>> samples_;
  std::atomic<int64_t> epoch_{0};
};

}  // namespace gz::train
