// Multi-process behaviour of the shm backend: ranks are forked processes meeting through a
// FileStore. A SIGKILLed rank must surface as gz::PeerError on the survivors (whatever its pid
// now names, and from another PID namespace too), a SIGSTOPped one as gz::TimeoutError naming it,
// and /dev/shm must hold nothing of the group afterwards.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "comm/shm/shm_communicator.h"
#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/store/file_store.h"

using namespace gz;
using namespace gz::comm;

namespace gz::comm::shm {
// Fault injection: overwrite the pid a rank recorded in its control line.
struct ShmTestAccess {
  static void set_recorded_pid(Communicator& c, int pid) {
    auto& s = dynamic_cast<ShmCommunicator&>(c);
    __atomic_store_n(&s.ctrl(s.rank()).pid, pid, __ATOMIC_RELEASE);
  }
};
}  // namespace gz::comm::shm

namespace {

// Segments named by this test's ranks (the name ends in "-<pid of rank 0>"). Other tests running
// in parallel create and unlink their own segments meanwhile, so only ours are counted.
std::vector<std::string> shm_entries_of(const std::vector<pid_t>& pids) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("gz-shm-", 0) != 0) continue;
      for (pid_t p : pids)
        if (name.size() > 8 && name.substr(name.rfind('-') + 1) == std::to_string(p)) out.push_back(name);
    }
    closedir(d);
  }
  return out;
}

std::string temp_store_path() {
  char tmpl[] = "/tmp/gz_shm_proc_XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  unlink(tmpl);  // FileStore creates it
  return tmpl;
}

// Fork `world` ranks running body(rank, comm); each child exits with body's return value
// (0 = pass). Returns the exit codes, or -signal for children killed by a signal.
// Rank `pid_ns_rank` (if any) runs as pid 1 of a new PID namespace (needs CAP_SYS_ADMIN).
std::vector<int> run_processes(int world, const std::function<int(int, Communicator&)>& body, int timeout_s,
                               std::vector<pid_t>* pids_out = nullptr,
                               const std::function<void(std::vector<pid_t>&)>& parent_hook = nullptr,
                               int pid_ns_rank = -1) {
  const std::string path = temp_store_path();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      if (r == pid_ns_rank) {
        // unshare(CLONE_NEWPID) moves only the children: fork once more and pass on the status.
        if (unshare(CLONE_NEWPID) != 0) _exit(77);
        pid_t inner = fork();
        if (inner < 0) _exit(78);
        if (inner > 0) {
          int st = 0;
          waitpid(inner, &st, 0);
          _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        }
      }
      int code = 3;
      try {
        auto store = std::make_shared<FileStore>(path);
        ShmOptions o;
        o.timeout = std::chrono::seconds(timeout_s);
        o.spin_us = 20;
        auto comm = create_shm_communicator(r, world, store, o);
        code = body(r, *comm);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: unexpected exception: %s\n", r, e.what());
        code = 4;
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  if (pids_out) *pids_out = pids;
  if (parent_hook) parent_hook(pids);
  std::vector<int> codes;
  for (pid_t p : pids) {
    if (p < 0) {  // already reaped by the hook
      codes.push_back(0);
      continue;
    }
    int st = 0;
    waitpid(p, &st, 0);
    codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
  }
  unlink(path.c_str());
  return codes;
}

// For a survivor after rank 2 was SIGKILLed: `allreduce` must fail with gz::PeerError naming peer
// rank 2 and the all-reduce, well before the 30 s timeout. Returns the child's exit code: 0 as
// expected, 5 it succeeded, 6 another message, 7 too slow.
int allreduce_fails_naming_rank_2(int rank, const std::function<void()>& allreduce) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    allreduce();
    return 5;
  } catch (const PeerError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string m = e.what();
    if (m.find("peer rank 2") == std::string::npos || m.find("allreduce") == std::string::npos) {
      std::fprintf(stderr, "rank %d: unexpected message: %s\n", rank, m.c_str());
      return 6;
    }
    return s < 5.0 ? 0 : 7;
  }
}

TEST(ShmProcess, AllreduceAcrossProcessesLeavesDevShmClean) {
  std::vector<pid_t> pids;
  auto codes = run_processes(
      3,
      [](int rank, Communicator& c) {
        std::vector<float> v(100000, static_cast<float>(rank + 1));
        c.allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
        for (float x : v)
          if (x != 6.0f) return 1;
        c.barrier();
        return 0;
      },
      20, &pids);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(shm_entries_of(pids).empty());
}

TEST(ShmProcess, KilledRankBecomesPeerErrorOnSurvivors) {
  std::vector<pid_t> pids;
  auto codes = run_processes(
      3,
      [](int rank, Communicator& c) {
        float x = 1;
        c.allreduce(&x, 1, DType::f32, ReduceOp::sum);
        if (x != 3) return 1;
        if (rank == 2) raise(SIGKILL);
        std::vector<float> v(50000, 1.0f);
        return allreduce_fails_naming_rank_2(
            rank, [&] { c.allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum); });
      },
      30, &pids);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], -SIGKILL);
  // The killed rank never cleaned up, yet nothing is left: names are unlinked right after mapping.
  EXPECT_TRUE(shm_entries_of(pids).empty());
}

// alloc_buffer blocks across processes: every rank maps every block at its own address. The
// zero-copy all-reduce is exact, a killed rank becomes gz::PeerError on the survivors, and no
// block is left in /dev/shm.
TEST(ShmProcess, AllocBufferAcrossProcessesAndAKilledRank) {
  std::vector<pid_t> pids;
  auto codes = run_processes(
      3,
      [](int rank, Communicator& c) {
        const size_t n = 300001;
        auto mem = c.alloc_buffer(n * sizeof(float));
        auto* f = static_cast<float*>(mem.get());
        for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 1000);
        c.barrier();
        c.allreduce(f, n, DType::f32, ReduceOp::sum);
        for (size_t i = 0; i < n; ++i)
          if (f[i] != 6.0f * static_cast<float>(i % 1000)) return 1;
        c.barrier();
        if (rank == 2) raise(SIGKILL);
        return allreduce_fails_naming_rank_2(rank, [&] { c.allreduce(f, n, DType::f32, ReduceOp::sum); });
      },
      30, &pids);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], -SIGKILL);
  EXPECT_TRUE(shm_entries_of(pids).empty());
}

TEST(ShmProcess, StoppedRankBecomesTimeoutNamingIt) {
  auto codes = run_processes(
      3,
      [](int rank, Communicator& c) {
        c.barrier();
        if (rank == 1) {
          raise(SIGSTOP);  // the parent kills it once the others are done
          return 0;
        }
        auto t0 = std::chrono::steady_clock::now();
        try {
          c.barrier();
          return 5;
        } catch (const TimeoutError& e) {
          double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::string m = e.what();
          if (m.find("rank(s) 1 ") == std::string::npos || m.find("barrier") == std::string::npos) {
            std::fprintf(stderr, "rank %d: unexpected message: %s\n", rank, m.c_str());
            return 6;
          }
          return s >= 1.9 && s < 4.0 ? 0 : 7;
        }
      },
      2, nullptr,
      [](std::vector<pid_t>& pids) {
        // Reap the survivors first, then kill the stopped rank.
        for (int r : {0, 2}) {
          int st = 0;
          waitpid(pids[r], &st, 0);
          pids[r] = -1;
          if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ADD_FAILURE() << "rank " << r << " status " << st;
        }
        kill(pids[1], SIGKILL);
      });
  EXPECT_EQ(codes[1], -SIGKILL);
}

// kill(pid, 0) took any live process with the recorded pid for the rank: a recycled pid (here the
// test process's own, alive throughout) hid the death until the timeout. The lock does not care.
TEST(ShmProcess, DeathIsSeenThoughTheRecordedPidIsAlive) {
  std::vector<pid_t> pids;
  auto codes = run_processes(
      3,
      [](int rank, Communicator& c) {
        float x = 1;
        c.allreduce(&x, 1, DType::f32, ReduceOp::sum);
        if (rank == 2) {
          shm::ShmTestAccess::set_recorded_pid(c, static_cast<int>(getppid()));
          raise(SIGKILL);
        }
        std::vector<float> v(50000, 1.0f);
        return allreduce_fails_naming_rank_2(
            rank, [&] { c.allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum); });
      },
      10, &pids);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, -SIGKILL}));
  EXPECT_TRUE(shm_entries_of(pids).empty());
}

// Containers sharing /dev/shm see each other's ranks with pids of another namespace: rank 2 runs
// as pid 1 of its own PID namespace, so kill(1, 0) in ours found our init alive.
TEST(ShmProcess, DeathIsSeenAcrossPidNamespaces) {
  pid_t probe = fork();
  if (probe == 0) _exit(unshare(CLONE_NEWPID) == 0 ? 0 : 1);
  int st = 0;
  waitpid(probe, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) GTEST_SKIP() << "unshare(CLONE_NEWPID) not permitted (needs root)";
  auto codes = run_processes(
      3,
      [](int rank, Communicator& c) {
        if (rank == 2 && getpid() != 1) return 9;
        float x = 1;
        c.allreduce(&x, 1, DType::f32, ReduceOp::sum);
        // A namespace's init ignores its own SIGKILL: die by _exit, without closing anything.
        if (rank == 2) _exit(0);
        std::vector<float> v(50000, 1.0f);
        return allreduce_fails_naming_rank_2(
            rank, [&] { c.allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum); });
      },
      10, nullptr, nullptr, /*pid_ns_rank=*/2);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

// A child forked by a rank (a data-loader worker, say) shares its open files; it must not keep
// the rank's lock, or the rank's death would go unseen for as long as the child lives.
TEST(ShmProcess, ForkedChildDoesNotKeepADeadRankAlive) {
  auto codes = run_processes(
      3,
      [](int rank, Communicator& c) {
        float x = 1;
        c.allreduce(&x, 1, DType::f32, ReduceOp::sum);
        if (rank == 2) {
          if (fork() == 0) {
            // Outlives the rank by longer than the survivors may take; closes ctest's pipes.
            close(1);
            close(2);
            sleep(7);
            _exit(0);
          }
          raise(SIGKILL);
        }
        std::vector<float> v(50000, 1.0f);
        return allreduce_fails_naming_rank_2(
            rank, [&] { c.allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum); });
      },
      20);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, -SIGKILL}));
}

}  // namespace
