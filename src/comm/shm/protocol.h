// The shm step protocol's primitives: acquire loads, wrap-around step comparison, futex
// wait/wake, and publishing a word so that sleeping waiters wake without a lost wake-up.
#pragma once

#include <cstdint>
#include <string>

#include "comm/shm/layout.h"
#include "gz/core/deadline.h"

namespace gz::comm::shm {

inline uint32_t load_acq(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
/// Steps and chunk counters wrap at 2^32: compare by signed distance.
inline bool reached(uint32_t v, uint32_t target) { return static_cast<int32_t>(v - target) >= 0; }

/// Sleep while *word == expected, at most `slice` (EAGAIN, timeouts and signals: caller rechecks).
void futex_wait(const uint32_t* word, uint32_t expected, Duration slice);
void futex_wake(const uint32_t* word);

// Publish a new value; wake sleepers only when there are any (no syscall on the fast path). The
// seq_cst store/load pair against the waiter's seq_cst increment/load rules out lost wake-ups.
inline void publish(uint32_t* word, uint32_t value, uint32_t* sleepers) {
  __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) != 0) futex_wake(word);
}

/// "allreduce(f32 x 100, sum)": a collective's descriptor for mismatch messages.
std::string describe(const OpDesc& d);
bool same(const OpDesc& a, const OpDesc& b);

}  // namespace gz::comm::shm
