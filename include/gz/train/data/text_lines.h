// Text classification from "label<TAB>text" lines, read with the sharded line reader.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gz/torch/sharded_line_reader.h"
#include "gz/train/data/dataset.h"
#include "gz/train/data/hash_tokenizer.h"

namespace gz::train {

/// @brief Options of TextLinesDataset and TextLinesStream.
struct TextLinesOptions {
  std::vector<std::string> paths;  ///< one or more text files
  int64_t vocab_size = 30522;
  int64_t seq_len = 128;     ///< ids per example (truncate / pad with 0)
  int64_t num_classes = 0;   ///< > 0: labels must be in [0, num_classes)
  bool skip_empty_lines = true;
  size_t max_line_bytes = kDefaultMaxLineBytes;  ///< TextLinesDataset's reader (see ShardedLineReader)
};

/// @brief Parse "label<TAB>text" (label a non-negative integer) into `ids` [seq_len] and `label`.
/// @throws gz::InvalidArgument naming `where` (file:line or shard) on a malformed line.
void parse_text_line(const std::string& line, const HashTokenizer& tokenizer, int64_t num_classes, int64_t* ids,
                     int64_t& label, const std::string& where);

/// @brief Map-style text dataset: all lines are read once (through ShardedLineReader, one shard)
/// and tokenised into one contiguous int32 id tensor [N, seq_len]; get(i) returns int64 ids [seq_len].
/// For corpora too big for memory use TextLinesStream.
class TextLinesDataset : public Dataset {
 public:
  explicit TextLinesDataset(TextLinesOptions options);
  size_t size() const override { return static_cast<size_t>(labels_.size(0)); }
  Example get(size_t index) const override;

 private:
  TextLinesOptions options_;
  torch::Tensor ids_;     // int32 [N, seq_len]
  torch::Tensor labels_;  // int64 [N]
};

/// @brief Streaming text dataset for one (rank, worker) shard of the files: batches straight from
/// a ShardedLineReader (optionally block-shuffled), with the reader's O(1) resume state.
class TextLinesStream {
 public:
  TextLinesStream(TextLinesOptions options, ShardedLineReaderOptions reader_options);
  /// @brief Up to n examples collated into a Batch (ids int64 [B, seq_len]); nullopt when done.
  std::optional<Batch> next_batch(size_t n);
  void set_epoch(int64_t epoch) { reader_.set_epoch(epoch); }
  ShardedLineReaderState state() const { return reader_.state(); }
  void load_state(const ShardedLineReaderState& state) { reader_.load_state(state); }

 private:
  TextLinesOptions options_;
  HashTokenizer tokenizer_;
  ShardedLineReader reader_;
  std::string line_;
};

}  // namespace gz::train
