// Copies between user buffers and the shared slots, tuned for who reads the destination next.
#pragma once

#include <cstddef>

namespace gz::comm::shm {

/// @brief memcpy for large transfers into a buffer nobody reads soon (the caller's output of a big
/// collective): non-temporal stores skip the read-for-ownership and keep the shared slots in
/// cache. Falls back to memcpy for small sizes and non-x86 builds. Regions must not overlap.
void copy_streaming(void* dst, const void* src, size_t bytes);
/// @brief memcpy with ordinary vector stores (no `rep movsb`), for copies into the shared slots
/// that a peer reads right away; measured faster than glibc's choice for 64 KiB..1 MiB here.
void copy_cached(void* dst, const void* src, size_t bytes);

/// Copy out of a shared slot into the caller's buffer; big outputs bypass the caches.
inline void to_user(void* dst, const void* src, size_t bytes, bool stream) {
  if (stream) copy_streaming(dst, src, bytes);
  else copy_cached(dst, src, bytes);
}

}  // namespace gz::comm::shm
