#include "comm/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>

#include "gz/core/error.h"

namespace gz::comm::shm {
namespace {

std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::weak_ptr<Segment>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<Segment>>();  // leaked: outlives statics
  return *r;
}

char* map_fd(int fd, size_t bytes, const std::string& name) {
  // MAP_POPULATE: fault the pages in now rather than inside the first timed collective.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    throw SystemError("shm: mmap of " + name + " (" + std::to_string(bytes) + " bytes) failed", err);
  }
  close(fd);
  return static_cast<char*>(p);
}

}  // namespace

Segment::~Segment() {
  munmap(data_, bytes_);
  std::lock_guard<std::mutex> lock(registry_mu());
  auto it = registry().find(name_);
  if (it != registry().end() && it->second.expired()) registry().erase(it);
}

std::shared_ptr<Segment> Segment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw SystemError("shm: cannot create " + name, errno);
  // posix_fallocate reserves the pages now: a full /dev/shm is a clear error here rather than a
  // SIGBUS on first touch later.
  int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    throw SystemError("shm: cannot allocate " + std::to_string(bytes) + " bytes for " + name +
                          " (is /dev/shm full or too small?)",
                      rc);
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw SystemError("shm: cannot size " + name + " to " + std::to_string(bytes) + " bytes (is /dev/shm full?)",
                      err);
  }
  char* data;
  try {
    data = map_fd(fd, bytes, name);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
  std::shared_ptr<Segment> seg(new Segment(name, data, bytes));
  std::lock_guard<std::mutex> lock(registry_mu());
  registry()[name] = seg;
  return seg;
}

std::shared_ptr<Segment> Segment::open(const std::string& name, size_t bytes) {
  std::lock_guard<std::mutex> lock(registry_mu());
  auto it = registry().find(name);
  if (it != registry().end()) {
    if (auto seg = it->second.lock()) {
      if (seg->size() != bytes)
        GZ_THROW(InvalidArgument, "shm: segment ", name, " has ", seg->size(), " bytes, expected ", bytes);
      return seg;
    }
  }
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw SystemError("shm: cannot open " + name, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    throw SystemError("shm: cannot stat " + name, err);
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    GZ_THROW(InvalidArgument, "shm: segment ", name, " has ", st.st_size, " bytes, expected ", bytes,
             " (ranks disagree on the layout?)");
  }
  std::shared_ptr<Segment> seg(new Segment(name, map_fd(fd, bytes, name), bytes));
  registry()[name] = seg;
  return seg;
}

void Segment::unlink(const std::string& name) {
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) throw SystemError("shm: cannot unlink " + name, errno);
}

}  // namespace gz::comm::shm
