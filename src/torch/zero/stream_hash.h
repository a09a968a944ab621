// A fast 64-bit checksum of a byte stream fed in pieces of any size, for sharded checkpoint files
// (torch's archive reader does not check its CRCs: a flipped byte would load silently). Four
// independent multiply-xor lanes over 32-byte blocks: memory speed, not cryptographic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace gz::zero {

/// @brief 16 hex digits: how manifests record a checksum.
inline std::string hex64(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

class StreamHash {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (held_) {  // complete the block left from the last piece
      const size_t take = n < kBlock - held_ ? n : kBlock - held_;
      std::memcpy(buf_ + held_, p, take);
      held_ += take;
      p += take;
      n -= take;
      if (held_ < kBlock) return;
      block(buf_);
      held_ = 0;
    }
    for (; n >= kBlock; p += kBlock, n -= kBlock) block(p);
    std::memcpy(buf_, p, n);
    held_ = n;
  }
  uint64_t digest() const {
    uint64_t h = total_ * kPrime;
    for (uint64_t l : lane_) h = (h ^ l) * kPrime;
    for (size_t i = 0; i < held_; ++i) h = (h ^ buf_[i]) * kPrime;
    return h;
  }

 private:
  static constexpr size_t kBlock = 32;
  static constexpr uint64_t kPrime = 0x100000001b3ULL;  // FNV-1a's
  void block(const unsigned char* p) {
    for (int i = 0; i < 4; ++i) {
      uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);
      lane_[i] = (lane_[i] ^ w) * kPrime;
    }
  }
  uint64_t lane_[4] = {0xcbf29ce484222325ULL, 1, 2, 3};
  unsigned char buf_[kBlock] = {};
  size_t held_ = 0;
  uint64_t total_ = 0;
};

}  // namespace gz::zero
