#include "gz/train/data_loader.h"

#include <torch/torch.h>

#include "gz/core/error.h"

namespace gz::train {

DataLoader::DataLoader(DatasetPtr dataset, std::vector<std::vector<size_t>> batches, int num_workers,
                       Transform transform, int prefetch)
    : dataset_(std::move(dataset)), batches_(std::move(batches)), transform_(std::move(transform)),
      prefetch_(static_cast<size_t>(std::max(1, prefetch))) {
  GZ_CHECK_ARG(dataset_ != nullptr, "DataLoader needs a dataset");
  for (int i = 0; i < num_workers; ++i) workers_.emplace_back([this] { worker(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

Batch DataLoader::collate(const std::vector<Example>& examples) {
  GZ_CHECK_ARG(!examples.empty(), "empty batch");
  std::vector<torch::Tensor> inputs;
  std::vector<int64_t> labels;
  inputs.reserve(examples.size());
  for (const auto& e : examples) {
    inputs.push_back(e.input);
    labels.push_back(e.label);
  }
  Batch b;
  b.input = torch::stack(inputs);
  b.label = torch::tensor(labels, torch::kInt64);
  return b;
}

Batch DataLoader::build(size_t i) const {
  std::vector<Example> examples;
  examples.reserve(batches_[i].size());
  for (size_t idx : batches_[i]) {
    Example e = dataset_->get(idx);
    if (transform_) e = transform_(std::move(e), idx);
    examples.push_back(std::move(e));
  }
  return collate(examples);
}

void DataLoader::worker() {
  for (;;) {
    size_t i;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (next_to_build_ < batches_.size() && next_to_build_ < next_to_return_ + prefetch_); });
      if (stop_) return;
      i = next_to_build_++;
    }
    Batch b;
    std::exception_ptr err;
    try {
      b = build(i);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err) errors_[i] = err;
      else ready_[i] = std::move(b);
    }
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  if (next_to_return_ >= batches_.size()) return std::nullopt;
  if (workers_.empty()) return build(next_to_return_++);
  std::unique_lock<std::mutex> lock(mu_);
  size_t i = next_to_return_;
  cv_.wait(lock, [&] { return ready_.count(i) || errors_.count(i); });
  if (errors_.count(i)) {
    auto err = errors_[i];
    errors_.erase(i);
    ++next_to_return_;
    cv_.notify_all();
    std::rethrow_exception(err);
  }
  Batch b = std::move(ready_[i]);
  ready_.erase(i);
  ++next_to_return_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace gz::train
