#include "gz/train/data/factory.h"

#include <filesystem>
#include <sstream>

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/train/data/fashion_mnist.h"
#include "gz/train/data/image_folder.h"
#include "gz/train/data/text_lines.h"
#include "gz/train/synthetic_dataset.h"

namespace gz::train {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> text_files(const std::string& path, const std::string& split) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* ext : {".tsv", ".txt"}) {
      const auto p = fs::path(path) / (split + ext);
      if (fs::is_regular_file(p, ec)) return {p.string()};
    }
    GZ_THROW(InvalidArgument, "text_lines: no ", split, ".tsv or ", split, ".txt in '", path, "'");
  }
  std::vector<std::string> files;
  std::stringstream ss(path);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) files.push_back(item);
  if (files.empty()) GZ_THROW(InvalidArgument, "text_lines: empty path");
  return files;
}

class LimitedDataset : public Dataset {
 public:
  LimitedDataset(DatasetPtr base, size_t n) : base_(std::move(base)), n_(n) {}
  size_t size() const override { return n_; }
  Example get(size_t i) const override {
    if (i >= n_) GZ_THROW(InvalidArgument, "dataset index ", i, " >= size ", n_);
    return base_->get(i);
  }

 private:
  DatasetPtr base_;
  size_t n_;
};

size_t synthetic_count(const std::string& s, size_t fallback, const char* key) {
  if (s.empty()) return fallback;
  long long v = parse_int(s, std::string("synthetic ") + key + " (sample count)");
  if (v < 1) GZ_THROW(InvalidArgument, "synthetic ", key, " must be a positive sample count, got ", s);
  return static_cast<size_t>(v);
}

}  // namespace

DatasetPtr create_dataset(const DataOptions& o) {
  if (o.split != "train" && o.split != "test")
    GZ_THROW(InvalidArgument, "create_dataset: split '", o.split, "' (known: train, test)");
  const bool train = o.split == "train";
  if (o.kind == "fashion_mnist") {
    FashionMnistOptions f;
    if (!o.path.empty()) f.root = o.path;
    f.train = train;
    f.augment = o.augment;
    f.seed = o.seed;
    if (!o.mean.empty()) f.mean = o.mean.front();
    if (!o.std.empty()) f.std = o.std.front();
    if (o.input_size > 0) f.input_size = o.input_size;
    if (o.channels > 0) f.channels = o.channels;
    return std::make_shared<FashionMnistDataset>(f);
  }
  if (o.kind == "image_folder") {
    ImageFolderOptions f;
    std::error_code ec;
    const auto sub = fs::path(o.path) / o.split;
    f.root = fs::is_directory(sub, ec) ? sub.string() : o.path;
    f.augment = o.augment;
    f.seed = o.seed;
    if (o.input_size > 0) f.input_size = o.input_size;
    if (o.channels > 0) f.channels = o.channels;
    if (!o.mean.empty()) f.mean = o.mean;
    if (!o.std.empty()) f.std = o.std;
    f.resize = o.resize;
    f.max_image_bytes = o.max_image_bytes;
    return std::make_shared<ImageFolderDataset>(f);
  }
  if (o.kind == "text_lines") {
    TextLinesOptions t;
    t.paths = text_files(o.path, o.split);
    t.vocab_size = o.vocab_size;
    if (o.input_size > 0) t.seq_len = o.input_size;
    t.num_classes = o.num_classes;
    t.max_line_bytes = o.max_line_bytes;
    return std::make_shared<TextLinesDataset>(t);
  }
  GZ_THROW(InvalidArgument, "create_dataset: unknown kind '", o.kind, "' (known: fashion_mnist, image_folder, text_lines)");
}

std::pair<DatasetPtr, DatasetPtr> make_datasets(const DataSpec& s) {
  if (s.dataset == "synthetic") {
    std::vector<int64_t> shape{s.in_channels, s.input_size, s.input_size};
    auto train = std::make_shared<SyntheticDataset>(synthetic_count(s.train_data, 2048, "train_data"), s.num_classes,
                                                    shape, s.seed);
    // Same prototypes (seed), different samples: indices past the training set.
    auto test_n = synthetic_count(s.test_data, 512, "test_data");
    auto all = std::make_shared<SyntheticDataset>(train->size() + test_n, s.num_classes, shape, s.seed);
    struct Tail : Dataset {
      DatasetPtr base;
      size_t off, n;
      size_t size() const override { return n; }
      Example get(size_t i) const override { return base->get(off + i); }
    };
    auto test = std::make_shared<Tail>();
    test->base = all;
    test->off = train->size();
    test->n = test_n;
    return {train, test};
  }
  // Augmentation happens in the Trainer (seeded by epoch and sample), so the datasets stay plain.
  DataOptions o;
  o.kind = s.dataset;
  o.path = s.train_data;
  o.split = "train";
  o.seed = s.seed;
  o.input_size = s.input_size;
  o.channels = s.in_channels;
  if (s.dataset == "text_lines") o.num_classes = s.num_classes;
  auto train = create_dataset(o);
  DatasetPtr test;
  if (!s.test_data.empty() || s.dataset == "fashion_mnist") {
    o.path = s.test_data.empty() ? s.train_data : s.test_data;
    o.split = "test";
    test = create_dataset(o);
  }
  return {train, test};
}

DatasetPtr limit_dataset(DatasetPtr base, size_t n) {
  const size_t keep = std::min(n, base->size());
  return std::make_shared<LimitedDataset>(std::move(base), keep);
}

}  // namespace gz::train
