// SnapshotStore and SnapshotWriter: atomic files, generations kept, refusals.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <vector>

#include "gz/core/error.h"
#include "gz/train/recovery/snapshot_store.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_snapshot_store {

namespace fs = std::filesystem;
using gz::train::SnapshotHeader;
using gz::train::SnapshotStore;
using gz::train::SnapshotWriter;

namespace {

struct Dir {
  fs::path path = fs::temp_directory_path() / ("gz_snapstore_" + std::to_string(::getpid()));
  Dir() { fs::remove_all(path); }
  ~Dir() { fs::remove_all(path); }
};

constexpr uint64_t kRun = 0x5eed;

std::string payload(int64_t step) {
  return std::string(1000 + static_cast<size_t>(step), static_cast<char>('a' + step));
}

}  // namespace

TEST(SnapshotStore, KeepsTheNewestGenerationsAndReadsThemBack) {
  Dir d;
  SnapshotStore s(d.path.string(), 2, kRun);
  EXPECT_TRUE(s.steps().empty());
  for (int64_t step = 1; step <= 4; ++step) s.write({step, 0, 2, 77}, payload(step));
  EXPECT_EQ(s.steps(), (std::vector<int64_t>{4, 3}));
  SnapshotHeader h;
  EXPECT_EQ(s.read(4, 77, &h), payload(4));
  EXPECT_EQ(h.step, 4);
  EXPECT_EQ(h.world, 2);
  EXPECT_EQ(s.read(3, 77), payload(3));
}

TEST(SnapshotStore, RefusesAnotherConfigAStepMismatchAndDamage) {
  Dir d;
  SnapshotStore s(d.path.string(), 2, kRun);
  s.write({5, 0, 2, 77}, payload(5));
  try {
    s.read(5, 78);
    FAIL() << "a snapshot of another config was accepted";
  } catch (const gz::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("written by another config"), std::string::npos) << e.what();
  }
  // A file renamed to another step's name: its header says otherwise.
  fs::copy_file(s.path(5), s.path(6));
  EXPECT_EQ(s.steps(), (std::vector<int64_t>{5}));  // not listed as step 6
  EXPECT_THROW(s.read(6, 77), gz::InvalidArgument);
  // One payload byte flipped: same size, another hash.
  {
    std::fstream f(s.path(5), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('#');
  }
  try {
    s.read(5, 77);
    FAIL() << "a damaged snapshot was accepted";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find("damaged"), std::string::npos) << e.what();
  }
  // Truncated (a writer killed mid-write can only leave a temp file, but a file cut short is
  // never listed either).
  fs::resize_file(s.path(5), 100);
  EXPECT_TRUE(s.steps().empty());
}

// A writer killed mid-write leaves a temp file behind: removed once its process is gone and the
// file untouched for a minute; a live writer's (this process's, another live process's, or one
// just written) stays. Mutation check: removing every ".snap-" temp file in write() (as before)
// fails the three "kept" expectations.
TEST(SnapshotStore, OnlyATempFileOfADeadWriterIsCleanedUp) {
  Dir d;
  SnapshotStore s(d.path.string(), 2, kRun);
  s.write({1, 0, 1, 7}, payload(1));
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  auto temp = [&](long pid, const char* tag, bool old) {
    const fs::path f =
        d.path / (".snap-000000000002-0000000000005eed.bin.tmp-" + std::to_string(pid) + "-" + tag + "-0");
    std::ofstream(f) << "half a snapshot";
    if (old) fs::last_write_time(f, fs::file_time_type::clock::now() - std::chrono::minutes(5));
    return f;
  };
  const fs::path stale = temp(dead, "a", true), fresh = temp(dead, "b", false);
  const fs::path mine = temp(::getpid(), "c", true), live = temp(::getppid(), "d", true);
  EXPECT_EQ(s.steps(), (std::vector<int64_t>{1}));
  s.write({2, 0, 1, 7}, payload(2));
  EXPECT_FALSE(fs::exists(stale)) << "a dead writer's temp file was left";
  EXPECT_TRUE(fs::exists(fresh)) << "a temp file written a moment ago was removed";
  EXPECT_TRUE(fs::exists(mine)) << "a temp file of this process was removed";
  EXPECT_TRUE(fs::exists(live)) << "a temp file of a live process was removed";
  EXPECT_EQ(s.steps(), (std::vector<int64_t>{2, 1}));
}

// Two processes (two jobs, or two ranks of a node) writing into one folder: neither deletes the
// other's temp file mid-write, so no write fails. Mutation check: removing every ".snap-" temp
// file in write() (as before) makes writes fail with "rename snapshot ... No such file".
TEST(SnapshotStore, TwoWritersInOneFolderDoNotBreakEachOthersWrites) {
  Dir d;
  SnapshotStore(d.path.string(), 2, kRun).write({1, 0, 1, 7}, payload(1));  // the folder exists
  const fs::path errors = d.path.string() + "-errors";
  fs::remove(errors);
  std::vector<pid_t> kids;
  for (int w = 0; w < 2; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      SnapshotStore s(d.path.string(), 2, kRun);
      const std::string bytes(1 << 20, static_cast<char>('0' + w));
      for (int64_t i = 0; i < 150; ++i) {
        try {
          s.write({1000 * (w + 1) + i, 0, 1, 7}, bytes);
        } catch (const std::exception& e) {
          std::ofstream(errors, std::ios::app) << "writer " << w << ": " << e.what() << "\n";
          ::_exit(1);
        }
      }
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t k : kids) {
    int status = 0;
    ::waitpid(k, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::ifstream in(errors);
  const std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(failed, 0) << why;
  fs::remove(errors);
}

TEST(SnapshotWriter, WritesInTheBackgroundAndFinishesOnDestruction) {
  Dir d;
  SnapshotStore s(d.path.string(), 2, kRun);
  {
    SnapshotWriter w(s);
    for (int64_t step = 1; step <= 3; ++step) w.submit({step, 0, 1, 7}, payload(step));
  }  // the last write completes before the writer is gone
  EXPECT_EQ(s.steps(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(s.read(3, 7), payload(3));
}

// A payload built on the writer's thread lands in the buffer the last one left (no growth, no
// fresh pages per snapshot) and is written whole. Mutation check: shrink_to_fit() after clear()
// before each payload in loop() (the old writer freed its payload after each write) fails the
// capacity expectations.
TEST(SnapshotWriter, APayloadIsBuiltOnItsThreadIntoTheLastOnesBuffer) {
  Dir d;
  SnapshotStore s(d.path.string(), 2, kRun);
  std::vector<size_t> capacities;
  {
    SnapshotWriter w(s);
    for (int64_t step = 1; step <= 3; ++step)
      w.submit({step, 0, 1, 7}, [&capacities, step](std::string& out) {
        EXPECT_TRUE(out.empty());
        capacities.push_back(out.capacity());
        out.append(payload(step));
      });
  }
  ASSERT_EQ(capacities.size(), 3u);
  EXPECT_GE(capacities[1], payload(1).size()) << "the writer's buffer was not kept";
  EXPECT_GE(capacities[2], payload(2).size());
  EXPECT_EQ(s.read(3, 7), payload(3));
  EXPECT_EQ(s.read(2, 7), payload(2));
}

TEST(SnapshotWriter, AFailedWriteIsReportedByTheNextSubmit) {
  Dir d;
  std::ofstream(d.path.string() + "_file") << "x";  // a file where the folder should be
  SnapshotStore s(d.path.string() + "_file/sub", 2, kRun);
  SnapshotWriter w(s);
  w.submit({1, 0, 1, 7}, payload(1));
  EXPECT_THROW(w.flush(), gz::Error);
  fs::remove(d.path.string() + "_file");
}

// /dev/shm is world-writable: a snapshot folder another user can write into (or made, or a
// symbolic link) is neither written nor read; one they may only read is fine (files are 0600). Mutation
// check: dropping the mode test in private_dir_problem() makes both expectations below fail.
TEST(SnapshotStore, AFolderOthersCanWriteIsNotUsed) {
  Dir d;
  SnapshotStore s(d.path.string(), 2, kRun);
  s.write({1, 0, 2, 77}, payload(1));
  EXPECT_EQ(fs::status(d.path).permissions() & fs::perms::all, fs::perms::owner_all) << "made private";
  fs::permissions(d.path, fs::perms::all);  // 0777: anyone may plant a file
  EXPECT_TRUE(s.steps().empty()) << "a planted snapshot could be restored";
  EXPECT_THROW(s.write({2, 0, 2, 77}, payload(2)), gz::Error);
  fs::permissions(d.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read |
                              fs::perms::group_exec | fs::perms::others_exec);  // 0755
  EXPECT_EQ(s.steps(), (std::vector<int64_t>{1}));
  const fs::path link = d.path.string() + "-link";
  fs::remove(link);
  fs::create_directory_symlink(d.path, link);
  EXPECT_TRUE(SnapshotStore(link.string(), 2, kRun).steps().empty()) << "followed a symbolic link";
  fs::remove(link);
}

// gzrun's GZ_RUN_ID is "<job>-<round>": the round goes, the job stays; torchrun's run id is the
// same in every round already, except its default "none" (any run's); no launcher, no id.
TEST(SnapshotRunId, TheSameAcrossALaunchersRestartsAndNewForANewLaunch) {
  using gz::Env;
  using gz::train::snapshot_run_id;
  using Vars = std::map<std::string, std::string>;
  auto gzrun = [](const std::string& job, int round) {
    return Env(
        {{"GZ_RUN_ID", job + "-" + std::to_string(round)}, {"GZ_RESTART_COUNT", std::to_string(round)}});
  };
  EXPECT_EQ(snapshot_run_id(gzrun("4242", 0)), snapshot_run_id(gzrun("4242", 3)));
  EXPECT_NE(snapshot_run_id(gzrun("4242", 0)), snapshot_run_id(gzrun("4243", 0)));
  EXPECT_FALSE(snapshot_run_id(gzrun("4242", 0)).empty());
  EXPECT_EQ(snapshot_run_id(Env()), "");
  EXPECT_EQ(snapshot_run_id(Env(Vars{{"TORCHELASTIC_RUN_ID", "none"}})), "");
  EXPECT_EQ(snapshot_run_id(Env(Vars{{"TORCHELASTIC_RUN_ID", "abc"}, {"TORCHELASTIC_RESTART_COUNT", "2"}})),
            snapshot_run_id(Env(Vars{{"TORCHELASTIC_RUN_ID", "abc"}})));
  EXPECT_NE(snapshot_run_id(Env(Vars{{"TORCHELASTIC_RUN_ID", "abc"}})),
            snapshot_run_id(Env(Vars{{"TORCHELASTIC_RUN_ID", "abd"}})));
}

// A finished or failed job's snapshots in the same folder are not a new run's: neither listed nor
// read (also when a file is renamed to the new run's name), nor pruned by its writes; the new run
// removes them. (No mutation run for this one; the Trainer-level test has one.)
// A run that ends removes its own snapshots only: another job may share the folder (one
// snapshot_dir for a sweep). Mutation check: remove_all() deleting the whole folder fails this.
TEST(SnapshotStore, ARunThatEndsLeavesAnotherRunsSnapshots) {
  Dir d;
  SnapshotStore a(d.path.string(), 2, 21), b(d.path.string(), 2, 22);
  a.write({3, 0, 2, 77}, payload(3));
  b.write({4, 0, 2, 77}, payload(4));
  a.remove_all();
  EXPECT_TRUE(a.steps().empty());
  EXPECT_EQ(b.steps(), (std::vector<int64_t>{4}));
  EXPECT_EQ(b.read(4, 77), payload(4));
  b.remove_all();
  EXPECT_FALSE(fs::exists(d.path)) << "the last run to end removes the empty folder";
}

TEST(SnapshotStore, AnotherRunsSnapshotsAreNotListedNorReadAndAreRemoved) {
  Dir d;
  SnapshotStore old_run(d.path.string(), 2, 11), new_run(d.path.string(), 2, 12);
  for (int64_t step = 3; step <= 5; ++step) old_run.write({step, 0, 2, 77}, payload(step));
  EXPECT_TRUE(new_run.steps().empty()) << "another run's snapshot would be restored";
  new_run.write({1, 0, 2, 77}, payload(1));
  EXPECT_EQ(new_run.steps(), (std::vector<int64_t>{1}));
  EXPECT_EQ(old_run.steps(), (std::vector<int64_t>{5, 4})) << "one run pruned another's";
  fs::copy_file(old_run.path(5), new_run.path(5));  // renamed: its header still names the old run
  EXPECT_EQ(new_run.steps(), (std::vector<int64_t>{1}));
  try {
    new_run.read(5, 77);
    FAIL() << "another run's snapshot was read";
  } catch (const gz::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("another run"), std::string::npos) << e.what();
  }
  EXPECT_EQ(new_run.remove_other_runs(), 3);
  EXPECT_TRUE(old_run.steps().empty());
  EXPECT_EQ(new_run.steps(), (std::vector<int64_t>{1}));
  EXPECT_EQ(new_run.read(1, 77), payload(1));
}

// Two jobs share one snapshot_dir (a sweep): the one that starts later must not delete the
// snapshots of the one still running, only those of a run whose processes are gone. Mutation
// check: remove_other_runs() without the run_alive() test fails the first expectation.
TEST(SnapshotStore, ALiveRunsSnapshotsSurviveAnotherRunsCleanup) {
  Dir d;
  std::optional<SnapshotStore> running(std::in_place, d.path.string(), 2, 31);
  running->hold_run_lock();
  running->write({3, 0, 2, 77}, payload(3));
  running->write({4, 0, 2, 77}, payload(4));
  SnapshotStore later(d.path.string(), 2, 32);
  later.hold_run_lock();
  EXPECT_EQ(later.remove_other_runs(), 0) << "a live run's snapshots were deleted";
  EXPECT_EQ(running->steps(), (std::vector<int64_t>{4, 3}));
  running.reset();  // its process is gone (SIGKILL: no remove_all), its lock released
  SnapshotStore gone(d.path.string(), 2, 31);
  EXPECT_EQ(gone.steps(), (std::vector<int64_t>{4, 3})) << "the files outlive the process";
  EXPECT_EQ(later.remove_other_runs(), 2);
  EXPECT_TRUE(gone.steps().empty());
  later.write({1, 0, 2, 77}, payload(1));
  later.remove_all();
  EXPECT_FALSE(fs::exists(d.path)) << "a lock file was left behind: " << d.path;
}

// A run's lock file stays while any holder lives (another process of the run, or a copy of the
// store): one that ends must not leave the others holding a nameless file. Mutation check:
// remove_all() unlinking the lock file unconditionally fails the first expectation.
TEST(SnapshotStore, ARunsLockOutlivesOneOfItsHolders) {
  Dir d;
  SnapshotStore one(d.path.string(), 2, 41), other(d.path.string(), 2, 41);
  one.hold_run_lock();
  other.hold_run_lock();
  const fs::path lock = d.path / "run-0000000000000029.lock";
  ASSERT_TRUE(fs::exists(lock));
  one.remove_all();
  EXPECT_TRUE(fs::exists(lock)) << "the lock file went while a holder lives";
  other.remove_all();
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_FALSE(fs::exists(d.path));
}

}  // namespace test_snapshot_store
