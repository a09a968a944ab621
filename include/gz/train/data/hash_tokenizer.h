// Deterministic word-hashing tokenizer: no vocabulary file, same ids on every machine.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace gz::train {

/// @brief Splits text into words (runs of ASCII letters/digits and of bytes >= 0x80, so UTF-8
/// letters stay together), lowercases ASCII, and maps each word to 1 + FNV-1a-64(word) mod
/// (vocab_size - 1): ids in [1, vocab_size), 0 is padding. Collisions are accepted.
class HashTokenizer {
 public:
  /// @throws gz::InvalidArgument when vocab_size < 2 or seq_len < 1.
  HashTokenizer(int64_t vocab_size, int64_t seq_len);
  /// @brief Write exactly seq_len ids to `out`: the first words' ids, then 0 padding.
  /// @return the number of non-padding ids.
  int64_t encode(std::string_view text, int64_t* out) const;
  std::vector<int64_t> encode(std::string_view text) const;
  int64_t vocab_size() const { return vocab_size_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  int64_t vocab_size_;
  int64_t seq_len_;
};

}  // namespace gz::train
