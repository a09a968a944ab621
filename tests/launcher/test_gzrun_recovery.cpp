// gzrun --recovery in-place end to end (label mp): a failed worker is replaced alone while the
// others keep running; the budget bounds the replacements; restart mode stays as it was.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "gzrun_harness.h"

using namespace gz::test;

namespace {

/// "start rank=.. pid=.. restart=.. replacement=.. recovery=.. run_id=.." -> key -> value.
std::map<std::string, std::string> parse_start(const std::string& text) {
  std::map<std::string, std::string> m;
  std::smatch sm;
  std::string rest = text;
  const std::regex kv("([a-z_]+)=(\\S+)");
  while (std::regex_search(rest, sm, kv)) {
    m[sm[1]] = sm[2];
    rest = sm.suffix();
  }
  return m;
}

size_t count_lines_with(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (const auto& line : split_lines(text))
    if (line.find(what) != std::string::npos) ++n;
  return n;
}

}  // namespace

// Mutation check: on_exit ignoring --recovery (always the restart path) fails here: the survivors
// are restarted (start_0_1_0 exists) and "restarting all" is printed.
TEST(GzrunRecovery, InPlaceReplacesOnlyTheFailedWorker) {
  TempDir dir;
  const std::string logs = dir.file("logs");
  GzrunProcess g({"--recovery", "in-place", "--nproc-per-node", "3", "--max-restarts", "2", "--log-dir", logs,
                  kWorker, "inplace", dir.path(), "1", "first"},
                 dir);
  ASSERT_TRUE(g.wait(30)) << "gzrun hung: " << g.describe();
  EXPECT_EQ(g.exit_code(), 0) << g.describe();
  const std::string err = g.err();
  EXPECT_EQ(
      count_lines_with(err, "replacing it in place (replacement 1 of 2): the other workers keep running"), 1u)
      << err;
  EXPECT_NE(err.find("rank 1 (pid "), std::string::npos) << err;
  EXPECT_EQ(err.find("restarting all"), std::string::npos) << err;
  EXPECT_EQ(err.find("budget is spent"), std::string::npos) << err;

  auto first = parse_start(read_file(dir.file("start_0_0_0")));
  for (int r : {0, 2}) {
    SCOPED_TRACE("survivor rank " + std::to_string(r));
    auto s = parse_start(read_file(dir.file("start_" + std::to_string(r) + "_0_0")));
    ASSERT_FALSE(s["pid"].empty()) << g.describe();
    EXPECT_EQ(s["recovery"], "in_place");
    // Started once: neither replaced nor restarted, and the same process ended it.
    EXPECT_FALSE(file_exists(dir.file("start_" + std::to_string(r) + "_0_1")));
    EXPECT_FALSE(file_exists(dir.file("start_" + std::to_string(r) + "_1_0")));
    EXPECT_NE(g.out().find("[" + std::to_string(r) + "] end rank=" + std::to_string(r) + " pid=" + s["pid"]),
              std::string::npos)
        << g.describe();
  }
  auto victim = parse_start(read_file(dir.file("start_1_0_0")));
  auto repl = parse_start(read_file(dir.file("start_1_0_1")));
  ASSERT_FALSE(repl["pid"].empty()) << "no replacement of rank 1 started: " << g.describe();
  EXPECT_NE(repl["pid"], victim["pid"]);
  EXPECT_EQ(repl["replacement"], "1");
  EXPECT_EQ(repl["restart"], "0");  // the same round: GZ_RESTART_COUNT and GZ_RUN_ID stay
  EXPECT_EQ(repl["recovery"], "in_place");
  EXPECT_EQ(repl["run_id"], first["run_id"]);
  EXPECT_FALSE(file_exists(dir.file("start_1_0_2")));
  // The log file shows the victim's start, gzrun's note and the replacement's start, in order.
  const std::string log = read_file(logs + "/rank_1.log");
  const size_t a = log.find("pid=" + victim["pid"]), b = log.find("[gzrun] rank 1 (pid " + victim["pid"]),
               c = log.find("pid=" + repl["pid"]);
  EXPECT_TRUE(a != std::string::npos && b != std::string::npos && c != std::string::npos && a < b && b < c)
      << log;
}

// Mutation checks: no budget check in replace_in_place -> endless replacements (the wait times
// out); the budget not reset per round -> one replacement line instead of two.
TEST(GzrunRecovery, InPlaceBudgetSpentFallsBackToRestartAndGivesUp) {
  TempDir dir;
  GzrunProcess g({"--recovery=in-place", "--nproc-per-node", "2", "--max-restarts", "1", "--grace-period",
                  "1", kWorker, "inplace", dir.path(), "1", "always"},
                 dir);
  ASSERT_TRUE(g.wait(30)) << "gzrun did not stop replacing: " << g.describe();
  EXPECT_EQ(g.exit_code(), 1) << g.describe();
  EXPECT_LT(g.elapsed_s(), 20.0);
  const std::string err = g.err();
  // Per round: one replacement, then the budget is spent; round 0 restarts the job, round 1 gives up.
  EXPECT_EQ(count_lines_with(err, "replacing it in place (replacement 1 of 1)"), 2u) << err;
  EXPECT_EQ(count_lines_with(err, "in-place budget is spent (1 replacement(s) of --max-restarts 1"), 2u)
      << err;
  EXPECT_EQ(count_lines_with(err, "restarting all local workers (restart 1 of 1)"), 1u) << err;
  EXPECT_NE(err.find("giving up after 1 restart(s)"), std::string::npos) << err;
  for (const char* f : {"start_1_0_0", "start_1_0_1", "start_1_1_0", "start_1_1_1"})
    EXPECT_TRUE(file_exists(dir.file(f))) << f << "\n" << g.describe();
  for (const char* f : {"start_1_0_2", "start_1_1_2", "start_1_2_0"})
    EXPECT_FALSE(file_exists(dir.file(f))) << f << "\n" << g.describe();
  auto r = parse_start(read_file(dir.file("start_1_1_1")));
  EXPECT_EQ(r["restart"], "1");
  EXPECT_EQ(r["replacement"], "1");
}

// A worker that fails after another of the round finished (exit 0: the job is ending) is not
// replaced: its replacement would wait for peers that are gone. The restart path runs instead.
// Mutation check: without the exit-0 rule in replace_in_place the line "replacing it in place"
// appears (and the replacement exits 0 at once, so the job would end without a restart).
TEST(GzrunRecovery, AFailureAfterAWorkerFinishedTakesTheRestartPath) {
  TempDir dir;
  GzrunProcess g({"--recovery", "in-place", "--nproc-per-node", "2", "--max-restarts", "1", kWorker,
                  "inplace", dir.path(), "1", "late"},
                 dir);
  ASSERT_TRUE(g.wait(30)) << g.describe();
  EXPECT_EQ(g.exit_code(), 0) << g.describe();
  const std::string err = g.err();
  EXPECT_EQ(err.find("replacing it in place"), std::string::npos) << err;
  EXPECT_EQ(count_lines_with(err, "restarting all local workers (restart 1 of 1)"), 1u) << err;
  EXPECT_TRUE(file_exists(dir.file("start_1_1_0"))) << g.describe();
}

// Mutation check: on_exit replacing in restart mode too -> "replacing it in place" appears and
// the survivors are not restarted.
TEST(GzrunRecovery, RestartModeRestartsEveryWorker) {
  TempDir dir;
  GzrunProcess g(
      {"--nproc-per-node", "3", "--max-restarts", "1", kWorker, "inplace", dir.path(), "1", "first"}, dir);
  ASSERT_TRUE(g.wait(30)) << g.describe();
  EXPECT_EQ(g.exit_code(), 0) << g.describe();
  EXPECT_EQ(g.err().find("in place"), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("restarting all local workers (restart 1 of 1)"), std::string::npos) << g.describe();
  for (int r = 0; r < 3; ++r) {
    auto s = parse_start(read_file(dir.file("start_" + std::to_string(r) + "_1_0")));
    EXPECT_EQ(s["recovery"], "restart") << "rank " << r << "\n" << g.describe();
    EXPECT_EQ(s["replacement"], "0") << "rank " << r;
  }
  EXPECT_FALSE(file_exists(dir.file("start_1_0_1")));
}

// Mutation check: worker_env without GZ_RECOVERY/GZ_REPLACEMENT, or keeping an inherited value.
TEST(GzrunRecovery, WorkersAlwaysGetTheRecoveryMode) {
  TempDir dir;
  GzrunProcess d({"--nproc-per-node", "2", kWorker, "env"}, dir,
                 {{"GZ_RECOVERY", "in_place"}, {"GZ_REPLACEMENT", "7"}});
  ASSERT_TRUE(d.wait(20)) << d.describe();
  ASSERT_EQ(d.exit_code(), 0) << d.describe();
  auto env = parse_env_output(d.out());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(env[r]["GZ_RECOVERY"], "restart") << d.describe();
    EXPECT_EQ(env[r]["GZ_REPLACEMENT"], "0") << d.describe();
  }
  GzrunProcess i({"--recovery", "in-place", kWorker, "env"}, dir);
  ASSERT_TRUE(i.wait(20)) << i.describe();
  ASSERT_EQ(i.exit_code(), 0) << i.describe();
  EXPECT_EQ(parse_env_output(i.out())[0]["GZ_RECOVERY"], "in_place") << i.describe();
}

TEST(GzrunRecovery, BadModeIsRejectedNamingTheAcceptedValues) {
  TempDir dir;
  GzrunProcess g({"--recovery", "inplace", kWorker, "env"}, dir);
  ASSERT_TRUE(g.wait(10));
  EXPECT_EQ(g.exit_code(), 2) << g.describe();
  EXPECT_NE(g.err().find("--recovery 'inplace': expected restart"), std::string::npos) << g.describe();
  EXPECT_NE(g.err().find("or in-place"), std::string::npos) << g.describe();
  EXPECT_EQ(g.out(), "");
}

// Workers killed while gzrun stops (its SIGKILL after the grace period, on a signal to gzrun) are
// never replaced. Mutation check: replacing in on_exit's stopping branch too -> "in place" lines
// and workers left running until the test kills gzrun.
TEST(GzrunRecovery, SignalToGzrunStopsEveryWorkerAsInRestartMode) {
  TempDir dir;
  GzrunProcess g({"--recovery", "in-place", "--max-restarts", "3", "--grace-period", "0.5",
                  "--nproc-per-node", "2", kWorker, "sleep", dir.path(), "60", "ignore-term"},
                 dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const std::string path = dir.file("pid_" + std::to_string(r));
    for (int i = 0; i < 1500 && !file_exists(path); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::istringstream in(read_file(path));
    pid_t worker = 0, grandchild = 0;
    if (in >> worker >> grandchild) pids.insert(pids.end(), {worker, grandchild});
  }
  ASSERT_EQ(pids.size(), 4u) << g.describe();
  ASSERT_EQ(::kill(g.pid(), SIGTERM), 0);
  const bool exited = g.wait(10);
  const auto alive = wait_gone(pids, 2);
  for (pid_t p : alive) ::kill(p, SIGKILL);
  ASSERT_TRUE(exited) << g.describe();
  EXPECT_EQ(g.exit_code(), 128 + SIGTERM) << g.describe();
  EXPECT_TRUE(alive.empty()) << alive.size() << " processes left behind";
  EXPECT_EQ(g.err().find("in place"), std::string::npos) << g.describe();
  EXPECT_EQ(split_lines(g.out()).size(), 2u)
      << g.describe();  // one "sleeping" per worker: none started again
}
