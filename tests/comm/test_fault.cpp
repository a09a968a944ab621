// Fault injection with real processes: fork N ranks that rendezvous through a FileStore, run one
// good allreduce, then SIGKILL or SIGSTOP one rank: every survivor's next allreduce must raise
// PeerError or TimeoutError naming the op within timeout + 2 s. Also: a delayed peer (less than
// the timeout) still succeeds, a late joiner after shutdown fails instead of hanging, and no
// shared-memory segment of the run is left in /dev/shm.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "gz/store/file_store.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr Duration kOpTimeout = 2500ms;

enum class Fault { kill, stop, delay };

struct Scenario {
  const char* name;
  std::string backend;
  std::vector<std::string> nodes;
  int victim;
  Fault fault;
};

// Exit codes of a rank process.
enum Code { kOk = 0, kUnexpectedSuccess = 10, kWrongError = 11, kTooSlow = 12, kBadMessage = 13, kSetupFailed = 14 };

comm::CommOptions rank_options(int rank, const Scenario& s, std::shared_ptr<Store> store) {
  comm::CommOptions o;
  o.backend = s.backend;
  o.rank = rank;
  o.size = static_cast<int>(s.nodes.size());
  o.store = std::move(store);
  o.timeout = kOpTimeout;
  o.node_id = s.nodes[rank];
  o.iface = "127.0.0.1";  // the simulated nodes share this machine: no hostname lookup needed
  return o;
}

bool all_equal(const std::vector<float>& v, float want) {
  for (float x : v)
    if (x != want) return false;
  return true;
}

// Body of one rank process; returns its exit code.
int rank_main(int rank, const Scenario& s, const std::string& dir) {
  const int world = static_cast<int>(s.nodes.size());
  auto store = std::make_shared<FileStore>(dir + "/store");
  comm::CommPtr c;
  try {
    c = comm::create_communicator(rank_options(rank, s, store));
    std::vector<float> v(4099, static_cast<float>(rank + 1));
    c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
    if (!all_equal(v, world * (world + 1) / 2.0f)) return kSetupFailed;
    store->add("ok", 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d setup failed: %s\n", rank, e.what());
    return kSetupFailed;
  }
  if (rank == s.victim && s.fault != Fault::delay) {
    for (;;) std::this_thread::sleep_for(1s);  // the parent kills or stops us
  }
  store->get("go", Deadline::after(30s));
  if (rank == s.victim) std::this_thread::sleep_for(1s);  // delayed, but within the timeout
  std::vector<float> v(4099, 1.0f);
  Stopwatch sw;
  try {
    c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
    if (s.fault == Fault::delay) return all_equal(v, static_cast<float>(world)) ? kOk : kSetupFailed;
    std::fprintf(stderr, "rank %d: allreduce without rank %d succeeded\n", rank, s.victim);
    return kUnexpectedSuccess;
  } catch (const Error& e) {
    const bool expected = dynamic_cast<const PeerError*>(&e) || dynamic_cast<const TimeoutError*>(&e);
    std::fprintf(stderr, "rank %d after %.2f s: %s\n", rank, sw.seconds(), e.what());
    if (s.fault == Fault::delay || !expected) return kWrongError;
    if (sw.elapsed() > kOpTimeout + 2s) return kTooSlow;
    if (std::string(e.what()).find("allreduce") == std::string::npos) return kBadMessage;
    c.reset();
    return kOk;
  }
}

// The run's shm segments: "/gz-shm-<random>-<pid of rank 0>" (shm backend naming).
std::vector<std::string> shm_segments_of(pid_t rank0) {
  std::vector<std::string> out;
  const std::string suffix = "-" + std::to_string(rank0);
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    std::string n = e.path().filename().string();
    if (n.rfind("gz-", 0) == 0 && n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(n);
  }
  return out;
}

// Wait for pid up to `within`; returns the exit status or -1 when it is still running.
int wait_for(pid_t pid, Duration within) {
  Deadline dl = Deadline::after(within);
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (dl.expired()) return -1;
    std::this_thread::sleep_for(10ms);
  }
}

// Short names in ctest listings instead of a byte dump.
void PrintTo(const Scenario& s, std::ostream* os) { *os << s.backend << "_" << s.name; }

class FaultRun : public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gz-fault-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

pid_t spawn(const std::function<int()>& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw gz::SystemError("fork", errno);  // never hand -1 to kill()
  if (pid == 0) {
    int code = kSetupFailed;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(code);
  }
  return pid;
}

TEST_P(FaultRun, SurvivorsFailFastAndCleanly) {
  const Scenario& s = GetParam();
  const int world = static_cast<int>(s.nodes.size());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) pids.push_back(spawn([&, r] { return rank_main(r, s, dir_); }));
  const pid_t rank0 = pids[0];
  auto kill_all = [&] {
    for (pid_t p : pids) {
      if (p <= 0) continue;  // reaped (-1): kill(-1, ...) would signal every process we may signal
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  };
  FileStore store(dir_ + "/store");
  // Wait for every rank's first, good allreduce.
  Deadline setup = Deadline::after(30s);
  while (store.add("ok", 0) < world) {
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        pids[r] = -1;
        kill_all();
        FAIL() << "rank " << r << " exited during setup";
      }
    }
    if (setup.expired()) {
      kill_all();
      FAIL() << "setup did not finish";
    }
    std::this_thread::sleep_for(20ms);
  }
  if (s.fault == Fault::kill) kill(pids[s.victim], SIGKILL);
  if (s.fault == Fault::stop) kill(pids[s.victim], SIGSTOP);
  store.set("go", to_bytes("1"));
  for (int r = 0; r < world; ++r) {
    if (r == s.victim && s.fault != Fault::delay) continue;
    int code = wait_for(pids[r], kOpTimeout + 6s);
    if (code == -1) {
      kill_all();
      FAIL() << "rank " << r << " hangs after the fault";
    }
    pids[r] = -1;
    EXPECT_EQ(code, kOk) << "rank " << r << " exit code (10 success, 11 wrong error, 12 slow, 13 message)";
  }
  if (s.fault != Fault::delay) {
    kill(pids[s.victim], SIGKILL);
    waitpid(pids[s.victim], nullptr, 0);
  }
  EXPECT_EQ(shm_segments_of(rank0), std::vector<std::string>{});
}

std::vector<Scenario> scenarios() {
  std::vector<Scenario> v;
  const std::vector<std::string> one = {"n", "n", "n"};
  const std::vector<std::string> two = {"a", "a", "b", "b"};
  for (Fault f : {Fault::kill, Fault::stop, Fault::delay}) {
    const char* fn = f == Fault::kill ? "kill" : f == Fault::stop ? "stop" : "delay";
    v.push_back({fn, "shm", one, 1, f});
    v.push_back({fn, "gloo", one, 2, f});
    v.push_back({fn, "auto", two, 3, f});
  }
  v.push_back({"kill_leader", "auto", two, 2, Fault::kill});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultRun, ::testing::ValuesIn(scenarios()),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           return info.param.backend + "_" + info.param.name;
                         });

// Ranks that finished and left: a process joining afterwards as one of them must fail, not hang.
TEST_F(FaultRun, LateJoinerAfterShutdownFails) {
  for (const std::string backend : {"gloo", "auto"}) {
    Scenario s{"late", backend, {"n", "n", "n"}, -1, Fault::delay};
    std::vector<pid_t> pids;
    std::string dir = dir_ + "/" + backend;
    fs::create_directories(dir);
    for (int r = 0; r < 3; ++r)
      pids.push_back(spawn([&, r] {
        auto store = std::make_shared<FileStore>(dir + "/store");
        auto c = comm::create_communicator(rank_options(r, s, store));
        int32_t x = 1;
        c->allreduce(&x, 1, DType::i32, comm::ReduceOp::sum);
        return x == 3 ? kOk : kSetupFailed;
      }));
    for (pid_t p : pids) EXPECT_EQ(wait_for(p, 20s), kOk) << backend;
    pid_t late = spawn([&] {
      auto store = std::make_shared<FileStore>(dir + "/store");
      Stopwatch sw;
      try {
        comm::create_communicator(rank_options(1, s, store));
        return kUnexpectedSuccess;
      } catch (const TimeoutError& e) {
        std::fprintf(stderr, "late joiner after %.2f s: %s\n", sw.seconds(), e.what());
        return sw.elapsed() <= kOpTimeout + 2s ? kOk : kTooSlow;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "late joiner: %s\n", e.what());
        return kWrongError;
      }
    });
    int code = wait_for(late, kOpTimeout + 6s);
    if (code == -1) {
      kill(late, SIGKILL);
      waitpid(late, nullptr, 0);
    }
    EXPECT_EQ(code, kOk) << backend << ": late joiner (-1 = hang)";
  }
}

}  // namespace
}  // namespace gz::test
