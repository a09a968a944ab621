#include "gz/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "gz/core/error.h"
#include "store/store_state.h"
#include "store/wire.h"

namespace gz {

namespace {

constexpr uint8_t kSet = static_cast<uint8_t>(wire::Op::set);
constexpr uint8_t kDelete = static_cast<uint8_t>(wire::Op::delete_key);

std::string as_str(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes as_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

/// flock() for the scope; EINTR-safe.
class FileStore::Lock {
 public:
  Lock(int fd, int op, const std::string& path) : fd_(fd) {
    while (flock(fd_, op) != 0) {
      if (errno != EINTR) throw SystemError("file store " + path + ": flock", errno);
    }
  }
  ~Lock() { flock(fd_, LOCK_UN); }

 private:
  int fd_;
};

FileStore::FileStore(std::string path) : path_(std::move(path)) {
  GZ_CHECK_ARG(!path_.empty(), "FileStore needs a path");
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) throw SystemError("file store: cannot open " + path_, errno);
}

FileStore::~FileStore() {
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::refresh() {
  struct stat st {};
  if (fstat(fd_, &st) != 0) throw SystemError("file store " + path_ + ": fstat", errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < offset_ || static_cast<uint64_t>(st.st_ino) != inode_) {
    // Truncated or replaced: start over.
    data_.clear();
    offset_ = 0;
    inode_ = static_cast<uint64_t>(st.st_ino);
  }
  if (size == offset_) return;
  std::string buf(size - offset_, '\0');
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = ::pread(fd_, &buf[got], buf.size() - got, static_cast<off_t>(offset_ + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SystemError("file store " + path_ + ": read", errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  wire::Limits limits;
  limits.max_body_bytes = size_t{1} << 31;
  limits.max_parts = 2;
  size_t pos = 0;
  while (pos < got) {
    wire::Message m;
    auto r = wire::decode(reinterpret_cast<const uint8_t*>(buf.data()) + pos, got - pos, wire::Direction::request,
                          limits, m);
    if (r.status == wire::DecodeStatus::need_more) break;  // a record being written (or a torn tail)
    if (r.status != wire::DecodeStatus::ok || (m.code != kSet && m.code != kDelete))
      GZ_THROW(Error, "file store ", path_, ": corrupt record at offset ", offset_ + pos, ": ",
               r.error.empty() ? "unexpected record type" : r.error);
    if (m.code == kSet)
      data_[m.parts[0]] = std::move(m.parts[1]);
    else
      data_.erase(m.parts[0]);
    pos += r.consumed;
  }
  offset_ += pos;
}

void FileStore::append(const std::string& record) {
  // Under the exclusive lock: drop a torn tail left by a writer that died mid-record, so the
  // log stays parseable.
  struct stat st {};
  if (fstat(fd_, &st) != 0) throw SystemError("file store " + path_ + ": fstat", errno);
  if (static_cast<uint64_t>(st.st_size) > offset_ && ftruncate(fd_, static_cast<off_t>(offset_)) != 0)
    throw SystemError("file store " + path_ + ": truncate torn record", errno);
  size_t off = 0;
  while (off < record.size()) {
    ssize_t n = ::write(fd_, record.data() + off, record.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      if (ftruncate(fd_, static_cast<off_t>(offset_)) != 0) { /* best effort */ }
      throw SystemError("file store " + path_ + ": write", e);
    }
    off += static_cast<size_t>(n);
  }
  offset_ += record.size();
}

void FileStore::append_set(const std::string& key, const std::string& value) {
  wire::Message m;
  m.code = kSet;
  m.parts = {key, value};
  append(wire::encode(m));
  data_[key] = value;
}

void FileStore::append_delete(const std::string& key) {
  wire::Message m;
  m.code = kDelete;
  m.parts = {key};
  append(wire::encode(m));
  data_.erase(key);
}

void FileStore::set(const std::string& key, const Bytes& value) {
  GZ_CHECK_ARG(value.size() < (size_t{1} << 31), "file store value of ", value.size(), " bytes is too large");
  std::lock_guard<std::mutex> g(mu_);
  Lock l(fd_, LOCK_EX, path_);
  refresh();
  append_set(key, as_str(value));
}

Bytes FileStore::get(const std::string& key, Deadline deadline) {
  for (;;) {
    wait({key}, deadline);
    std::lock_guard<std::mutex> g(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) return as_bytes(it->second);
    // Deleted between wait and here: wait again.
  }
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> g(mu_);
  Lock l(fd_, LOCK_EX, path_);
  refresh();
  int64_t v = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !wire::parse_counter(it->second, v))
    GZ_THROW(InvalidArgument, "file store ", path_, ": add: value of key '", key, "' is not an integer");
  int64_t sum = 0;
  if (__builtin_add_overflow(v, delta, &sum))
    GZ_THROW(InvalidArgument, "file store ", path_, ": add: counter '", key, "' would overflow");
  append_set(key, std::to_string(sum));
  return sum;
}

int64_t FileStore::append(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> g(mu_);
  Lock l(fd_, LOCK_EX, path_);
  refresh();
  auto it = data_.find(key);
  std::string v = it == data_.end() ? std::string() : it->second;
  v += as_str(value);
  append_set(key, v);
  return static_cast<int64_t>(v.size());
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> g(mu_);
  Lock l(fd_, LOCK_EX, path_);
  refresh();
  auto it = data_.find(key);
  std::string exp = as_str(expected);
  if (it == data_.end() ? exp.empty() : it->second == exp) {
    append_set(key, as_str(desired));
    return desired;
  }
  return it == data_.end() ? expected : as_bytes(it->second);
}

void FileStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  Stopwatch sw;
  Duration backoff(1);
  for (;;) {
    if (check(keys)) return;
    if (deadline.expired()) {
      std::string missing;
      {
        std::lock_guard<std::mutex> g(mu_);
        for (auto& k : keys)
          if (!data_.count(k)) missing += (missing.empty() ? "" : ", ") + k;
      }
      GZ_THROW(TimeoutError, "file store ", path_, ": wait timed out after ", format_duration(sw.elapsed()),
               "; missing keys: ", missing);
    }
    std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, Duration(50));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  Lock l(fd_, LOCK_SH, path_);
  refresh();
  for (auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  Lock l(fd_, LOCK_EX, path_);
  refresh();
  if (!data_.count(key)) return false;
  append_delete(key);
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard<std::mutex> g(mu_);
  Lock l(fd_, LOCK_SH, path_);
  refresh();
  return static_cast<int64_t>(data_.size());
}

}  // namespace gz
