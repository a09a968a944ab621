#include "gz/train/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gz/core/error.h"

namespace gz::train {

namespace fs = std::filesystem;

std::string temp_name_for(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  fs::path p(path);
  std::string name = "." + p.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                     std::to_string(counter.fetch_add(1));
  return (p.parent_path() / name).string();
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.empty() ? "." : path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SystemError("open " + path + " for fsync", errno);
  int rc = ::fsync(fd);
  int err = errno;
  if (::close(fd) != 0 && rc == 0) {
    rc = -1;
    err = errno;
  }
  // Some file systems refuse fsync on directories (EINVAL); the rename is still atomic there.
  if (rc != 0 && err != EINVAL) throw SystemError("fsync " + path, err);
}

void write_file_atomic(const std::string& path, const std::string& data) {
  std::string tmp = temp_name_for(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SystemError("create " + tmp, errno);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw SystemError("write " + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw SystemError("fsync " + tmp, err);
  }
  // close() can still report a failed write-back (NFS reports EIO here); renaming such a file over
  // the old one would replace good data with a torn file. Linux frees the descriptor even when
  // close() fails, so it is never retried.
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw SystemError("close " + tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw SystemError("rename " + tmp + " -> " + path, err);
  }
  fsync_path(fs::path(path).parent_path().string());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError("open " + path, errno);
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw SystemError("read " + path, errno);
  return os.str();
}

}  // namespace gz::train
