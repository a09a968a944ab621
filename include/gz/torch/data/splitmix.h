// Small deterministic RNG shared by samplers, readers and augmentation: the same numbers on every
// platform and standard library (std::shuffle and the std distributions are implementation-defined).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

namespace gz::detail {

/// @brief SplitMix64 (Steele, Lea, Flood 2014): one 64-bit state, passes BigCrush, trivially seedable.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  /// @brief Seed from several values (seed, epoch, index...) so that nearby tuples are unrelated.
  explicit SplitMix64(std::initializer_list<uint64_t> keys) : state_(0x6a09e667f3bcc909ull) {
    for (uint64_t k : keys) state_ = mix(state_ ^ mix(k + 0x9e3779b97f4a7c15ull));
  }
  uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ull); }
  /// @brief Uniform in [0, n) without modulo bias (rejection sampling); n > 0.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }
  /// @brief Uniform double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

/// @brief Fisher-Yates shuffle of [first, first + n) driven by `rng` (portable, unlike std::shuffle).
template <typename It>
void fisher_yates(It first, size_t n, SplitMix64& rng) {
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.below(i));
    using std::swap;
    swap(first[i - 1], first[j]);
  }
}

}  // namespace gz::detail
