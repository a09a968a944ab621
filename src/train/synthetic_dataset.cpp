#include "gz/train/synthetic_dataset.h"

#include <torch/torch.h>

#include <random>

#include "gz/core/error.h"

namespace gz::train {

SyntheticDataset::SyntheticDataset(size_t size, int64_t num_classes, std::vector<int64_t> shape, uint64_t seed,
                                   double noise)
    : size_(size), classes_(num_classes), shape_(std::move(shape)), seed_(seed), noise_(noise) {
  GZ_CHECK_ARG(num_classes >= 2, "synthetic dataset needs >= 2 classes");
  GZ_CHECK_ARG(!shape_.empty(), "synthetic dataset needs a shape");
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  std::mt19937_64 rng(seed ^ 0x5eed5eedULL);
  std::normal_distribution<float> normal(0.f, 1.f);
  prototypes_.assign(num_classes, std::vector<float>(n));
  for (auto& p : prototypes_)
    for (auto& v : p) v = normal(rng);
}

Example SyntheticDataset::get(size_t index) const {
  if (index >= size_) GZ_THROW(InvalidArgument, "synthetic dataset index ", index, " >= size ", size_);
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + index);
  std::normal_distribution<float> normal(0.f, static_cast<float>(noise_));
  Example e;
  e.label = static_cast<int64_t>((index * 7919 + seed_) % classes_);
  const auto& proto = prototypes_[e.label];
  std::vector<float> data(proto.size());
  for (size_t i = 0; i < data.size(); ++i) data[i] = proto[i] + normal(rng);
  e.input = torch::from_blob(data.data(), shape_, torch::kFloat32).clone();
  return e;
}

}  // namespace gz::train
