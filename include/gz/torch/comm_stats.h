// Byte counters that communication hooks and model averagers fill in as they run.
#pragma once

#include <atomic>
#include <cstdint>

namespace gz {

/// @brief What one rank handed to collectives: counted by the hooks and averagers themselves,
/// at the call, never derived from a formula.
///
/// `bytes` is the payload this rank contributes: count x element size of an all-reduce, the
/// per-rank block of an all-gather or a reduce-scatter. With two ranks that is also what each rank
/// sends over the wire with a ring or direct exchange (headers aside); with n ranks a ring
/// all-reduce sends 2(n-1)/n x payload, an all-gather or reduce-scatter (n-1) x payload.
/// Thread-safe (hooks run on the progress thread).
struct CommStats {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> collectives{0};
  /// @brief Record one collective of `payload` bytes.
  void add(uint64_t payload) {
    bytes.fetch_add(payload, std::memory_order_relaxed);
    collectives.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace gz
