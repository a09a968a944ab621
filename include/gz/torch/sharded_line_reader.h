// Streams the lines of text files too big for memory, split into disjoint shards across
// ranks x loader workers, with O(1) mid-epoch resume (plain C++, no LibTorch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gz {

/// @brief Default ShardedLineReaderOptions::max_line_bytes (16 MiB).
constexpr size_t kDefaultMaxLineBytes = size_t(16) << 20;

/// @brief Options of ShardedLineReader.
struct ShardedLineReaderOptions {
  int rank = 0;
  int num_replicas = 1;
  /// @brief Loader worker of this reader; num_workers = 0 means the rank reads its whole range.
  int worker = 0;
  int num_workers = 0;
  /// @brief Size of the fixed read buffer (lines may be longer: they are assembled across reads).
  size_t buffer_bytes = size_t(1) << 16;
  /// @brief Longest line accepted (bytes before '\n'). A longer one is an error as soon as it passes
  /// this length, so a file without newlines cannot make the reader hold all of it in memory.
  size_t max_line_bytes = kDefaultMaxLineBytes;
  /// @brief 0 = file order. K > 0 = block shuffle: read K lines, emit them in a random order
  /// seeded by (seed, epoch, shard, block offset), repeat. Memory: K lines.
  size_t shuffle_lines = 0;
  uint64_t seed = 0;
  /// @brief Drop one '\r' before each '\n' (and at end of file): CRLF files read like LF files.
  bool strip_cr = true;
};

/// @brief Resumable position of a ShardedLineReader.
///
/// (file, offset) is the start of the next line to read (without shuffling), or the start of the
/// current shuffle block whose first `block_emitted` lines (in shuffled order) were already
/// returned. Resume seeks there: O(1) without shuffling; with shuffling it re-reads only the
/// current block (at most shuffle_lines lines) and rebuilds the same permutation, so no line is
/// skipped or repeated. num_shards, shard and total_bytes identify the configuration and the
/// files the state belongs to.
struct ShardedLineReaderState {
  int64_t epoch = 0;
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t lines_emitted = 0;  ///< lines returned so far in this epoch by this shard
  uint64_t block_emitted = 0;
  size_t shard = 0;
  size_t num_shards = 0;
  uint64_t total_bytes = 0;
};

/// @brief Reads the lines of a list of files that belong to one shard.
///
/// The files are laid end to end into one byte range [0, total), cut into num_replicas *
/// max(num_workers, 1) equal ranges (shard = rank * max(num_workers, 1) + worker). A shard owns
/// every line that starts inside its range: it seeks to the range start - 1 and skips to the next
/// '\n' (unless the range starts a file), then reads until a line would start at or after the range
/// end. Every line of every file is thus read by exactly one shard, whatever the line lengths, and
/// the workers of a rank together read exactly the lines of the rank's range with num_workers = 0.
/// A line is the bytes up to '\n' (excluded); a last line without '\n' counts; empty lines are
/// returned as empty strings. Not thread-safe: one reader per worker.
class ShardedLineReader {
 public:
  /// @throws gz::InvalidArgument for bad options or no files; gz::SystemError when a file cannot
  /// be opened or measured.
  ShardedLineReader(std::vector<std::string> paths, ShardedLineReaderOptions options = {});
  ~ShardedLineReader();
  ShardedLineReader(const ShardedLineReader&) = delete;
  ShardedLineReader& operator=(const ShardedLineReader&) = delete;

  /// @brief Next line of this shard into `line` (capacity reused); false at the end of the epoch.
  /// @throws gz::Error naming the file and the line's byte offset when a line is longer than
  /// max_line_bytes; gz::SystemError on I/O failure.
  bool next(std::string& line);
  /// @brief Up to n next lines (fewer at the end; empty when done).
  std::vector<std::string> next_lines(size_t n);

  /// @brief Select the epoch (shuffle order); a different epoch restarts the shard, the current
  /// one is kept (so set_epoch after load_state resumes in place).
  void set_epoch(int64_t epoch);
  /// @brief Restart the current epoch at the beginning of the shard.
  void reset();
  int64_t epoch() const { return epoch_; }

  ShardedLineReaderState state() const;
  /// @throws gz::InvalidArgument when the state belongs to another shard layout or other files
  /// (nothing is changed then); gz::SystemError on I/O failure.
  void load_state(const ShardedLineReaderState& state);

  size_t shard() const { return shard_; }
  size_t num_shards() const { return num_shards_; }
  /// @brief This shard's byte range [begin, end) in the concatenation of the files.
  uint64_t begin_byte() const { return begin_; }
  uint64_t end_byte() const { return end_; }
  uint64_t total_bytes() const { return total_; }

 private:
  // Position the raw cursor on file f at byte `offset`; if !at_line_start, skip to the next line.
  void open_at(size_t f, uint64_t offset, bool at_line_start);
  // Move to the first file at or after f that holds a line start of this shard.
  void open_from_file(size_t f);
  bool read_raw(std::string& line);
  size_t fill(uint64_t file_offset);
  void close_file();
  void fill_block();

  std::vector<std::string> paths_;
  std::vector<uint64_t> sizes_;
  std::vector<uint64_t> starts_;  // global offset of each file
  ShardedLineReaderOptions options_;
  size_t shard_ = 0, num_shards_ = 1;
  uint64_t begin_ = 0, end_ = 0, total_ = 0;
  int64_t epoch_ = 0;
  uint64_t lines_emitted_ = 0;

  // Raw cursor: file index, open descriptor, next line start and owned end within the file.
  size_t file_ = 0;
  int fd_ = -1;
  uint64_t line_start_ = 0;
  uint64_t file_end_ = 0;
  std::vector<char> buf_;
  uint64_t buf_offset_ = 0;  // file offset of buf_[0]
  size_t buf_pos_ = 0, buf_len_ = 0;

  // Shuffle block: lines, their start position and how many were handed out.
  std::vector<std::string> block_;
  size_t block_file_ = 0;
  uint64_t block_offset_ = 0;
  size_t block_pos_ = 0;
};

}  // namespace gz
