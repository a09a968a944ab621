// A real etcd cluster for tests: N members on free loopback ports, data on tmpfs, started by the
// test and killed when it ends. Members can be killed, stopped (SIGSTOP: silent, like a cut
// cable) and started again. Needs Debian's etcd-server (`etcd` in PATH or /usr/bin/etcd).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gz/store/etcd_store.h"

namespace gz::test {

/// @brief Path of the etcd binary, or "" when etcd is not installed.
inline std::string etcd_binary() {
  if (const char* e = std::getenv("GZ_ETCD_BIN"); e && *e) return access(e, X_OK) == 0 ? e : "";
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

inline std::string etcdctl_binary() {
  for (const char* p : {"/usr/bin/etcdctl", "/usr/local/bin/etcdctl"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

/// @brief A loopback port nobody listens on right now.
inline int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    port = ntohs(sa.sin_port);
  ::close(fd);
  return port;
}

/// @brief Extra settings of the members.
struct EtcdClusterOptions {
  int members = 1;
  /// @brief https: the members' certificate and key (the CA is the test's), and
  /// --client-cert-auth with `client_ca` when set.
  std::string cert_file, key_file, client_ca;
  std::vector<std::string> extra_args;  ///< e.g. {"--auth-token-ttl", "1"}
};

class EtcdCluster {
 public:
  explicit EtcdCluster(EtcdClusterOptions o = {}) : o_(std::move(o)) {
    static int seq = 0;
    dir_ = "/dev/shm/gz-etcd-test-" + std::to_string(::getpid()) + "-" + std::to_string(seq++);
    // The ports are free when picked, not when etcd binds them: another process (a parallel
    // test's etcd) may take one in between. A member that dies at start is tried again on new ports.
    for (int attempt = 0;; ++attempt) {
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      members_.clear();
      std::string initial;
      for (int i = 0; i < o_.members; ++i) {
        Member m;
        m.name = "m" + std::to_string(i);
        m.client_port = free_loopback_port();
        m.peer_port = free_loopback_port();
        initial += (i ? "," : "") + m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
        members_.push_back(m);
      }
      initial_ = initial;
      for (int i = 0; i < o_.members; ++i) start(i);
      if (listening() || attempt == 2) break;
      for (int i = 0; i < o_.members; ++i) kill(i);
    }
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) kill(static_cast<int>(i));
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  std::string endpoint(int i) const {
    return std::string(o_.cert_file.empty() ? "http" : "https") +
           "://127.0.0.1:" + std::to_string(members_[static_cast<size_t>(i)].client_port);
  }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int i = 0; i < o_.members; ++i) out.push_back(endpoint(i));
    return out;
  }
  /// @brief "http://127.0.0.1:p1,http://..." for etcdctl.
  std::string endpoint_list() const {
    std::string out;
    for (int i = 0; i < o_.members; ++i) out += (i ? "," : "") + endpoint(i);
    return out;
  }
  int size() const { return o_.members; }

  /// @brief Start member i (again): its data directory is kept, so it rejoins.
  void start(int i) {
    Member& m = members_[static_cast<size_t>(i)];
    const std::string scheme = o_.cert_file.empty() ? "http" : "https";
    const std::string curl = scheme + "://127.0.0.1:" + std::to_string(m.client_port);
    const std::string purl = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::vector<std::string> args = {
        etcd_binary(), "--name", m.name, "--data-dir", dir_ + "/" + m.name, "--listen-client-urls", curl,
        "--advertise-client-urls", curl, "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
        "--initial-cluster", initial_, "--initial-cluster-state", "new", "--initial-cluster-token",
        "gz-test-" + std::to_string(::getpid()),
        // etcd's default timing: faster elections flap on a loaded machine.
        "--heartbeat-interval", "100", "--election-timeout", "1000", "--max-request-bytes", "8388608"};
    if (!o_.cert_file.empty()) {
      args.insert(args.end(), {"--cert-file", o_.cert_file, "--key-file", o_.key_file});
      if (!o_.client_ca.empty())
        args.insert(args.end(), {"--client-cert-auth", "--trusted-ca-file", o_.client_ca});
    }
    args.insert(args.end(), o_.extra_args.begin(), o_.extra_args.end());
    const std::string log = dir_ + "/" + m.name + ".log";
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no member outlives a crashed test
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    m.pid = pid;
  }
  /// @brief Whether every member listens on its client port (within 20 s); false as soon as one
  /// has exited.
  bool listening() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (Member& m : members_) {
      for (;;) {
        if (::waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
          m.pid = -1;
          return false;
        }
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sa.sin_port = htons(static_cast<uint16_t>(m.client_port));
        const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
        ::close(fd);
        if (ok) break;
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return true;
  }
  /// @brief SIGKILL member i and reap it.
  void kill(int i) {
    Member& m = members_[static_cast<size_t>(i)];
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGCONT);
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
  void stop(int i) { ::kill(members_[static_cast<size_t>(i)].pid, SIGSTOP); }
  void resume(int i) { ::kill(members_[static_cast<size_t>(i)].pid, SIGCONT); }

  /// @brief Options of a client of this cluster under a fresh prefix (tests do not see each other's keys).
  EtcdStoreOptions client_options() const {
    static int n = 0;
    EtcdStoreOptions o;
    o.endpoints = endpoints();
    o.prefix = "/gz-test/" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    o.timeout = std::chrono::seconds(20);
    o.attempt_timeout = std::chrono::milliseconds(1000);
    return o;
  }
  /// @brief The members' logs (the last lines of each), for failure messages.
  std::string logs(size_t lines = 15) const {
    std::string out;
    for (const auto& m : members_) {
      std::ifstream f(dir_ + "/" + m.name + ".log");
      std::vector<std::string> all;
      for (std::string l; std::getline(f, l);) all.push_back(l);
      out += "---- etcd " + m.name + "\n";
      for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += all[i] + "\n";
    }
    return out;
  }
  /// @brief Run etcdctl against the cluster; returns its exit status (output in `out`).
  int etcdctl(const std::string& args, std::string* out = nullptr, const std::string& extra = "") const {
    std::string cmd = "ETCDCTL_API=3 " + etcdctl_binary() + " --endpoints=" + endpoint_list() + " " + extra +
                      " " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::string text;
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
    int st = ::pclose(p);
    if (out) *out = text;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  const std::string& dir() const { return dir_; }

 private:
  struct Member {
    std::string name;
    int client_port = 0, peer_port = 0;
    pid_t pid = -1;
  };
  EtcdClusterOptions o_;
  std::string dir_;
  std::string initial_;
  std::vector<Member> members_;
};

/// @brief One etcd member shared by every test of this process (started on first use).
inline EtcdCluster& shared_etcd() {
  static std::unique_ptr<EtcdCluster> c = std::make_unique<EtcdCluster>();
  return *c;
}

}  // namespace gz::test
