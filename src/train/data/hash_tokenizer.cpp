#include "gz/train/data/hash_tokenizer.h"

#include "gz/core/error.h"

namespace gz::train {
namespace {

bool word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

}  // namespace

HashTokenizer::HashTokenizer(int64_t vocab_size, int64_t seq_len) : vocab_size_(vocab_size), seq_len_(seq_len) {
  GZ_CHECK_ARG(vocab_size >= 2, "HashTokenizer: vocab_size ", vocab_size, " (id 0 is padding)");
  GZ_CHECK_ARG(seq_len >= 1, "HashTokenizer: seq_len ", seq_len);
}

int64_t HashTokenizer::encode(std::string_view text, int64_t* out) const {
  int64_t n = 0;
  size_t i = 0;
  while (i < text.size() && n < seq_len_) {
    while (i < text.size() && !word_byte(static_cast<unsigned char>(text[i]))) ++i;
    if (i == text.size()) break;
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a offset basis
    for (; i < text.size() && word_byte(static_cast<unsigned char>(text[i])); ++i) {
      unsigned char c = static_cast<unsigned char>(text[i]);
      if (c >= 'A' && c <= 'Z') c = static_cast<unsigned char>(c - 'A' + 'a');
      h = (h ^ c) * 0x100000001b3ull;
    }
    out[n++] = 1 + static_cast<int64_t>(h % static_cast<uint64_t>(vocab_size_ - 1));
  }
  for (int64_t k = n; k < seq_len_; ++k) out[k] = 0;
  return n;
}

std::vector<int64_t> HashTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids(static_cast<size_t>(seq_len_));
  encode(text, ids.data());
  return ids;
}

}  // namespace gz::train
