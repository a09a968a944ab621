#include "gz/train/data/text_lines.h"

#include <torch/torch.h>

#include <cerrno>
#include <cstdlib>

#include "gz/core/error.h"

namespace gz::train {

void parse_text_line(const std::string& line, const HashTokenizer& tokenizer, int64_t num_classes, int64_t* ids,
                     int64_t& label, const std::string& where) {
  const size_t tab = line.find('\t');
  auto snippet = [&] { return line.substr(0, 60) + (line.size() > 60 ? "..." : ""); };
  if (tab == std::string::npos || tab == 0)
    GZ_THROW(InvalidArgument, "text_lines: ", where, ": expected 'label<TAB>text', got '", snippet(), "'");
  const std::string label_text = line.substr(0, tab);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(label_text.c_str(), &end, 10);
  if (errno != 0 || end != label_text.c_str() + label_text.size() || v < 0 ||
      (num_classes > 0 && v >= num_classes))
    GZ_THROW(InvalidArgument, "text_lines: ", where, ": bad label '", label_text, "'",
             num_classes > 0 ? detail::concat(" (need 0 <= label < ", num_classes, ")") : std::string());
  label = v;
  tokenizer.encode(std::string_view(line).substr(tab + 1), ids);
}

TextLinesDataset::TextLinesDataset(TextLinesOptions options) : options_(std::move(options)) {
  HashTokenizer tokenizer(options_.vocab_size, options_.seq_len);
  ShardedLineReaderOptions ro;
  ro.buffer_bytes = size_t(1) << 20;
  ro.max_line_bytes = options_.max_line_bytes;
  ShardedLineReader reader(options_.paths, ro);
  std::vector<int32_t> ids;
  std::vector<int64_t> labels;
  std::vector<int64_t> row(static_cast<size_t>(options_.seq_len));
  std::string line;
  size_t file = 0, line_no = 0;
  while (reader.next(line)) {
    // Right after a line, the reader's state still names the file that line came from.
    const size_t f = reader.state().file;
    if (f != file) {
      file = f;
      line_no = 0;
    }
    ++line_no;
    if (line.empty() && options_.skip_empty_lines) continue;
    int64_t label = 0;
    const std::string where = file < options_.paths.size() ? detail::concat(options_.paths[file], ":", line_no) : "?";
    parse_text_line(line, tokenizer, options_.num_classes, row.data(), label, where);
    ids.insert(ids.end(), row.begin(), row.end());
    labels.push_back(label);
  }
  if (labels.empty()) GZ_THROW(InvalidArgument, "text_lines: no examples in ", options_.paths.front(), "...");
  const auto n = static_cast<int64_t>(labels.size());
  ids_ = torch::from_blob(ids.data(), {n, options_.seq_len}, torch::kInt32).clone();
  labels_ = torch::from_blob(labels.data(), {n}, torch::kLong).clone();
}

Example TextLinesDataset::get(size_t index) const {
  if (index >= size()) GZ_THROW(InvalidArgument, "text_lines: index ", index, " >= size ", size());
  return {ids_[static_cast<int64_t>(index)].to(torch::kLong), labels_.data_ptr<int64_t>()[index]};
}

TextLinesStream::TextLinesStream(TextLinesOptions options, ShardedLineReaderOptions reader_options)
    : options_(std::move(options)),
      tokenizer_(options_.vocab_size, options_.seq_len),
      reader_(options_.paths, reader_options) {}

std::optional<Batch> TextLinesStream::next_batch(size_t n) {
  GZ_CHECK_ARG(n > 0, "TextLinesStream::next_batch: n = 0");
  std::vector<int64_t> ids;
  std::vector<int64_t> labels;
  ids.reserve(n * static_cast<size_t>(options_.seq_len));
  std::vector<int64_t> row(static_cast<size_t>(options_.seq_len));
  while (labels.size() < n && reader_.next(line_)) {
    if (line_.empty() && options_.skip_empty_lines) continue;
    int64_t label = 0;
    parse_text_line(line_, tokenizer_, options_.num_classes, row.data(), label,
                    detail::concat("shard ", reader_.shard(), "/", reader_.num_shards(), " line ",
                                   reader_.state().lines_emitted));
    ids.insert(ids.end(), row.begin(), row.end());
    labels.push_back(label);
  }
  if (labels.empty()) return std::nullopt;
  const auto b = static_cast<int64_t>(labels.size());
  Batch batch;
  batch.input = torch::from_blob(ids.data(), {b, options_.seq_len}, torch::kLong).clone();
  batch.label = torch::from_blob(labels.data(), {b}, torch::kLong).clone();
  return batch;
}

}  // namespace gz::train
