// The dump thread: woken by a failed op, SIGUSR1 or a call, it copies every recorder and writes
// the process's dump file. The training thread never does more than wake it; the signal handler
// only stores two words and writes one byte to a pipe (both async-signal-safe).
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/flight/registry.h"
#include "gz/comm/flight_dump.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"

namespace gz::comm {

namespace {

// Touched by the signal handler: lock-free atomics and plain ints only.
std::atomic<int> g_wake_fd{-1};
std::atomic<pid_t> g_owner{0};  // the process that started the service (not a forked child)
std::atomic<bool> g_signal_pending{false};
std::atomic<int64_t> g_signal_request{0};

void on_dump_signal(int, siginfo_t* si, void*) {
  const int saved = errno;
  if (g_owner.load(std::memory_order_relaxed) == getpid()) {
    // gzrun sends sigqueue(SIGUSR1, request number); `kill -USR1` carries none (request 0).
    g_signal_request.store(si && si->si_code == SI_QUEUE ? si->si_value.sival_int : 0,
                           std::memory_order_relaxed);
    g_signal_pending.store(true, std::memory_order_release);
    const int fd = g_wake_fd.load(std::memory_order_relaxed);
    if (fd >= 0) {
      const char c = 's';
      [[maybe_unused]] ssize_t n = ::write(fd, &c, 1);  // full pipe: a wake-up is pending anyway
    }
  }
  errno = saved;
}

// mkdir -p; best effort (the write that follows reports what failed).
void make_dirs(const std::string& path) {
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    const std::string cur = path.substr(0, pos);
    if (::mkdir(cur.c_str(), 0755) == 0 && cur == "/tmp/gz-dumps")
      ::chmod(cur.c_str(), 01777);  // shared, like /tmp
  }
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SystemError("flight recorder: cannot write " + tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw SystemError("flight recorder: cannot write " + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw SystemError("flight recorder: cannot rename " + tmp + " to " + path, err);
  }
}

class DumpService;
DumpService& service();

class DumpService {
 public:
  void start() {
    std::call_once(once_, [this] { start_once(); });
  }

  void request(DumpReason reason, int64_t request, const std::string& note) {
    if (!running_.load() || g_owner.load() != getpid()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++asked_;
      // A failure outranks a plain request in the header; the highest request number wins.
      if (!pending_ || reason == DumpReason::failure) reason_ = reason;
      if (request > request_) request_ = request;
      if (!note.empty()) note_ = note;
      pending_ = true;
    }
    wake();
  }

  bool flush(Duration timeout) {
    if (g_owner.load() != getpid()) return true;
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = asked_;
    return cv_.wait_for(lock, timeout, [&] { return served_ >= target || !running_.load(); });
  }

  uint64_t written() const { return written_.load(); }

  /// The ready file under this process's identity now (after a move), if it answers SIGUSR1.
  void rewrite_ready() {
    if (!running_.load() || g_owner.load() != getpid() || !signal_ready_.load()) return;
    make_dirs(flight_dump_dir());
    write_file(flight_ready_path(), std::to_string(getpid()) + "\n");
  }

  void stop_at_exit() {
    // A forked child inherits this object but not the thread.
    if (!running_.load() || g_owner.load() != getpid()) return;
    const long long ms = Env::from_process().get_int("GZ_DUMP_EXIT_WAIT_MS", 3000);
    flush(Duration(ms < 0 ? 0 : ms));
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake();
    if (thread_.joinable()) thread_.join();
    running_ = false;
  }

 private:
  void start_once() {
    const Env env = Env::from_process();
    if (!env.get_bool("GZ_DUMP", true)) return;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      GZ_LOG(warn, "flight recorder: no dump thread (pipe: ", std::strerror(errno), ")");
      return;
    }
    pipe_[0] = fds[0];
    pipe_[1] = fds[1];
    g_wake_fd.store(fds[1]);
    g_owner.store(getpid());
    running_ = true;
    // The handler before the thread, which writes the ready file only when there is one. A forked
    // child (a data-loader worker) has no dump thread: its handler ignores the signal.
    if (env.get_bool("GZ_DUMP_SIGNAL", true)) install_handler();
    thread_ = std::thread([this] { loop(); });
    std::atexit([] { service().stop_at_exit(); });
  }

  void install_handler() {
    struct sigaction old {};
    if (sigaction(SIGUSR1, nullptr, &old) != 0) return;
    // The program's own SIGUSR1 handler wins: no ready file, so gzrun will not signal it.
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_sigaction = on_dump_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, nullptr) != 0) return;
    signal_ready_ = true;
  }

  void wake() {
    const char c = 'r';
    [[maybe_unused]] ssize_t n = ::write(pipe_[1], &c, 1);
  }

  void loop() {
    // The ready file first: from now on SIGUSR1 means "dump", not "terminate".
    if (signal_ready_) {
      try {
        make_dirs(flight_dump_dir());
        write_file(flight_ready_path(), std::to_string(getpid()) + "\n");
      } catch (const std::exception& e) {
        GZ_LOG(warn, "flight recorder: ", e.what());
      }
    }
    for (;;) {
      pollfd p{pipe_[0], POLLIN, 0};
      ::poll(&p, 1, 1000);
      char buf[64];
      while (::read(pipe_[0], buf, sizeof buf) > 0) {
      }
      DumpReason reason = DumpReason::request;
      int64_t request = 0;
      std::string note;
      uint64_t target;
      bool any = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_) {
          any = true;
          reason = reason_, request = request_, note = note_;
          pending_ = false;
          reason_ = DumpReason::request, request_ = 0, note_.clear();
        }
        target = asked_;
        if (stop_ && !any && !g_signal_pending.load()) return;
      }
      if (g_signal_pending.exchange(false, std::memory_order_acquire)) {
        const int64_t r = g_signal_request.load(std::memory_order_relaxed);
        if (!any || reason != DumpReason::failure) reason = DumpReason::signal;
        if (r > request) request = r;
        any = true;
      }
      if (!any) continue;
      try {
        write_flight_dump(reason, request, note);
        written_.fetch_add(1);
      } catch (const std::exception& e) {
        GZ_LOG(warn, "flight recorder: dump failed: ", e.what());
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (served_ < target) served_ = target;
      cv_.notify_all();
    }
  }

  std::once_flag once_;
  std::atomic<bool> running_{false};
  std::atomic<bool> signal_ready_{false};
  int pipe_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t asked_ = 0, served_ = 0;
  bool pending_ = false, stop_ = false;
  DumpReason reason_ = DumpReason::request;
  int64_t request_ = 0;
  std::string note_;
  std::atomic<uint64_t> written_{0};
};

DumpService& service() {
  static DumpService* s = new DumpService();  // never destroyed: the thread is joined at exit
  return *s;
}

}  // namespace

std::vector<FlightSnapshot> flight_snapshots(size_t max_records) {
  return flight_registry().snapshots(max_records);
}

std::string write_flight_dump(DumpReason reason, int64_t request, const std::string& note) {
  const long long limit = Env::from_process().get_int("GZ_DUMP_RECORDS", 0);
  const std::string text =
      format_flight_dump(flight_snapshots(limit > 0 ? static_cast<size_t>(limit) : 0), reason, request, note);
  const std::string path = flight_dump_path();
  make_dirs(flight_dump_dir());
  write_file(path, text);
  return path;
}

void request_flight_dump(DumpReason reason, int64_t request, const std::string& note) {
  service().request(reason, request, note);
}

bool flush_flight_dumps(Duration timeout) { return service().flush(timeout); }

uint64_t flight_dumps_written() { return service().written(); }

void set_moved_identity(const FlightDumpIdentity& id);  // dump_format.cpp

void set_flight_dump_identity(const FlightDumpIdentity& id) {
  set_moved_identity(id);
  try {
    service().rewrite_ready();
  } catch (const std::exception& e) {
    GZ_LOG(warn, "flight recorder: ", e.what());
  }
}

void start_flight_dump_service() { service().start(); }

}  // namespace gz::comm
