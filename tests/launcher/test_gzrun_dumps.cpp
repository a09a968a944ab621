// gzrun's side of the flight-recorder verdict (dump_collector.h, verdict_report.h): bounding a
// dump, reading a process's state, where dumps go, and a node report judged end to end.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "dump_collector.h"
#include "dump_reader.h"
#include "verdict_report.h"

namespace {

using namespace gz::launcher;

std::string dump_with_ops(int n, const std::string& state_of_last) {
  std::string s =
      "{\"type\":\"header\",\"schema\":\"gz-flight-recorder\",\"version\":1,\"job\":\"j\",\"rank\":0,"
      "\"world\":1}\n"
      "{\"type\":\"comm\",\"id\":1,\"name\":\"c\",\"backend\":\"shm\",\"rank\":0,\"size\":1,\"parent\":0}\n";
  for (int i = 0; i < n; ++i)
    s += "{\"type\":\"op\",\"comm\":1,\"seq\":" + std::to_string(i) + ",\"coll\":" + std::to_string(i) +
         ",\"op\":\"allreduce\",\"dtype\":\"f32\",\"count\":1024,\"reduce\":\"sum\",\"state\":\"" +
         (i + 1 == n ? state_of_last : std::string("done")) + "\",\"phase\":\"backward\",\"step\":0}\n";
  return s + "{\"type\":\"end\",\"comms\":1,\"ops\":" + std::to_string(n) + "}\n";
}

TEST(GzrunDumps, BoundKeepsTheNewestOpsAndEverythingNotDone) {
  const std::string full = dump_with_ops(2000, "running");
  ASSERT_GT(full.size(), 64u * 1024);
  const std::string cut = bound_dump(full, 32 * 1024);
  EXPECT_LE(cut.size(), 32u * 1024 + 512);
  EXPECT_NE(cut.find("\"seq\":1999,"), std::string::npos) << "the running op stays";
  EXPECT_NE(cut.find("\"seq\":1998,"), std::string::npos) << "the newest done ops stay";
  EXPECT_EQ(cut.find("\"seq\":5,"), std::string::npos) << "the oldest go";
  EXPECT_NE(cut.find("gzrun kept the newest"), std::string::npos);
  // Still a whole dump for the doctor.
  gz::doctor::Picture pic;
  gz::doctor::read_text(pic, cut, "cut");
  ASSERT_EQ(pic.dumps.size(), 1u);
  EXPECT_TRUE(pic.dumps[0].complete);
  EXPECT_TRUE(pic.notes.empty()) << pic.notes.front();
  EXPECT_EQ(bound_dump(dump_with_ops(5, "done"), 32 * 1024), dump_with_ops(5, "done")) << "small: unchanged";
}

TEST(GzrunDumps, ProcessStateTellsStoppedFromRunningAndGone) {
  const pid_t child = fork();
  if (child == 0) {
    for (;;) pause();
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(process_state(child), "running");
  kill(child, SIGSTOP);
  std::string st;
  for (int i = 0; i < 200 && (st = process_state(child)) != "stopped"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(st, "stopped");
  kill(child, SIGKILL);
  for (int i = 0; i < 200 && (st = process_state(child)) != "exited"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(st, "exited") << "a zombie not reaped yet";
  waitpid(child, nullptr, 0);
  EXPECT_EQ(process_state(child), "gone");
}

TEST(GzrunDumps, DumpDirectoryFollowsTheLogDirAndTheRun) {
  LaunchOptions o;
  EXPECT_EQ(dump_dir_for(o, "123-0"), "/tmp/gz-dumps/123-0");
  o.log_dir = "/var/log/job";
  EXPECT_EQ(dump_dir_for(o, "123-1"), "/var/log/job/dumps/123-1");
}

// A node report of a worker that exited without a dump judged with its job line: the verdict
// names it from gzrun's view alone.
TEST(GzrunDumps, ReportOfADeadWorkerIsJudged) {
  const pid_t child = fork();
  if (child == 0) _exit(7);
  int st = 0;
  waitpid(child, &st, 0);
  WorkerBoard board;
  board.start_round("job-9", "/nonexistent", 0, 1, 0);
  board.add(WorkerView{0, 0, child, true, 0, false, false});
  board.ended(child, st, true, false);
  const std::string report = collect_node_report(board.snapshot(), "h0", 5, gz::Duration(50));
  EXPECT_NE(report.find("\"status\":\"exited with code 7\""), std::string::npos) << report;
  const std::string text = judge_reports(report + job_line("job-9", 1, 1, nullptr, {}), 0, "", "t");
  EXPECT_NE(text.find("verdict: rank 0 (node 0) died (exited with code 7)"), std::string::npos) << text;
}

}  // namespace
