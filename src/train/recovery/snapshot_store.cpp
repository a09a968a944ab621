// Snapshot files: header + payload, temp file then rename; the writer thread.
#include "gz/train/recovery/snapshot_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/train/atomic_file.h"

namespace gz::train {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'G', 'Z', 'S', 'N', 'A', 'P', '3', '\0'};

// On disk: magic, step, epoch, world, fingerprint, run, payload bytes, payload hash, owner rank
// (-1: the whole state) (host byte order: a snapshot never leaves its node as a file).
struct FileHeader {
  char magic[8];
  int64_t step, epoch, world;
  uint64_t fingerprint, run, payload_bytes, payload_hash;
  int64_t rank;
};

// Four independent multiply-xor lanes: a few GB/s, enough to tell a damaged payload.
uint64_t payload_hash(const std::string& data) {
  uint64_t lane[4] = {0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL,
                      0x27D4EB2F165667C5ULL};
  const size_t words = data.size() / 8;
  const char* p = data.data();
  size_t i = 0;
  for (; i + 4 <= words; i += 4)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + 8 * (i + static_cast<size_t>(k)), 8);
      lane[k] = (lane[k] ^ w) * 0x100000001B3ULL;
    }
  uint64_t h = lane[0] ^ (lane[1] << 1) ^ (lane[2] << 2) ^ (lane[3] << 3);
  for (size_t b = 8 * i; b < data.size(); ++b) h = (h ^ static_cast<unsigned char>(p[b])) * 0x100000001B3ULL;
  return h ^ data.size();
}

void write_all(int fd, const char* p, size_t n, const std::string& file) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw SystemError("write snapshot " + file, errno);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::optional<FileHeader> read_header(const std::string& file) {
  FileHeader h{};
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) return std::nullopt;
  const bool ok = std::fread(&h, sizeof h, 1, f) == 1 && std::memcmp(h.magic, kMagic, 8) == 0;
  std::fclose(f);
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (!ok || ec || size != sizeof(FileHeader) + h.payload_bytes) return std::nullopt;
  return h;
}

// A folder only this user can enter: /dev/shm is world-writable, and another local user who made
// (or swapped in) our snapshot folder could delete snapshots or plant state for us to restore.
// Returns an empty string when it is safe, else why not.
std::string private_dir_problem(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return "cannot be read (" + std::string(std::strerror(errno)) + ")";
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "is not a folder";
  if (st.st_uid != ::getuid()) return "belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  // Writable by others is what lets them plant or swap a snapshot (the files themselves are 0600).
  if ((st.st_mode & 022) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return std::string("is writable by other users (mode ") + mode + ")";
  }
  return {};
}

// Creates `dir` (and missing parents) with mode 0700 and checks it and, for the default location,
// its per-user parent /dev/shm/gz-snapshots-UID.
void ensure_private_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  const bool per_user_parent = d.parent_path().filename().string().rfind("gz-snapshots-", 0) == 0;
  if (!d.parent_path().empty() && !fs::exists(d.parent_path(), ec)) {
    fs::create_directories(per_user_parent ? d.parent_path().parent_path() : d.parent_path(), ec);
    if (ec) throw SystemError("create snapshot folder " + d.parent_path().string(), ec.value());
    if (per_user_parent && ::mkdir(d.parent_path().c_str(), 0700) != 0 && errno != EEXIST)
      throw SystemError("create snapshot folder " + d.parent_path().string(), errno);
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw SystemError("create snapshot folder " + dir, errno);
  std::vector<std::string> check{dir};
  if (per_user_parent) check.push_back(d.parent_path().string());
  for (const auto& c : check) {
    const std::string why = private_dir_problem(c);
    if (!why.empty()) GZ_THROW(Error, "snapshot folder ", c, " ", why, ": not used");
  }
}

// ".snap-<step>-<run>.bin.tmp-<pid>-<nonce>-<n>": unique per writer, also between two processes with
// the same pid in different pid namespaces that share /dev/shm (the nonce).
std::string temp_path_for(const std::string& final_path) {
  static const std::string nonce = [] {
    std::random_device rd;
    char hex[20];
    std::snprintf(hex, sizeof hex, "%08x%08x", rd(), rd());
    return std::string(hex);
  }();
  static std::atomic<unsigned> counter{0};
  const fs::path p(final_path);
  return (p.parent_path() / detail::concat(".", p.filename().string(), ".tmp-", ::getpid(), "-", nonce, "-",
                                           counter.fetch_add(1)))
      .string();
}

// A temp file whose writer is gone: its process no longer exists and the file has not been
// written to for a minute. Both, because a pid from another pid namespace (a container sharing
// /dev/shm) may look dead while its writer is alive; a live writer touches its file with every
// write(). Removing a live writer's temp file would fail its rename and end its snapshots.
bool abandoned_temp(const fs::path& file) {
  const std::string name = file.filename().string();
  const auto at = name.rfind(".tmp-");
  if (at == std::string::npos) return false;
  const long pid = std::atol(name.c_str() + at + 5);
  if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
    return false;
  std::error_code ec;
  const auto written = fs::last_write_time(file, ec);
  return !ec && fs::file_time_type::clock::now() - written > std::chrono::minutes(1);
}

// "run-<run, 16 hex digits>.lock"
std::string lock_path(const std::string& dir, uint64_t run) {
  char name[32];
  std::snprintf(name, sizeof name, "run-%016llx.lock", static_cast<unsigned long long>(run));
  return (fs::path(dir) / name).string();
}

// Whether a process holds `run`'s lock. A lock file nobody holds is removed (its run is over).
bool run_alive(const std::string& dir, uint64_t run) {
  const std::string file = lock_path(dir, run);
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno != ENOENT;  // no lock file: over; any other failure: keep its files
  int rc;
  while ((rc = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  const bool alive = rc != 0;  // held (EWOULDBLOCK), or unknown: keep its files
  // Unlink only the file we hold: another probe may have removed it since we opened it, and the
  // name may now be a holder's new lock file (hold_run_lock() makes one when its file is gone).
  struct stat held {
  }, named{};
  if (!alive && ::fstat(fd, &held) == 0 && held.st_nlink > 0 && ::stat(file.c_str(), &named) == 0 &&
      named.st_dev == held.st_dev && named.st_ino == held.st_ino)
    ::unlink(file.c_str());
  ::close(fd);
  return alive;
}

}  // namespace

uint64_t stable_hash(const std::string& text) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001B3ULL;
  return h;
}

std::string snapshot_run_id(const Env& env) {
  const std::string run = env.get("GZ_RUN_ID", "");
  if (!run.empty()) {
    const std::string round = "-" + env.get("GZ_RESTART_COUNT", "");
    const bool suffixed = round.size() > 1 && run.size() > round.size() &&
                          run.compare(run.size() - round.size(), round.size(), round) == 0;
    return "gzrun:" + (suffixed ? run.substr(0, run.size() - round.size()) : run);
  }
  const std::string torchrun = env.get("TORCHELASTIC_RUN_ID", "");
  return torchrun.empty() || torchrun == "none" ? std::string() : "torchrun:" + torchrun;
}

SnapshotStore::SnapshotStore(std::string dir, int keep, uint64_t run, int owner)
    : dir_(std::move(dir)), keep_(std::max(1, keep)), run_(run), owner_(std::max(-1, owner)) {}

namespace {
// "snap-<step, 12 digits>-<run, 16 hex digits>.bin", a rank's shard "...-r<rank, 6 digits>.bin".
std::string file_name(int64_t step, uint64_t run, int64_t owner) {
  char name[64];
  if (owner < 0)
    std::snprintf(name, sizeof name, "snap-%012lld-%016llx.bin", static_cast<long long>(step),
                  static_cast<unsigned long long>(run));
  else
    std::snprintf(name, sizeof name, "snap-%012lld-%016llx-r%06lld.bin", static_cast<long long>(step),
                  static_cast<unsigned long long>(run), static_cast<long long>(owner));
  return name;
}
}  // namespace

std::string SnapshotStore::path(int64_t step) const {
  return (fs::path(dir_) / file_name(step, run_, owner_)).string();
}

void SnapshotStore::write(const SnapshotHeader& header, const std::string& payload) const {
  ensure_private_dir(dir_);
  std::error_code ec;
  const std::string final_path = path(header.step), tmp = temp_path_for(final_path);
  FileHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.step = header.step;
  h.epoch = header.epoch;
  h.world = header.world;
  h.fingerprint = header.fingerprint;
  h.run = run_;
  h.payload_bytes = payload.size();
  h.payload_hash = payload_hash(payload);
  h.rank = owner_;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw SystemError("create snapshot " + tmp, errno);
  try {
    write_all(fd, reinterpret_cast<const char*>(&h), sizeof h, tmp);
    write_all(fd, payload.data(), payload.size(), tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  // No fsync: a snapshot guards against lost processes and nodes, not power loss (disk
  // checkpoints do that); rename() alone makes it whole or absent to every reader.
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw SystemError("rename snapshot " + tmp + " to " + final_path, err);
  }
  // This run's older generations (another job sharing the folder keeps its own) and temp files
  // of writers that died in the middle of a write (never those of a live writer).
  const auto kept = steps();
  for (size_t i = static_cast<size_t>(keep_); i < kept.size(); ++i)
    if (kept[i] != header.step) fs::remove(path(kept[i]), ec);
  for (auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".snap-", 0) == 0 && abandoned_temp(entry.path())) fs::remove(entry.path(), ec);
  }
}

std::vector<int64_t> SnapshotStore::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return out;
  if (const std::string why = private_dir_problem(dir_); !why.empty()) {
    GZ_LOG(warn, "snapshot folder ", dir_, " ", why, ": its snapshots are not used");
    return out;
  }
  for (auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("snap-", 0) != 0) continue;
    const int64_t step = std::atoll(name.c_str() + 5);
    if (name != file_name(step, run_, owner_)) continue;  // another run's, or another owner's
    auto h = read_header(entry.path().string());
    if (h && h->step == step && h->run == run_ && h->rank == owner_) out.push_back(h->step);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::string SnapshotStore::read(int64_t step, uint64_t fingerprint, SnapshotHeader* header) const {
  const std::string file = path(step);
  auto h = read_header(file);
  if (!h) GZ_THROW(Error, "snapshot ", file, " is missing, truncated or not a snapshot");
  if (h->step != step)
    GZ_THROW(InvalidArgument, "snapshot ", file, " is of step ", h->step, ", not ", step, ": refused");
  if (h->run != run_)
    GZ_THROW(InvalidArgument, "snapshot ", file, " of step ", step, " was written by another run: refused");
  if (h->rank != owner_)
    GZ_THROW(InvalidArgument, "snapshot ", file, " of step ", step, " holds rank ", h->rank, "'s state, not ",
             owner_, "'s: refused");
  if (h->fingerprint != fingerprint)
    GZ_THROW(InvalidArgument, "snapshot ", file, " of step ", step,
             " was written by another config (fingerprint ", h->fingerprint, ", this run's ", fingerprint,
             "): refused; remove the folder or set snapshot_dir to start clean");
  std::string all = read_file(file);
  std::string payload = all.substr(sizeof(FileHeader));
  if (payload.size() != h->payload_bytes || payload_hash(payload) != h->payload_hash)
    GZ_THROW(Error, "snapshot ", file, " is damaged (its payload does not match its hash): refused");
  if (header) *header = SnapshotHeader{h->step, h->epoch, h->world, h->fingerprint, h->run, h->rank};
  return payload;
}

std::optional<SnapshotHeader> SnapshotStore::header(int64_t step) const {
  const auto h = read_header(path(step));
  if (!h) return std::nullopt;
  return SnapshotHeader{h->step, h->epoch, h->world, h->fingerprint, h->run, h->rank};
}

void SnapshotStore::remove_snapshots() const {
  // Only this run's snapshots: another job may share the folder (a sweep with one snapshot_dir).
  std::error_code ec;
  for (int64_t step : steps()) fs::remove(path(step), ec);
}

void SnapshotStore::remove_all() {
  remove_snapshots();
  std::error_code ec;
  if (run_lock_) {
    run_lock_.reset();
    run_alive(dir_, run_);  // removes the lock file unless a copy or another process still holds it
  }
  fs::remove(dir_, ec);  // only when empty
}

void SnapshotStore::hold_run_lock() {
  if (run_lock_) return;
  ensure_private_dir(dir_);
  const std::string file = lock_path(dir_, run_);
  for (;;) {
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) throw SystemError("create snapshot run lock " + file, errno);
    // Blocking: another run's probe (run_alive) holds it exclusively for an instant.
    while (::flock(fd, LOCK_SH) != 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw SystemError("lock snapshot run lock " + file, err);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw SystemError("stat snapshot run lock " + file, err);
    }
    if (st.st_nlink > 0) {
      run_lock_ = std::shared_ptr<const int>(new int(fd), [](const int* p) {
        ::close(*p);
        delete p;
      });
      return;
    }
    ::close(fd);  // a probe removed it while we waited: make it again
  }
}

int SnapshotStore::remove_other_runs() const {
  std::error_code ec;
  if (!fs::exists(dir_, ec) || !private_dir_problem(dir_).empty()) return 0;
  int removed = 0;
  for (auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("run-", 0) == 0 && name != fs::path(lock_path(dir_, run_)).filename().string()) {
      run_alive(dir_, std::strtoull(name.c_str() + 4, nullptr, 16));  // removes a finished run's lock
      continue;
    }
    if (name.rfind("snap-", 0) != 0) continue;
    const auto h = read_header(entry.path().string());
    // This run's files of every owner (the ranks of a ZeRO job share the node's folder).
    if (h && h->run == run_ && name == file_name(h->step, run_, h->rank)) continue;
    // A live job sharing the folder (a sweep); a file of this run under a wrong name goes.
    if (h && h->run != run_ && run_alive(dir_, h->run)) continue;
    if (fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

std::vector<SnapshotHeader> SnapshotStore::shard_headers() const {
  std::vector<SnapshotHeader> out;
  std::error_code ec;
  if (!fs::exists(dir_, ec) || !private_dir_problem(dir_).empty()) return out;
  for (auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("snap-", 0) != 0) continue;
    const auto h = read_header(entry.path().string());
    if (h && h->run == run_ && h->rank >= 0 && name == file_name(h->step, run_, h->rank))
      out.push_back(SnapshotHeader{h->step, h->epoch, h->world, h->fingerprint, h->run, h->rank});
  }
  return out;
}

int SnapshotStore::remove_other_worlds(int world) const {
  std::error_code ec;
  int removed = 0;
  for (auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().filename().string().rfind("snap-", 0) != 0) continue;
    const auto h = read_header(entry.path().string());
    if (!h || h->run != run_ || h->rank < 0 || h->world == world) continue;
    if (fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

SnapshotWriter::SnapshotWriter(const SnapshotStore& store) : store_(store), thread_([this] { loop(); }) {}

SnapshotWriter::~SnapshotWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !job_ && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SnapshotWriter::rethrow_locked() {
  if (error_.empty()) return;
  std::string e;
  e.swap(error_);
  GZ_THROW(Error, "writing a snapshot failed: ", e);
}

void SnapshotWriter::submit(const SnapshotHeader& header, std::string payload) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !job_ && !busy_; });
  rethrow_locked();
  job_.emplace(
      Job{header, [p = std::move(payload)](std::string& out) mutable { out = std::move(p); }, false});
  cv_.notify_all();
}

void SnapshotWriter::submit(const SnapshotHeader& header, PayloadFn make_payload) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !job_; });
  rethrow_locked();
  job_.emplace(Job{header, std::move(make_payload), true});
  cv_.notify_all();
}

void SnapshotWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !job_ && !busy_; });
  rethrow_locked();
}

std::pair<double, int64_t> SnapshotWriter::work() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {seconds_, writes_};
}

void SnapshotWriter::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || job_.has_value(); });
    if (!job_) return;
    auto job = std::move(*job_);
    job_.reset();
    busy_ = true;
    cv_.notify_all();  // a submit waiting for the queue may go on
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      payload_.clear();
      job.make(payload_);
      job.make = nullptr;  // what the payload was made from is no longer needed
      store_.write(job.header, payload_);
    } catch (const std::exception& e) {
      error = e.what();
    }
    job.make = nullptr;
    payload_.clear();
    if (!job.keep_buffer) std::string().swap(payload_);  // a caller's bytes: not kept around
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    lock.lock();
    busy_ = false;
    seconds_ += took.count();
    ++writes_;
    if (!error.empty()) error_ = error;
    cv_.notify_all();
  }
}

}  // namespace gz::train
