#include "gz/torch/sharded_line_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "gz/core/error.h"
#include "gz/torch/data/splitmix.h"

namespace gz {
namespace {

uint64_t split_point(uint64_t total, size_t index, size_t parts) {
  // 128-bit product: total * index overflows 64 bits for large inputs.
  return static_cast<uint64_t>(static_cast<unsigned __int128>(total) * index / parts);
}

}  // namespace

ShardedLineReader::ShardedLineReader(std::vector<std::string> paths, ShardedLineReaderOptions options)
    : paths_(std::move(paths)), options_(options) {
  const auto& o = options_;
  if (o.num_replicas < 1 || o.rank < 0 || o.rank >= o.num_replicas)
    GZ_THROW(InvalidArgument, "ShardedLineReader: rank ", o.rank, " of num_replicas ", o.num_replicas);
  const int workers = std::max(o.num_workers, 1);
  if (o.num_workers < 0 || o.worker < 0 || o.worker >= workers)
    GZ_THROW(InvalidArgument, "ShardedLineReader: worker ", o.worker, " of num_workers ", o.num_workers,
             " (rank ", o.rank, ")");
  if (o.buffer_bytes == 0) GZ_THROW(InvalidArgument, "ShardedLineReader: buffer_bytes must be > 0");
  if (o.max_line_bytes == 0) GZ_THROW(InvalidArgument, "ShardedLineReader: max_line_bytes must be > 0");
  if (paths_.empty()) GZ_THROW(InvalidArgument, "ShardedLineReader: no input files");
  for (const auto& p : paths_) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) throw SystemError("ShardedLineReader: cannot stat '" + p + "'", errno);
    if (!S_ISREG(st.st_mode)) GZ_THROW(InvalidArgument, "ShardedLineReader: '", p, "' is not a regular file");
    starts_.push_back(total_);
    sizes_.push_back(static_cast<uint64_t>(st.st_size));
    total_ += static_cast<uint64_t>(st.st_size);
  }
  num_shards_ = static_cast<size_t>(o.num_replicas) * static_cast<size_t>(workers);
  shard_ = static_cast<size_t>(o.rank) * static_cast<size_t>(workers) + static_cast<size_t>(o.worker);
  begin_ = split_point(total_, shard_, num_shards_);
  end_ = split_point(total_, shard_ + 1, num_shards_);
  buf_.resize(o.buffer_bytes);
  reset();
}

ShardedLineReader::~ShardedLineReader() { close_file(); }

void ShardedLineReader::close_file() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

size_t ShardedLineReader::fill(uint64_t file_offset) {
  buf_offset_ = file_offset;
  buf_pos_ = buf_len_ = 0;
  for (;;) {
    const ssize_t n = ::pread(fd_, buf_.data(), buf_.size(), static_cast<off_t>(file_offset));
    if (n >= 0) {
      buf_len_ = static_cast<size_t>(n);
      return buf_len_;
    }
    if (errno != EINTR)
      throw SystemError(detail::concat("ShardedLineReader: read '", paths_[file_], "' at byte ", file_offset,
                                       " (shard ", shard_, "/", num_shards_, ")"),
                        errno);
  }
}

void ShardedLineReader::open_at(size_t f, uint64_t offset, bool at_line_start) {
  close_file();
  file_ = f;
  fd_ = ::open(paths_[f].c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw SystemError("ShardedLineReader: cannot open '" + paths_[f] + "'", errno);
  file_end_ = end_ > starts_[f] ? std::min(end_ - starts_[f], sizes_[f]) : 0;
  buf_offset_ = offset;
  buf_pos_ = buf_len_ = 0;
  line_start_ = offset;
  if (at_line_start || offset == 0) return;
  // The line containing byte offset-1 belongs to an earlier shard: our first line starts after the
  // next '\n' at or after offset-1. Stop early once past our end: no line of ours starts there.
  fill(offset - 1);
  for (;;) {
    if (buf_pos_ == buf_len_) {
      if (buf_offset_ + buf_len_ >= file_end_ || fill(buf_offset_ + buf_len_) == 0) {
        line_start_ = std::max(file_end_, offset);
        return;
      }
    }
    const char* b = buf_.data() + buf_pos_;
    const void* nl = std::memchr(b, '\n', buf_len_ - buf_pos_);
    if (nl != nullptr) {
      buf_pos_ += static_cast<size_t>(static_cast<const char*>(nl) - b) + 1;
      line_start_ = buf_offset_ + buf_pos_;
      return;
    }
    buf_pos_ = buf_len_;
  }
}

void ShardedLineReader::open_from_file(size_t f) {
  close_file();
  for (; f < paths_.size(); ++f) {
    if (starts_[f] >= end_) break;                    // files after our range
    if (starts_[f] + sizes_[f] <= begin_) continue;  // files before our range (and empty files)
    const uint64_t lo = begin_ > starts_[f] ? begin_ - starts_[f] : 0;
    open_at(f, lo, lo == 0);
    return;
  }
  file_ = paths_.size();
}

bool ShardedLineReader::read_raw(std::string& line) {
  for (;;) {
    if (file_ >= paths_.size()) return false;
    if (line_start_ >= file_end_) {
      open_from_file(file_ + 1);
      continue;
    }
    line.clear();
    uint64_t consumed = 0;
    bool eof = false;
    // Checked before each append: memory stays within max_line_bytes + one buffer.
    auto check_length = [&](size_t more) {
      if (line.size() + more > options_.max_line_bytes)
        GZ_THROW(Error, "ShardedLineReader: line at byte ", line_start_, " of '", paths_[file_],
                 "' is longer than max_line_bytes = ", options_.max_line_bytes, " (shard ", shard_, "/",
                 num_shards_, "); a binary file or missing newlines?");
    };
    for (;;) {
      if (buf_pos_ == buf_len_ && fill(buf_offset_ + buf_len_) == 0) {
        eof = true;
        break;
      }
      const char* b = buf_.data() + buf_pos_;
      const size_t avail = buf_len_ - buf_pos_;
      const void* nl = std::memchr(b, '\n', avail);
      if (nl != nullptr) {
        const size_t k = static_cast<size_t>(static_cast<const char*>(nl) - b);
        check_length(k);
        line.append(b, k);
        buf_pos_ += k + 1;
        break;
      }
      check_length(avail);
      line.append(b, avail);
      buf_pos_ = buf_len_;
      consumed += avail;
    }
    line_start_ = buf_offset_ + buf_pos_;
    if (eof) {
      line_start_ = std::max(line_start_, file_end_);  // nothing more starts in this file
      if (consumed == 0) continue;                      // file shorter than when measured
    }
    if (options_.strip_cr && !line.empty() && line.back() == '\r') line.pop_back();
    return true;
  }
}

void ShardedLineReader::fill_block() {
  block_file_ = file_;
  block_offset_ = line_start_;
  const uint64_t global = file_ < paths_.size() ? starts_[file_] + line_start_ : total_;
  block_.resize(options_.shuffle_lines);
  size_t n = 0;
  while (n < block_.size() && read_raw(block_[n])) ++n;
  block_.resize(n);
  block_pos_ = 0;
  detail::SplitMix64 rng({options_.seed, static_cast<uint64_t>(epoch_), shard_, global});
  detail::fisher_yates(block_.begin(), n, rng);
}

bool ShardedLineReader::next(std::string& line) {
  if (options_.shuffle_lines == 0) {
    if (!read_raw(line)) return false;
  } else {
    if (block_pos_ >= block_.size()) {
      fill_block();
      if (block_.empty()) return false;
    }
    line.swap(block_[block_pos_++]);
  }
  ++lines_emitted_;
  return true;
}

std::vector<std::string> ShardedLineReader::next_lines(size_t n) {
  std::vector<std::string> out;
  std::string line;
  while (out.size() < n && next(line)) out.push_back(line);
  return out;
}

void ShardedLineReader::set_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  reset();
}

void ShardedLineReader::reset() {
  lines_emitted_ = 0;
  block_.clear();
  block_pos_ = 0;
  open_from_file(0);
}

ShardedLineReaderState ShardedLineReader::state() const {
  ShardedLineReaderState s;
  s.epoch = epoch_;
  s.lines_emitted = lines_emitted_;
  s.shard = shard_;
  s.num_shards = num_shards_;
  s.total_bytes = total_;
  if (options_.shuffle_lines > 0 && block_pos_ < block_.size()) {
    s.file = block_file_;
    s.offset = block_offset_;
    s.block_emitted = block_pos_;
  } else {
    s.file = file_;
    s.offset = line_start_;
  }
  return s;
}

void ShardedLineReader::load_state(const ShardedLineReaderState& s) {
  auto fail = [&](const std::string& why) {
    GZ_THROW(InvalidArgument, "ShardedLineReader::load_state (shard ", shard_, "/", num_shards_, "): ", why);
  };
  if (s.shard != shard_ || s.num_shards != num_shards_)
    fail(detail::concat("state is for shard ", s.shard, "/", s.num_shards));
  if (s.total_bytes != total_)
    fail(detail::concat("files changed: state for ", s.total_bytes, " bytes, now ", total_));
  if (s.file > paths_.size()) fail(detail::concat("file index ", s.file, " >= ", paths_.size()));
  if (s.file < paths_.size() && (s.offset > sizes_[s.file] || starts_[s.file] + s.offset < begin_))
    fail(detail::concat("offset ", s.offset, " of '", paths_[s.file], "' outside this shard"));
  if (s.block_emitted > options_.shuffle_lines || s.block_emitted > s.lines_emitted)
    fail(detail::concat("block_emitted ", s.block_emitted, " with shuffle_lines ", options_.shuffle_lines));
  epoch_ = s.epoch;
  block_.clear();
  block_pos_ = 0;
  if (s.file < paths_.size()) {
    open_at(s.file, s.offset, /*at_line_start=*/true);
  } else {
    close_file();
    file_ = paths_.size();
  }
  lines_emitted_ = s.lines_emitted;
  if (s.block_emitted > 0) {
    fill_block();
    if (s.block_emitted > block_.size()) {
      const size_t have = block_.size();
      reset();
      fail(detail::concat("block_emitted ", s.block_emitted, " but the block has ", have,
                          " lines (reader reset to the epoch start)"));
    }
    block_pos_ = s.block_emitted;
  }
}

}  // namespace gz
