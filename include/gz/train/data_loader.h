// Ordered, deterministic batch prefetching on worker threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gz/train/data/dataset.h"

namespace gz::train {

/// @brief Builds batch i from the dataset samples `batches[i]`, on `num_workers` threads, and
/// hands them out strictly in order; the result never depends on thread timing.
class DataLoader {
 public:
  /// @brief transform(example, sample_index) may augment (must be deterministic in its arguments).
  using Transform = std::function<Example(Example, size_t)>;

  /// @brief num_workers == 0 builds each batch on the caller's thread. `prefetch` batches at most
  /// are built ahead of the consumer.
  DataLoader(DatasetPtr dataset, std::vector<std::vector<size_t>> batches, int num_workers,
             Transform transform = nullptr, int prefetch = 4);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// @brief The next batch in order, or nullopt after the last. Rethrows a worker's exception.
  std::optional<Batch> next();
  size_t size() const { return batches_.size(); }

  /// @brief Stack examples into a Batch (inputs along dim 0, labels int64 [N]).
  static Batch collate(const std::vector<Example>& examples);

 private:
  Batch build(size_t i) const;
  void worker();

  DatasetPtr dataset_;
  std::vector<std::vector<size_t>> batches_;
  Transform transform_;
  size_t prefetch_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_to_build_ = 0;
  size_t next_to_return_ = 0;
  std::map<size_t, Batch> ready_;
  std::map<size_t, std::exception_ptr> errors_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace gz::train
