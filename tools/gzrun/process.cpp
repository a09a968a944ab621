#include "process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "gz/core/error.h"

namespace gz::launcher {
namespace {

// Async-signal-safe message for the child after fork.
void child_write(const char* s) {
  ssize_t ignored = ::write(2, s, strlen(s));
  (void)ignored;
}

void child_write_int(int v) {
  char buf[16];
  int i = sizeof buf;
  buf[--i] = '\0';
  unsigned u = v < 0 ? 0u - static_cast<unsigned>(v) : static_cast<unsigned>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u && i > 1);
  if (v < 0 && i > 0) buf[--i] = '-';
  child_write(buf + i);
}

[[noreturn]] void child_exec(const SpawnRequest& r, char* const* argv, char* const* envp, pid_t parent) {
  // Own process group: gzrun signals the whole group, and a terminal's Ctrl-C reaches only
  // gzrun, which forwards it.
  setpgid(0, 0);
  // Die with gzrun even if it is SIGKILLed; re-check the parent in case it already died
  // between fork() and prctl().
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(128 + SIGKILL);
  // Undo gzrun's handlers and ignored signals (SIG_IGN survives exec), then unblock.
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(s, &sa, nullptr);
  }
  if (r.stdin_fd >= 0 && dup2(r.stdin_fd, 0) < 0) _exit(127);
  if (r.stdout_fd >= 0 && dup2(r.stdout_fd, 1) < 0) _exit(127);
  if (r.stderr_fd >= 0 && dup2(r.stderr_fd, 2) < 0) _exit(127);
  // Only 0-2 survive: sockets of the store server or other workers' pipes must not leak.
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
#endif
  {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536) max = 65536;
    for (int fd = 3; fd < max; ++fd) close(fd);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(r.path.c_str(), argv, envp);
  int err = errno;
  child_write("gzrun: cannot execute '");
  child_write(r.path.c_str());
  child_write("': ");
  switch (err) {  // strerror() is not async-signal-safe
    case ENOEXEC: child_write("exec format error (a script without a #! line?)"); break;
    case EACCES: child_write("permission denied"); break;
    case ENOENT: child_write("no such file or directory (or a missing interpreter)"); break;
    case E2BIG: child_write("argument list too long"); break;
    case ENOMEM: child_write("out of memory"); break;
    default: child_write("errno "); child_write_int(err);
  }
  child_write("\n");
  _exit(127);
}

int g_signal_write_fd = -1;
int g_signal_read_fd = -1;

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_write_fd >= 0) {
    ssize_t ignored = ::write(g_signal_write_fd, &b, 1);
    (void)ignored;
  }
  errno = saved;
}

// SIGUSR1: print where every rank is (verdict_report.h), the job goes on.
constexpr int kCaught[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1};

}  // namespace

pid_t spawn_worker(const SpawnRequest& r) {
  std::vector<char*> argv, envp;
  for (const auto& a : r.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : r.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  // Block everything across fork so no gzrun handler runs in the child before exec.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) child_exec(r, argv.data(), envp.data(), parent);
  int err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) throw SystemError("fork failed for " + r.path, err);
  // Also from the parent: whichever of the two setpgid calls runs first wins the race with
  // the first kill(-pid, ...).
  setpgid(pid, pid);
  return pid;
}

std::string resolve_program(const std::string& program, const std::string& path_var) {
  if (program.empty()) GZ_THROW(InvalidArgument, "empty program name");
  auto executable = [](const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (executable(program)) return program;
    struct stat st;
    if (::stat(program.c_str(), &st) != 0)
      GZ_THROW(InvalidArgument, "program '", program, "' not found: ", strerror(errno));
    GZ_THROW(InvalidArgument, "program '", program, "' is not an executable file");
  }
  std::string path = path_var.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_var;
  size_t start = 0;
  for (;;) {
    size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";  // empty PATH element = current directory, as execvp does
    std::string candidate = dir + "/" + program;
    if (executable(candidate)) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  GZ_THROW(InvalidArgument, "program '", program, "' not found in PATH (", path, ")");
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    std::string d = "killed by signal " + std::to_string(s) + " (" + signal_name(s) + ")";
    if (WCOREDUMP(status)) d += ", core dumped";
    return d;
  }
  return "ended with wait status " + std::to_string(status);
}

std::string unexpected_death_hint(int status) {
  // Nothing else kills a worker with SIGKILL unasked but a person or a supervisor: the OOM killer
  // is the usual culprit, and the bare signal number says nothing about memory.
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
    return "; gzrun did not send that SIGKILL: possibly killed for lack of memory (the kernel's OOM "
           "killer, or a memory cgroup's limit; see dmesg)";
  return "";
}

std::vector<pid_t> list_children(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || !end || *end) continue;
    std::string path = std::string("/proc/") + e->d_name + "/stat";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[1024];
    ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    // "pid (comm) state ppid ...": comm may contain spaces and parentheses, so parse after the last ')'.
    char* rp = strrchr(buf, ')');
    if (!rp) continue;
    char state = 0;
    long ppid = -1;
    if (sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent) out.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return out;
}

void ensure_std_fds() {
  for (int fd = 0; fd < 3; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int n = ::open("/dev/null", O_RDWR);
    if (n >= 0 && n != fd) {
      dup2(n, fd);
      close(n);
    }
  }
}

SignalPipe::SignalPipe() {
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) throw SystemError("pipe2 for signals", errno);
  g_signal_read_fd = p[0];
  g_signal_write_fd = p[1];
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int s : kCaught) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

SignalPipe::~SignalPipe() {
  for (int s : kCaught) signal(s, SIG_DFL);
  int w = g_signal_write_fd;
  g_signal_write_fd = -1;
  close(w);
  close(g_signal_read_fd);
  g_signal_read_fd = -1;
}

int SignalPipe::fd() const { return g_signal_read_fd; }

std::vector<int> SignalPipe::take() {
  std::vector<int> out;
  unsigned char buf[64];
  for (;;) {
    ssize_t r = ::read(g_signal_read_fd, buf, sizeof buf);
    if (r > 0) {
      for (ssize_t i = 0; i < r; ++i) out.push_back(buf[i]);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    break;
  }
  return out;
}

}  // namespace gz::launcher
