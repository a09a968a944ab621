#include "gz/train/dataset_factory.h"

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/train/data/factory.h"
#include "gz/train/synthetic_dataset.h"

namespace gz::train {

namespace {

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
