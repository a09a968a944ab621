// End-to-end tests of the gzrun binary with the gzrun_test_worker helper (label mp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <regex>
#include <set>

#include "gzrun_harness.h"

using namespace gz::test;

namespace {

int usable_cores_for_test() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

/// A listening socket on 127.0.0.1:port (0 = any free port); fd -1 when the bind failed.
struct HeldPort {
  int fd = -1;
  int port = 0;
  int bind_errno = 0;
  explicit HeldPort(int want) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(want));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 4) != 0) {
      bind_errno = errno;
      ::close(fd);
      fd = -1;
      port = want;
      return;
    }
    socklen_t len = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    port = ntohs(sa.sin_port);
  }
  ~HeldPort() {
    if (fd >= 0) ::close(fd);
  }
};

/// Wait until DIR/pid_<r> exists for every rank; returns worker and grandchild pids.
std::vector<pid_t> wait_pid_files(const TempDir& dir, int n, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::string path = dir.file("pid_" + std::to_string(r));
    while (!file_exists(path) && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::istringstream in(read_file(path));
    pid_t worker = 0, grandchild = 0;
    if (in >> worker >> grandchild) {
      pids.push_back(worker);
      pids.push_back(grandchild);
    }
  }
  return pids;
}

void kill_leftovers(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (p > 0 && !process_gone(p)) ::kill(p, SIGKILL);
}

}  // namespace

// ---- ranks and environment --------------------------------------------------------------

class GzrunWorld : public ::testing::TestWithParam<int> {};

TEST_P(GzrunWorld, EveryWorkerGetsDistinctRanksAndEnv) {
  const int n = GetParam();
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", std::to_string(n), "--", kWorker, "env"}, dir);
  ASSERT_TRUE(g.wait(20)) << g.describe();
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  auto env = parse_env_output(g.out());
  ASSERT_EQ(static_cast<int>(env.size()), n) << g.describe();
  const std::string port = env[0]["MASTER_PORT"];
  const std::string run_id = env[0]["GZ_RUN_ID"];
  const int omp = std::max(1, usable_cores_for_test() / n);
  std::set<std::string> pids;
  for (int r = 0; r < n; ++r) {
    auto& e = env[r];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(e["RANK"], std::to_string(r));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(e["ROLE_RANK"], std::to_string(r));
    EXPECT_EQ(e["WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["NODE_RANK"], "0");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["MASTER_PORT"], port);
    EXPECT_EQ(e["GZ_LAUNCHER"], "gzrun");
    EXPECT_EQ(e["GZ_STORE_HOSTED"], "1");
    EXPECT_EQ(e["GZ_NNODES"], "1");
    EXPECT_EQ(e["GZ_RUN_ID"], run_id);
    EXPECT_EQ(e["GZ_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["OMP_NUM_THREADS"], std::to_string(omp));
    EXPECT_EQ(e["GZ_RDZV_TOKEN"].size(), 64u);  // generated for one node (launch_auth.h)
    EXPECT_EQ(e["GZ_RDZV_TOKEN"], env[0]["GZ_RDZV_TOKEN"]);
    EXPECT_EQ(e["PGID_IS_PID"], "1");  // own process group
    EXPECT_EQ(e["STORE_REACHABLE"], "1");  // gzrun listens on GZ_STORE_PORT
    EXPECT_EQ(e["GZ_STORE_ADDR"], "127.0.0.1");
    // The program's MASTER_PORT is not gzrun's: torch's rank 0 can bind it.
    EXPECT_NE(e["GZ_STORE_PORT"], port);
    if (r == 0) EXPECT_EQ(e["MASTER_PORT_FREE"], "1");
    pids.insert(e["PID"]);
  }
  EXPECT_EQ(static_cast<int>(pids.size()), n);
  EXPECT_GT(std::stoi(port), 0);
  // "<gzrun pid>.<32 random bits>-<round>": a pid alone comes back (containers), and a new job must
  // not take an old one's snapshots. Mutation check: launch_id() without the random part fails.
  EXPECT_TRUE(std::regex_match(run_id, std::regex(std::to_string(g.pid()) + "\\.[0-9a-f]{8}-0"))) << run_id;
}

INSTANTIATE_TEST_SUITE_P(Worlds, GzrunWorld, ::testing::Values(1, 2, 3, 7));

TEST(Gzrun, UserSettingsWinAndTokenPassesThrough) {
  TempDir dir;
  GzrunProcess g({"--nproc_per_node=2", kWorker, "env"}, dir,
                 {{"OMP_NUM_THREADS", "5"}, {"GZ_RDZV_TOKEN", "s3cret"}}, {});
  ASSERT_TRUE(g.wait(20)) << g.describe();
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  auto env = parse_env_output(g.out());
  ASSERT_EQ(env.size(), 2u) << g.describe();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(env[r]["OMP_NUM_THREADS"], "5");
    EXPECT_EQ(env[r]["GZ_RDZV_TOKEN"], "s3cret");
  }
}

TEST(Gzrun, AutoNprocStartsOneWorkerPerCoreOrGpu) {
  int gpus = 0;
  for (int i = 0; i < 64; ++i) gpus += file_exists("/dev/nvidia" + std::to_string(i)) ? 1 : 0;
  const int expect = gpus > 0 ? gpus : usable_cores_for_test();
  if (expect > 32) GTEST_SKIP() << expect << " workers is too many for a quick test";
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", "auto", kWorker, "env"}, dir);
  ASSERT_TRUE(g.wait(30)) << g.describe();
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  auto env = parse_env_output(g.out());
  ASSERT_EQ(static_cast<int>(env.size()), expect) << g.describe();
  EXPECT_EQ(env[0]["WORLD_SIZE"], std::to_string(expect));
}

// ---- output relay -----------------------------------------------------------------------

TEST(Gzrun, OutputIsPrefixedAndLinesStayWholeUnderLoad) {
  TempDir dir;
  const int n = 4, lines = 3000, len = 200;
  GzrunProcess g({"--nproc-per-node", std::to_string(n), kWorker, "spam", std::to_string(lines),
                  std::to_string(len)},
                 dir);
  ASSERT_TRUE(g.wait(60)) << "gzrun did not finish";
  ASSERT_EQ(g.exit_code(), 0) << g.err().substr(0, 2000);
  // Reference: the worker's deterministic payload.
  auto payload = [](int rank, int i) {
    std::string s;
    for (int k = 0; k < len; ++k) s += static_cast<char>('a' + (rank * 7 + i * 3 + k) % 26);
    return s;
  };
  std::map<std::pair<int, int>, int> seen;
  auto check = [&](const std::string& text, int parity) {
    for (const auto& line : split_lines(text)) {
      if (line.rfind("gzrun:", 0) == 0) continue;  // gzrun's own messages on stderr
      int prefix = -1, r = -1, i = -1;
      char body[512] = {0};
      ASSERT_EQ(std::sscanf(line.c_str(), "[%d] r=%d i=%d %511s", &prefix, &r, &i, body), 4) << line;
      ASSERT_EQ(prefix, r) << line;
      ASSERT_EQ(i % 2, parity) << "line on the wrong stream: " << line;
      ASSERT_EQ(std::string(body), payload(r, i)) << line;
      ASSERT_EQ(line, "[" + std::to_string(r) + "] r=" + std::to_string(r) + " i=" + std::to_string(i) + " " +
                          payload(r, i));
      seen[{r, i}]++;
    }
  };
  check(g.out(), 0);
  check(g.err(), 1);
  EXPECT_EQ(static_cast<int>(seen.size()), n * lines);
  for (const auto& [key, count] : seen) ASSERT_EQ(count, 1) << key.first << "/" << key.second;
}

TEST(Gzrun, CarriageReturnsEndLinesAndPartialLinesAreFlushed) {
  TempDir dir;
  GzrunProcess g({kWorker, "progress"}, dir);
  ASSERT_TRUE(g.wait(20));
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  EXPECT_EQ(split_lines(g.out()),
            (std::vector<std::string>{"[0] step 1/3", "[0] step 2/3", "[0] step 3/3", "[0] done"}));
}

// ---- failures ---------------------------------------------------------------------------

TEST(Gzrun, FailingWorkerBringsTheGroupDown) {
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", "3", kWorker, "exit", "3", "1"}, dir);
  ASSERT_TRUE(g.wait(10)) << "gzrun hung: " << g.describe();
  EXPECT_NE(g.exit_code(), 0);
  EXPECT_EQ(g.exit_code(), 1);
  EXPECT_LT(g.elapsed_s(), 5.0);
  EXPECT_NE(g.err().find("rank 1 (pid "), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("exited with code 3"), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("[1] rank 1 failing on purpose"), std::string::npos) << g.describe();
}

TEST(Gzrun, WorkerKilledBySigkillBringsTheGroupDown) {
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", "3", kWorker, "sigkill", "2"}, dir);
  ASSERT_TRUE(g.wait(10)) << "gzrun hung: " << g.describe();
  EXPECT_EQ(g.exit_code(), 1);
  EXPECT_LT(g.elapsed_s(), 5.0);
  EXPECT_NE(g.err().find("rank 2 (pid "), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("killed by signal 9 (SIGKILL)"), std::string::npos) << g.describe();
}

// ---- signals to gzrun -------------------------------------------------------------------

class GzrunSignal : public ::testing::TestWithParam<int> {};

TEST_P(GzrunSignal, IsForwardedAndNothingIsLeftBehind) {
  const int sig = GetParam();
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", "3", kWorker, "sleep", dir.path(), "60"}, dir);
  auto pids = wait_pid_files(dir, 3, 15);
  ASSERT_EQ(pids.size(), 6u) << g.describe();
  ASSERT_EQ(::kill(g.pid(), sig), 0);
  bool exited = g.wait(5);
  auto alive = wait_gone(pids, 2);
  kill_leftovers(pids);
  ASSERT_TRUE(exited) << "gzrun did not exit after the signal: " << g.describe();
  EXPECT_EQ(g.exit_code(), 128 + sig) << g.describe();
  EXPECT_TRUE(alive.empty()) << alive.size() << " processes left behind";
  for (int r = 0; r < 3; ++r)  // each worker's handler saw the forwarded signal
    EXPECT_EQ(read_file(dir.file("sig_" + std::to_string(r))), std::to_string(sig) + "\n") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Signals, GzrunSignal, ::testing::Values(SIGTERM, SIGINT, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& info) { return std::string(sigabbrev_np(info.param)); });

TEST(Gzrun, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  TempDir dir;
  GzrunProcess g({"--grace-period", "1", "--nproc-per-node", "2", kWorker, "sleep", dir.path(), "60", "ignore-term"},
                 dir);
  auto pids = wait_pid_files(dir, 2, 15);
  ASSERT_EQ(pids.size(), 4u) << g.describe();
  ASSERT_EQ(::kill(g.pid(), SIGTERM), 0);
  bool exited = g.wait(5);
  auto alive = wait_gone(pids, 2);
  kill_leftovers(pids);
  ASSERT_TRUE(exited) << g.describe();
  EXPECT_EQ(g.exit_code(), 128 + SIGTERM);
  EXPECT_GE(g.elapsed_s(), 0.9);  // waited for the grace period
  EXPECT_NE(g.err().find("sending SIGKILL"), std::string::npos) << g.describe();
  EXPECT_TRUE(alive.empty()) << alive.size() << " processes left behind";
}

TEST(Gzrun, WorkersDieWhenGzrunIsKilled) {
  // SIGKILL cannot be forwarded: PR_SET_PDEATHSIG takes the workers down. (Their own children
  // are outside its reach; the test cleans those up itself.)
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", "2", kWorker, "sleep", dir.path(), "60"}, dir);
  auto pids = wait_pid_files(dir, 2, 15);
  ASSERT_EQ(pids.size(), 4u) << g.describe();
  ASSERT_EQ(::kill(g.pid(), SIGKILL), 0);
  g.wait(5);
  auto alive = wait_gone({pids[0], pids[2]}, 3);
  kill_leftovers(pids);
  EXPECT_TRUE(alive.empty()) << "workers outlived a SIGKILLed gzrun";
}

TEST(Gzrun, DescendantsThatLeftTheGroupAreCleanedUp) {
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", "2", kWorker, "escape", dir.path()}, dir);
  ASSERT_TRUE(g.wait(20)) << g.describe();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    std::istringstream in(read_file(dir.file("escaped_" + std::to_string(r))));
    pid_t a = 0, b = 0;
    if (in >> a >> b) pids.insert(pids.end(), {a, b});
  }
  auto alive = wait_gone(pids, 2);
  kill_leftovers(pids);
  EXPECT_EQ(g.exit_code(), 0) << g.describe();
  ASSERT_EQ(pids.size(), 4u) << g.describe();
  EXPECT_TRUE(alive.empty()) << alive.size() << " escaped processes outlived gzrun";
}

// ---- ports ------------------------------------------------------------------------------

TEST(Gzrun, PicksAFreePortWhileTheDefaultPortIsBusy) {
  HeldPort held(29500);  // may already be held by someone else: busy either way
  ASSERT_TRUE(held.fd >= 0 || held.bind_errno == EADDRINUSE) << std::strerror(held.bind_errno);
  TempDir dir;
  GzrunProcess g({"--nproc-per-node", "2", kWorker, "env"}, dir);
  ASSERT_TRUE(g.wait(20));
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  auto env = parse_env_output(g.out());
  ASSERT_EQ(env.size(), 2u);
  int port = std::stoi(env[0]["MASTER_PORT"]);
  EXPECT_GT(port, 0);
  EXPECT_NE(port, 29500);
  EXPECT_EQ(env[1]["MASTER_PORT"], env[0]["MASTER_PORT"]);
  EXPECT_EQ(env[0]["STORE_REACHABLE"], "1");
}

TEST(Gzrun, BusyExplicitPortIsAClearError) {
  HeldPort held(0);
  ASSERT_GE(held.fd, 0);
  TempDir dir;
  GzrunProcess g({"--master-port", std::to_string(held.port), "--nproc-per-node", "2", kWorker, "env"}, dir);
  ASSERT_TRUE(g.wait(20));
  EXPECT_NE(g.exit_code(), 0);
  EXPECT_NE(g.err().find("port " + std::to_string(held.port)), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("in use"), std::string::npos) << g.describe();
  EXPECT_EQ(g.out(), "");  // no worker started
}

TEST(Gzrun, ExplicitFreePortIsUsed) {
  int port;
  {
    HeldPort probe(0);  // find a port that is free right now
    ASSERT_GE(probe.fd, 0);
    port = probe.port;
  }
  TempDir dir;
  GzrunProcess g({"--master_port=" + std::to_string(port), kWorker, "env"}, dir);
  ASSERT_TRUE(g.wait(20));
  if (g.exit_code() != 0 && g.err().find("in use") != std::string::npos)
    GTEST_SKIP() << "port " << port << " was taken by another process in between";
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  EXPECT_EQ(parse_env_output(g.out())[0]["MASTER_PORT"], std::to_string(port));
}

// ---- restarts ---------------------------------------------------------------------------

TEST(Gzrun, RestartsAfterAFailureAndSucceeds) {
  TempDir dir;
  GzrunProcess g({"--max-restarts", "1", "--nproc-per-node", "2", kWorker, "fail-first", "4"}, dir);
  ASSERT_TRUE(g.wait(20)) << g.describe();
  EXPECT_EQ(g.exit_code(), 0) << g.describe();
  EXPECT_NE(g.err().find("exited with code 4"), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("restart 1 of 1"), std::string::npos) << g.describe();
  const std::string tag = "[0] ok attempt=1 run_id=";
  const size_t at = g.out().find(tag);
  ASSERT_NE(at, std::string::npos) << g.describe();
  const std::string id = g.out().substr(at + tag.size(), g.out().find('\n', at) - at - tag.size());
  EXPECT_TRUE(std::regex_match(id, std::regex(std::to_string(g.pid()) + "\\.[0-9a-f]{8}-1"))) << id;
  EXPECT_NE(g.out().find("[1] ok attempt=1 run_id=" + id), std::string::npos) << g.describe();
}

TEST(Gzrun, GivesUpWhenRestartsAreExhausted) {
  TempDir dir;
  GzrunProcess g({"--max-restarts", "2", kWorker, "exit", "5", "0"}, dir);
  ASSERT_TRUE(g.wait(20)) << g.describe();
  EXPECT_EQ(g.exit_code(), 1) << g.describe();
  std::string err = g.err();
  size_t failures = 0;
  for (const auto& line : split_lines(err))
    if (line.rfind("gzrun: rank 0 (pid ", 0) == 0 && line.find("exited with code 5") != std::string::npos) ++failures;
  EXPECT_EQ(failures, 3u) << err;  // attempt 0 + 2 restarts
  EXPECT_NE(err.find("giving up after 2 restart(s)"), std::string::npos) << err;
}

TEST(Gzrun, NoRestartWithoutMaxRestarts) {
  TempDir dir;
  GzrunProcess g({kWorker, "fail-first", "4"}, dir);
  ASSERT_TRUE(g.wait(20)) << g.describe();
  EXPECT_EQ(g.exit_code(), 1);
  EXPECT_EQ(g.err().find("restart"), std::string::npos) << g.describe();
}

// ---- log files --------------------------------------------------------------------------

TEST(Gzrun, LogDirGetsOneFilePerRank) {
  TempDir dir;
  const std::string logs = dir.file("logs/nested");
  GzrunProcess g({"--log-dir", logs, "--nproc-per-node", "2", kWorker, "spam", "10", "30"}, dir);
  ASSERT_TRUE(g.wait(20));
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  for (int r = 0; r < 2; ++r) {
    auto lines = split_lines(read_file(logs + "/rank_" + std::to_string(r) + ".log"));
    ASSERT_EQ(lines.size(), 10u) << "rank " << r;
    std::set<int> idx;
    for (const auto& l : lines) {
      int rr = -1, i = -1;
      ASSERT_EQ(std::sscanf(l.c_str(), "r=%d i=%d", &rr, &i), 2) << l;  // unprefixed
      EXPECT_EQ(rr, r);
      idx.insert(i);
    }
    EXPECT_EQ(idx.size(), 10u);
  }
  // Still relayed to the console.
  EXPECT_NE(g.out().find("[1] r=1 i=0 "), std::string::npos);
  EXPECT_NE(g.err().find("[0] r=0 i=1 "), std::string::npos);
}

// ---- command line -----------------------------------------------------------------------

struct BadArgs {
  std::string name;
  std::vector<std::string> args;
  std::string message;
};
void PrintTo(const BadArgs& b, std::ostream* os) { *os << b.name; }

class GzrunBadArgs : public ::testing::TestWithParam<BadArgs> {};

TEST_P(GzrunBadArgs, ExitTwoWithAClearMessage) {
  TempDir dir;
  GzrunProcess g(GetParam().args, dir);
  ASSERT_TRUE(g.wait(10));
  EXPECT_EQ(g.exit_code(), 2) << g.describe();
  EXPECT_NE(g.err().find(GetParam().message), std::string::npos) << g.describe();
  EXPECT_EQ(g.out(), "");
}

INSTANTIATE_TEST_SUITE_P(
    Options, GzrunBadArgs,
    ::testing::Values(BadArgs{"UnknownLong", {"--frobnicate", "x"}, "unknown option '--frobnicate'"},
                      BadArgs{"UnknownShort", {"-x", "prog"}, "unknown option '-x'"},
                      BadArgs{"MissingValue", {"--nproc-per-node"}, "--nproc-per-node needs a value"},
                      BadArgs{"NotANumber", {"--nproc-per-node", "two", "true"}, "--nproc-per-node"},
                      BadArgs{"ZeroWorkers", {"--nproc-per-node", "0", "true"}, "--nproc-per-node must be in"},
                      BadArgs{"NodeRankTooBig", {"--nnodes", "2", "--node-rank", "2", "true"}, "--node-rank 2"},
                      BadArgs{"PortTooBig", {"--master-port", "70000", "true"}, "--master-port must be in"},
                      BadArgs{"FlagWithValue", {"--standalone=yes", "true"}, "takes no value"},
                      BadArgs{"NoProgram", {"--nproc-per-node", "2"}, "no program given"},
                      BadArgs{"ProgramNotInPath", {"gzrun_no_such_program_xyz"}, "'gzrun_no_such_program_xyz' not found"},
                      BadArgs{"ProgramPathMissing", {"./no/such/dir/prog"}, "'./no/such/dir/prog' not found"}),
    [](const ::testing::TestParamInfo<BadArgs>& info) { return info.param.name; });

TEST(Gzrun, ProgramThatCannotBeExecutedIsReported) {
  TempDir dir;
  const std::string prog = dir.file("not_a_binary");
  {
    std::ofstream f(prog);
    f << "this is text, not a program\n";
  }
  ASSERT_EQ(::chmod(prog.c_str(), 0755), 0);
  GzrunProcess g({"--nproc-per-node", "2", prog}, dir);
  ASSERT_TRUE(g.wait(10));
  EXPECT_EQ(g.exit_code(), 1) << g.describe();
  EXPECT_NE(g.err().find("cannot execute '" + prog + "': exec format error"), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("exited with code 127"), std::string::npos) << g.describe();
}

TEST(Gzrun, HelpAndVersion) {
  TempDir dir;
  GzrunProcess h({"--help"}, dir);
  ASSERT_TRUE(h.wait(10));
  EXPECT_EQ(h.exit_code(), 0);
  EXPECT_NE(h.out().find("usage: gzrun"), std::string::npos);
  EXPECT_NE(h.out().find("--nproc-per-node"), std::string::npos);
  GzrunProcess v({"--version"}, dir);
  ASSERT_TRUE(v.wait(10));
  EXPECT_EQ(v.exit_code(), 0);
  EXPECT_EQ(v.out().rfind("gzrun (guozhuang) ", 0), 0u) << v.out();
}

TEST(Gzrun, ProgramFoundThroughPathAndArgumentsPassedUntouched) {
  TempDir dir;
  // "sh" through PATH; "--nproc-per-node" after PROGRAM belongs to the program.
  GzrunProcess g({"--nproc-per-node=2", "--", "sh", "-c", "echo \"$RANK:$1:$2\"", "sh", "--nproc-per-node", "x y"},
                 dir);
  ASSERT_TRUE(g.wait(10));
  ASSERT_EQ(g.exit_code(), 0) << g.describe();
  auto lines = split_lines(g.out());
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] 0:--nproc-per-node:x y", "[1] 1:--nproc-per-node:x y"}));
}
