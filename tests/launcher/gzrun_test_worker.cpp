// Worker program the gzrun tests launch. One mode per behaviour under test:
//   env                      print the launcher variables as KEY=VALUE lines
//   exit CODE RANK           rank RANK exits with CODE after 100 ms, the others sleep 60 s
//   sigkill RANK             rank RANK kills itself with SIGKILL, the others sleep 60 s
//   spam LINES LEN           LINES lines to stdout and stderr, each written in several pieces
//   sleep DIR SECONDS [ignore-term]
//                            write DIR/pid_<rank> (own pid and a grandchild's), record signals
//                            in DIR/sig_<rank>, sleep; with ignore-term SIGTERM is ignored
//   fail-first CODE          exit CODE on attempt 0 (GZ_RESTART_COUNT), else print "ok" and exit 0
//   progress                 '\r' progress updates, then a line without '\n'
//   escape DIR               start a setsid()'d grandchild (pid in DIR/escaped_<rank>), exit 0
//   job DIR FAILRANK CODE FAIL_AFTER_S STEPS FAIL_ATTEMPTS
//                            a training job in miniature: resume from DIR/ckpt_<rank>, write
//                            DIR/pid_<rank>, run STEPS steps of 100 ms saving the checkpoint after
//                            each; rank FAILRANK exits CODE after FAIL_AFTER_S seconds on attempts
//                            below FAIL_ATTEMPTS (GZ_RESTART_COUNT), writing the wall-clock time in
//                            ns to DIR/failed_at first; prints "done rank=R attempt=A round=T ..."
//   inplace DIR VICTIM first|always|late
//                            --recovery in-place: write DIR/start_<rank>_<restart>_<replacement>
//                            (pid, GZ_RESTART_COUNT, GZ_REPLACEMENT, GZ_RECOVERY, GZ_RUN_ID) and
//                            print it; rank VICTIM SIGKILLs itself after 100 ms (first: only at
//                            its first start, restart 0 replacement 0; always: every start; late:
//                            at its first start, after 300 ms). In round 0 (every round with
//                            always) the others wait (10 s at most) for the victim's replacement
//                            of the round to start (late: not at all), then print "end rank=R
//                            pid=P" and exit 0
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

void write_str(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

// Deterministic payload so the test can verify every line byte for byte.
std::string payload(int rank, int i, int len) {
  std::string s;
  for (int k = 0; k < len; ++k) s += static_cast<char>('a' + (rank * 7 + i * 3 + k) % 26);
  return s;
}

// Whether MASTER_PORT is free for the program's rank 0 to bind (torch's TCPStore does).
bool master_port_free() {
  int port = env_int("MASTER_PORT");
  if (port <= 0) return false;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && ::listen(fd, 1) == 0;
  ::close(fd);
  return ok;
}

// Whether something accepts TCP connections on 127.0.0.1:GZ_STORE_PORT (the hosted store).
bool store_reachable() {
  int port = env_int("GZ_STORE_PORT");
  if (port <= 0) return false;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

const char* g_dir = nullptr;

void on_signal(int sig) {
  // Async-signal-safe: build the path and write with plain syscalls.
  char path[512];
  std::snprintf(path, sizeof path, "%s/sig_%d", g_dir, env_int("RANK"));
  int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    char line[32];
    int n = std::snprintf(line, sizeof line, "%d\n", sig);
    ssize_t ignored = ::write(fd, line, static_cast<size_t>(n));
    (void)ignored;
    ::close(fd);
  }
  _exit(0);
}

int mode_sleep(const char* dir, double seconds, bool ignore_term) {
  g_dir = dir;
  // A grandchild in the worker's process group: gzrun must not leave it behind either.
  pid_t child = fork();
  if (child == 0) {
    for (;;) pause();
  }
  if (ignore_term) {
    signal(SIGTERM, SIG_IGN);
  } else {
    signal(SIGTERM, on_signal);
  }
  signal(SIGINT, on_signal);
  signal(SIGHUP, on_signal);
  std::string path = std::string(dir) + "/pid_" + std::to_string(env_int("RANK"));
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return 3;
  std::fprintf(f, "%d %d\n", static_cast<int>(getpid()), static_cast<int>(child));
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());  // the test sees the file complete or not at all
  std::printf("sleeping\n");
  std::fflush(stdout);
  usleep(static_cast<useconds_t>(seconds * 1e6));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return 0;
}

long long wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
  }
}

int mode_job(const std::string& dir, int fail_rank, int code, double fail_after_s, int steps, int fail_attempts) {
  const int rank = env_int("RANK");
  const int attempt = env_int("GZ_RESTART_COUNT");
  const std::string ckpt = dir + "/ckpt_" + std::to_string(rank);
  int step = 0;
  if (FILE* f = std::fopen(ckpt.c_str(), "r")) {
    if (std::fscanf(f, "%d", &step) != 1) step = 0;
    std::fclose(f);
  }
  const int resumed = step;
  std::printf("start rank=%d attempt=%d resumed_at=%d\n", rank, attempt, resumed);
  std::fflush(stdout);
  write_file_atomically(dir + "/pid_" + std::to_string(rank), std::to_string(getpid()) + "\n");
  const long long t0 = wall_ns();
  for (; step < steps; ++step) {
    if (rank == fail_rank && attempt < fail_attempts && wall_ns() - t0 >= static_cast<long long>(fail_after_s * 1e9)) {
      write_file_atomically(dir + "/failed_at", std::to_string(wall_ns()) + "\n");
      std::fprintf(stderr, "rank %d failing on purpose at step %d\n", rank, step);
      return code;
    }
    usleep(100000);
    write_file_atomically(ckpt, std::to_string(step + 1) + "\n");
  }
  const char* tc = std::getenv("TORCHELASTIC_RESTART_COUNT");
  std::printf("done rank=%d attempt=%d round=%s resumed_at=%d steps=%d\n", rank, attempt, tc ? tc : "?", resumed, step);
  return 0;
}

int mode_env(int rank) {
  static const char* const kKeys[] = {"RANK",
                                      "LOCAL_RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK",
                                      "NODE_RANK",
                                      "ROLE_RANK",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "GZ_LAUNCHER",
                                      "GZ_STORE_HOSTED",
                                      "GZ_STORE_ADDR",
                                      "GZ_STORE_PORT",
                                      "GZ_NNODES",
                                      "GZ_RUN_ID",
                                      "GZ_RESTART_COUNT",
                                      "TORCHELASTIC_RESTART_COUNT",
                                      "OMP_NUM_THREADS",
                                      "GZ_RDZV_TOKEN",
                                      "GZ_RECOVERY",
                                      "GZ_REPLACEMENT"};
  for (const char* k : kKeys) {
    const char* v = std::getenv(k);
    std::printf("%s=%s\n", k, v ? v : "<unset>");
  }
  std::printf("PID=%d\n", static_cast<int>(getpid()));
  std::printf("PGID_IS_PID=%d\n", getpgrp() == getpid() ? 1 : 0);
  std::printf("STORE_REACHABLE=%d\n", store_reachable() ? 1 : 0);
  // Rank 0 only: several workers probing one port at once would see each other.
  if (rank == 0) std::printf("MASTER_PORT_FREE=%d\n", master_port_free() ? 1 : 0);
  return 0;
}

int mode_inplace(const std::string& dir, int victim, const std::string& when) {
  const bool always = when == "always", late = when == "late";
  const int rank = env_int("RANK"), restart = env_int("GZ_RESTART_COUNT"),
            replacement = env_int("GZ_REPLACEMENT");
  const char* recovery = std::getenv("GZ_RECOVERY");
  const char* run_id = std::getenv("GZ_RUN_ID");
  const std::string line =
      "start rank=" + std::to_string(rank) + " pid=" + std::to_string(getpid()) +
      " restart=" + std::to_string(restart) + " replacement=" + std::to_string(replacement) +
      " recovery=" + (recovery ? recovery : "<unset>") + " run_id=" + (run_id ? run_id : "<unset>");
  write_file_atomically(dir + "/start_" + std::to_string(rank) + "_" + std::to_string(restart) + "_" +
                            std::to_string(replacement),
                        line + "\n");
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (rank == victim) {
    if (always || (restart == 0 && replacement == 0)) {
      usleep(late ? 300000 : 100000);
      raise(SIGKILL);
    }
    return 0;
  }
  // Alive when the replacement starts: a survivor stopped and restarted would show a new pid.
  const std::string replaced =
      dir + "/start_" + std::to_string(victim) + "_" + std::to_string(restart) + "_1";
  for (int i = 0; !late && (restart == 0 || always) && i < 1000 && ::access(replaced.c_str(), F_OK) != 0; ++i)
    usleep(10000);
  std::printf("end rank=%d pid=%d\n", rank, static_cast<int>(getpid()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gzrun_test_worker MODE ...\n");
    return 2;
  }
  std::string mode = argv[1];
  const int rank = env_int("RANK");
  if (mode == "env") return mode_env(rank);
  if (mode == "exit" && argc >= 4) {
    if (rank == std::atoi(argv[3])) {
      usleep(100000);
      std::fprintf(stderr, "rank %d failing on purpose\n", rank);
      return std::atoi(argv[2]);
    }
    sleep(60);
    return 0;
  }
  if (mode == "sigkill" && argc >= 3) {
    if (rank == std::atoi(argv[2])) {
      usleep(100000);
      raise(SIGKILL);
    }
    sleep(60);
    return 0;
  }
  if (mode == "spam" && argc >= 4) {
    int lines = std::atoi(argv[2]), len = std::atoi(argv[3]);
    for (int i = 0; i < lines; ++i) {
      std::string line = "r=" + std::to_string(rank) + " i=" + std::to_string(i) + " " + payload(rank, i, len) + "\n";
      int fd = (i % 2) ? 2 : 1;
      // Three pieces per line: the relay must reassemble them and never mix ranks.
      size_t a = line.size() / 3, b = 2 * line.size() / 3;
      write_str(fd, line.substr(0, a));
      write_str(fd, line.substr(a, b - a));
      write_str(fd, line.substr(b));
    }
    return 0;
  }
  if (mode == "sleep" && argc >= 4) {
    bool ignore_term = argc >= 5 && std::string(argv[4]) == "ignore-term";
    return mode_sleep(argv[2], std::atof(argv[3]), ignore_term);
  }
  if (mode == "fail-first" && argc >= 3) {
    int attempt = env_int("GZ_RESTART_COUNT");
    if (attempt == 0) {
      std::fprintf(stderr, "attempt 0 failing\n");
      return std::atoi(argv[2]);
    }
    std::printf("ok attempt=%d run_id=%s\n", attempt, std::getenv("GZ_RUN_ID"));
    return 0;
  }
  if (mode == "escape" && argc >= 3) {
    std::string path = std::string(argv[2]) + "/escaped_" + std::to_string(rank);
    pid_t child = fork();
    if (child == 0) {
      setsid();  // leaves the worker's process group: only the subreaper can still find it
      pid_t grandchild = fork();  // and one more generation below it
      if (grandchild == 0) {
        for (;;) pause();
      }
      std::string tmp = path + ".tmp";
      if (FILE* f = std::fopen(tmp.c_str(), "w")) {
        std::fprintf(f, "%d %d\n", static_cast<int>(getpid()), static_cast<int>(grandchild));
        std::fclose(f);
        std::rename(tmp.c_str(), path.c_str());
      }
      for (;;) pause();
    }
    for (int i = 0; i < 500 && ::access(path.c_str(), F_OK) != 0; ++i) usleep(10000);
    std::printf("escaped\n");
    return 0;
  }
  if (mode == "job" && argc >= 8) {
    return mode_job(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atof(argv[5]), std::atoi(argv[6]),
                    std::atoi(argv[7]));
  }
  if (mode == "inplace" && argc >= 5) {
    return mode_inplace(argv[2], std::atoi(argv[3]), argv[4]);
  }
  if (mode == "progress") {
    write_str(1, "step 1/3\rstep 2/3\rstep 3/3\r\ndone");  // no final newline
    return 0;
  }
  std::fprintf(stderr, "gzrun_test_worker: bad mode or arguments: %s\n", mode.c_str());
  return 2;
}
