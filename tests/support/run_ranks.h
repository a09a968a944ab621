// In-process multi-rank harness: N threads, one shared MemStore, real transports.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gz/store/mem_store.h"

namespace gz::test {

/// @brief Run fn(rank, store) on `world` threads sharing one MemStore; rethrow the first failure.
inline void run_ranks(int world, const std::function<void(int, std::shared_ptr<Store>)>& fn,
                      std::shared_ptr<Store> store = nullptr) {
  if (!store) store = std::make_shared<MemStore>();
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mu;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, store);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

/// @brief World sizes every multi-rank test runs over.
inline std::vector<int> world_sizes() { return {1, 2, 3, 4, 7}; }

}  // namespace gz::test
