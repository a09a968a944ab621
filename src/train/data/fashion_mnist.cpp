#include "gz/train/data/fashion_mnist.h"

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "gz/core/error.h"
#include "gz/torch/data/splitmix.h"

namespace gz::train {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr int64_t kSide = 28;
constexpr int kPad = 2;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

// Read exactly n bytes; false on clean EOF before the first byte is not distinguished: callers check.
size_t read_some(gzFile f, void* dst, size_t n, const std::string& path) {
  size_t got = 0;
  auto* p = static_cast<char*>(dst);
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    const int r = gzread(f, p + got, chunk);
    if (r < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      GZ_THROW(Error, "Fashion-MNIST: corrupt gzip data in '", path, "': ", msg);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

torch::Tensor FashionMnistDataset::read_idx(const std::string& path, uint32_t magic, int dims) {
  // gzopen reads plain files transparently too.
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw SystemError("Fashion-MNIST: cannot open '" + path + "' (install dataset-fashion-mnist?)", errno);
  unsigned char header[4 + 4 * 3];
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(dims);
  if (read_some(f.get(), header, header_bytes, path) != header_bytes)
    GZ_THROW(Error, "Fashion-MNIST: '", path, "' is truncated (no complete IDX header)");
  auto be32 = [&](int at) {
    return uint32_t(header[at]) << 24 | uint32_t(header[at + 1]) << 16 | uint32_t(header[at + 2]) << 8 |
           uint32_t(header[at + 3]);
  };
  if (be32(0) != magic)
    GZ_THROW(Error, "Fashion-MNIST: '", path, "' has magic number 0x", std::hex, be32(0), ", expected 0x", magic);
  std::vector<int64_t> shape;
  int64_t total = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(be32(4 + 4 * d));
    total *= shape.back();
  }
  if (dims == 3 && (shape[1] != kSide || shape[2] != kSide))
    GZ_THROW(Error, "Fashion-MNIST: '", path, "' has images of ", shape[1], "x", shape[2], ", expected 28x28");
  if (shape[0] == 0 || shape[0] > 10'000'000) GZ_THROW(Error, "Fashion-MNIST: '", path, "' claims ", shape[0], " items");
  auto data = torch::empty(shape, torch::kUInt8);
  const size_t want = static_cast<size_t>(total);
  const size_t got = read_some(f.get(), data.data_ptr<uint8_t>(), want, path);
  if (got != want)
    GZ_THROW(Error, "Fashion-MNIST: '", path, "' is truncated: ", got, " of ", want, " data bytes");
  unsigned char extra;
  if (read_some(f.get(), &extra, 1, path) != 0)
    GZ_THROW(Error, "Fashion-MNIST: '", path, "' has data after the ", shape[0], " items declared in its header");
  return data;
}

FashionMnistDataset::FashionMnistDataset(FashionMnistOptions options) : options_(std::move(options)) {
  GZ_CHECK_ARG(options_.std > 0, "Fashion-MNIST: std ", options_.std);
  GZ_CHECK_ARG(options_.input_size > 0, "Fashion-MNIST: input_size ", options_.input_size);
  GZ_CHECK_ARG(options_.channels == 1 || options_.channels == 3, "Fashion-MNIST: channels ", options_.channels);
  const std::string prefix = options_.root + (options_.train ? "/train" : "/t10k");
  images_ = read_idx(prefix + "-images-idx3-ubyte.gz", kImagesMagic, 3);
  labels_ = read_idx(prefix + "-labels-idx1-ubyte.gz", kLabelsMagic, 1);
  if (images_.size(0) != labels_.size(0))
    GZ_THROW(Error, "Fashion-MNIST: ", prefix, "-*: ", images_.size(0), " images but ", labels_.size(0), " labels");
  if (labels_.max().item<int64_t>() > 9)
    GZ_THROW(Error, "Fashion-MNIST: ", prefix, "-labels-idx1-ubyte.gz has a label > 9");
  labels_ = labels_.to(torch::kLong);
  for (int v = 0; v < 256; ++v) lut_[v] = (static_cast<float>(v) / 255.0f - options_.mean) / options_.std;
}

Example FashionMnistDataset::get(size_t index) const {
  if (index >= size()) GZ_THROW(InvalidArgument, "Fashion-MNIST: index ", index, " >= size ", size());
  const uint8_t* src = images_.data_ptr<uint8_t>() + index * kSide * kSide;
  auto out = torch::empty({1, kSide, kSide}, torch::kFloat);
  float* dst = out.data_ptr<float>();
  int oy = kPad, ox = kPad;  // no shift
  bool flip = false;
  if (options_.augment) {
    detail::SplitMix64 rng({options_.seed, static_cast<uint64_t>(epoch_.load()), index});
    oy = static_cast<int>(rng.below(2 * kPad + 1));
    ox = static_cast<int>(rng.below(2 * kPad + 1));
    flip = rng.next() & 1;
  }
  // out(y, x) = padded(y + oy, x' + ox) with x' = flipped x; padded(Y, X) = src(Y - 2, X - 2) or 0.
  const float zero = lut_[0];
  for (int y = 0; y < kSide; ++y) {
    const int sy = y + oy - kPad;
    float* row = dst + y * kSide;
    if (sy < 0 || sy >= kSide) {
      std::fill(row, row + kSide, zero);
      continue;
    }
    const uint8_t* srow = src + sy * kSide;
    for (int x = 0; x < kSide; ++x) {
      const int sx = (flip ? kSide - 1 - x : x) + ox - kPad;
      row[x] = (sx >= 0 && sx < kSide) ? lut_[srow[sx]] : zero;
    }
  }
  if (options_.input_size != kSide) {
    namespace F = torch::nn::functional;
    out = F::interpolate(out.unsqueeze(0), F::InterpolateFuncOptions()
                                               .size(std::vector<int64_t>{options_.input_size, options_.input_size})
                                               .mode(torch::kBilinear)
                                               .align_corners(false))
              .squeeze(0);
  }
  if (options_.channels == 3) out = out.expand({3, -1, -1}).contiguous();
  return {out, labels_.data_ptr<int64_t>()[index]};
}

}  // namespace gz::train
