#include "gz/train/data/image_folder.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "gz/core/error.h"
#include "gz/train/data/image_io.h"
#include "gz/torch/data/splitmix.h"

namespace gz::train {
namespace fs = std::filesystem;
namespace {

bool is_image(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

std::vector<float> per_channel(const std::vector<float>& v, int64_t channels, const char* what) {
  if (v.size() == static_cast<size_t>(channels)) return v;
  if (v.size() == 1) return std::vector<float>(static_cast<size_t>(channels), v[0]);
  // RGB statistics for a grayscale dataset: use their average.
  if (channels == 1 && v.size() == 3) return {(v[0] + v[1] + v[2]) / 3.0f};
  GZ_THROW(InvalidArgument, "ImageFolderDataset: ", what, " has ", v.size(), " values for ", channels, " channels");
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(ImageFolderOptions options) : options_(std::move(options)) {
  auto& o = options_;
  GZ_CHECK_ARG(o.channels == 1 || o.channels == 3, "ImageFolderDataset: channels ", o.channels);
  GZ_CHECK_ARG(o.input_size > 0 && o.resize >= 0, "ImageFolderDataset: input_size ", o.input_size, ", resize ",
               o.resize);
  if (o.resize == 0) o.resize = o.input_size;
  GZ_CHECK_ARG(o.resize >= o.input_size, "ImageFolderDataset: resize ", o.resize, " < input_size ", o.input_size);
  o.mean = per_channel(o.mean, o.channels, "mean");
  o.std = per_channel(o.std, o.channels, "std");
  for (float s : o.std) GZ_CHECK_ARG(s > 0, "ImageFolderDataset: std ", s);
  GZ_CHECK_ARG(o.max_image_bytes > 0, "ImageFolderDataset: max_image_bytes ", o.max_image_bytes);
  std::error_code ec;
  if (!fs::is_directory(o.root, ec)) GZ_THROW(InvalidArgument, "ImageFolderDataset: '", o.root, "' is not a folder");
  for (const auto& entry : fs::directory_iterator(o.root))
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  std::sort(classes_.begin(), classes_.end());
  if (classes_.empty()) GZ_THROW(InvalidArgument, "ImageFolderDataset: no class sub-folders in '", o.root, "'");
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(o.root) / classes_[c]))
      if (entry.is_regular_file() && is_image(entry.path())) files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) samples_.emplace_back(std::move(f), static_cast<int64_t>(c));
  }
  if (samples_.empty()) GZ_THROW(InvalidArgument, "ImageFolderDataset: no .png/.jpg/.jpeg images under '", o.root, "'");
}

Example ImageFolderDataset::get(size_t index) const {
  if (index >= size()) GZ_THROW(InvalidArgument, "ImageFolderDataset: index ", index, " >= size ", size());
  const auto& o = options_;
  Image img = read_image(samples_[index].first, static_cast<int>(o.channels), o.max_image_bytes);
  auto x = torch::from_blob(img.pixels.data(), {img.height, img.width, img.channels}, torch::kUInt8)
               .permute({2, 0, 1})
               .to(torch::kFloat)
               .div_(255.0f)
               .unsqueeze(0);
  // Resize so that the shorter side is `resize` (aspect ratio kept).
  const double scale = static_cast<double>(o.resize) / std::min(img.height, img.width);
  const int64_t h = std::max<int64_t>(o.input_size, std::llround(img.height * scale));
  const int64_t w = std::max<int64_t>(o.input_size, std::llround(img.width * scale));
  if (h != img.height || w != img.width) {
    namespace F = torch::nn::functional;
    x = F::interpolate(x, F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false));
  }
  int64_t top = (h - o.input_size) / 2, left = (w - o.input_size) / 2;
  bool flip = false;
  if (o.augment) {
    detail::SplitMix64 rng({o.seed, static_cast<uint64_t>(epoch_.load()), index});
    top = static_cast<int64_t>(rng.below(static_cast<uint64_t>(h - o.input_size + 1)));
    left = static_cast<int64_t>(rng.below(static_cast<uint64_t>(w - o.input_size + 1)));
    flip = rng.next() & 1;
  }
  x = x.squeeze(0).slice(1, top, top + o.input_size).slice(2, left, left + o.input_size);
  if (flip) x = x.flip({2});
  auto mean = torch::tensor(o.mean).view({-1, 1, 1});
  auto std = torch::tensor(o.std).view({-1, 1, 1});
  return {((x - mean) / std).contiguous(), samples_[index].second};
}

}  // namespace gz::train
