// Runs the real gzrun binary from tests: temp dirs, a child with captured output, waits with
// deadlines, and checks that processes are gone.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gz::test {

inline const std::string kGzrun = GZ_BUILD_DIR "/tools/gzrun/gzrun";
inline const std::string kWorker = GZ_BUILD_DIR "/tests/launcher/gzrun_test_worker";

/// @brief A fresh directory under $TMPDIR (or /tmp), removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/gzrun_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    nftw(
        path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

/// @brief Whether loopback port `port` can be bound right now (0: any; *bound gets the port).
inline bool port_is_free(int port, int* bound = nullptr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  socklen_t len = sizeof sa;
  if (ok && bound && getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    *bound = ntohs(sa.sin_port);
  ::close(fd);
  return ok;
}

/// @brief A loopback port free right now, or -1 (multi-node needs a port known in advance; a rare
/// race is tolerated by the tests that use it).
inline int free_port() {
  int port = -1;
  return port_is_free(0, &port) ? port : -1;
}

inline std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '\n') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

/// @brief True when pid no longer exists or is only a zombie nobody reaped (containers whose
/// init does not reap).
inline bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto rp = stat.rfind(')');
  return rp != std::string::npos && rp + 2 < stat.size() && stat[rp + 2] == 'Z';
}

/// @brief Poll until every pid is gone or `seconds` pass; returns the ones still alive.
inline std::vector<pid_t> wait_gone(const std::vector<pid_t>& pids, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    std::vector<pid_t> alive;
    for (pid_t p : pids)
      if (!process_gone(p)) alive.push_back(p);
    if (alive.empty() || std::chrono::steady_clock::now() >= end) return alive;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// @brief gzrun running as a child of the test, its stdout/stderr captured in files.
class GzrunProcess {
 public:
  GzrunProcess(const std::vector<std::string>& args, const TempDir& dir,
               const std::map<std::string, std::string>& set_env = {},
               const std::vector<std::string>& unset_env = {"OMP_NUM_THREADS", "GZ_RDZV_TOKEN"}) {
    static int counter = 0;
    std::string tag = std::to_string(counter++);
    out_path_ = dir.file("gzrun_out_" + tag);
    err_path_ = dir.file("gzrun_err_" + tag);
    std::vector<std::string> argv_s{kGzrun};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    start_ = std::chrono::steady_clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0) _exit(120);
      dup2(out, 1);
      dup2(err, 2);
      for (const auto& k : unset_env) unsetenv(k.c_str());
      for (const auto& [k, v] : set_env) setenv(k.c_str(), v.c_str(), 1);
      execv(argv[0], argv.data());
      _exit(121);
    }
  }
  ~GzrunProcess() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

  /// @brief Wait up to `seconds`; on timeout gzrun is SIGKILLed and false is returned.
  bool wait(double seconds) {
    auto end = start_wait_deadline(seconds);
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = st;
        done_ = true;
        elapsed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        return true;
      }
      if (std::chrono::steady_clock::now() >= end) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        status_ = st;
        done_ = true;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  /// @brief gzrun's exit code (-1 when it did not exit normally).
  int exit_code() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1; }
  double elapsed_s() const { return elapsed_s_; }
  std::string out() const { return read_file(out_path_); }
  std::string err() const { return read_file(err_path_); }
  std::string describe() const { return "gzrun stdout:\n" + out() + "\ngzrun stderr:\n" + err(); }

 private:
  std::chrono::steady_clock::time_point start_wait_deadline(double seconds) const {
    return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                  std::chrono::duration<double>(seconds));
  }
  pid_t pid_ = -1;
  int status_ = 0;
  bool done_ = false;
  double elapsed_s_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::string out_path_, err_path_;
};

/// @brief "[r] KEY=VALUE" lines of the env worker -> rank -> key -> value.
inline std::map<int, std::map<std::string, std::string>> parse_env_output(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> m;
  for (const auto& line : split_lines(out)) {
    if (line.size() < 4 || line[0] != '[') continue;
    auto close = line.find("] ");
    if (close == std::string::npos) continue;
    int rank = std::stoi(line.substr(1, close - 1));
    std::string kv = line.substr(close + 2);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    m[rank][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}

}  // namespace gz::test
