// Copy helpers of the shm backend (SSE2 loads/stores on x86, memcpy elsewhere).
#include "comm/shm/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GZ_SHM_X86 1
#endif

namespace gz::comm::shm {

void copy_streaming(void* dst_v, const void* src_v, size_t bytes) {
  if (bytes == 0) return;  // callers may pass null buffers with nothing to copy (memcpy forbids null)
#ifdef GZ_SHM_X86
  char* dst = static_cast<char*>(dst_v);
  const char* src = static_cast<const char*>(src_v);
  if (bytes < 4096) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();  // streamed stores become visible before the caller publishes a flag
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst_v, src_v, bytes);
#endif
}

void copy_cached(void* dst_v, const void* src_v, size_t bytes) {
  if (bytes == 0) return;  // callers may pass null buffers with nothing to copy (memcpy forbids null)
#ifdef GZ_SHM_X86
  char* dst = static_cast<char*>(dst_v);
  const char* src = static_cast<const char*>(src_v);
  if (bytes < 4096) {
    std::memcpy(dst, src, bytes);
    return;
  }
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst_v, src_v, bytes);
#endif
}

}  // namespace gz::comm::shm
