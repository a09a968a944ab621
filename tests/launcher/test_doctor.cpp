// The doctor (tools/doctor) on synthetic dumps: one case per verdict (stopped, hung, skipped,
// mismatched, died, node died, cut-off node, lost link, healthy) and every kind of bad input
// (corrupt line, cut-short file, another job, another version, missing dumps). Dumps are written
// in the schema the flight recorder writes (docs/debugging.md).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dump_reader.h"
#include "verdict.h"

namespace {

using namespace gz::doctor;

// An op line; `late` entries < 0 mean "not seen" (null).
struct Op {
  explicit Op(uint64_t c = 0) : coll(c) {}
  uint64_t coll;
  std::string op = "allreduce";
  uint64_t count = 1024;
  std::string dtype = "f32";
  std::string state = "done";
  int64_t step = 0;
  std::string phase = "backward";
  double age_ms = NAN;
  int waiting_for = -1;
  std::string error, error_kind;
  int error_peer = -1;
  std::vector<double> late;
};

std::string op_line(uint64_t comm, const Op& o) {
  std::string s = "{\"type\":\"op\",\"comm\":" + std::to_string(comm) + ",\"seq\":" + std::to_string(o.coll) +
                  ",\"coll\":" + std::to_string(o.coll) + ",\"op\":\"" + o.op + "\"";
  if (o.op != "barrier")
    s += ",\"dtype\":\"" + o.dtype + "\",\"count\":" + std::to_string(o.count) + ",\"reduce\":\"sum\"";
  s += ",\"state\":\"" + o.state + "\",\"phase\":\"" + o.phase + "\",\"step\":" + std::to_string(o.step);
  if (!std::isnan(o.age_ms)) s += ",\"age_ms\":" + std::to_string(o.age_ms);
  if (o.waiting_for >= 0) s += ",\"waiting_for\":" + std::to_string(o.waiting_for);
  if (!o.late.empty()) {
    s += ",\"late_us\":[";
    for (size_t i = 0; i < o.late.size(); ++i)
      s += (i ? "," : "") + (o.late[i] < 0 ? std::string("null") : std::to_string(o.late[i]));
    s += "]";
  }
  if (o.state == "failed")
    s += ",\"error\":\"" + o.error + "\",\"error_kind\":\"" + o.error_kind +
         "\",\"error_peer\":" + std::to_string(o.error_peer);
  return s + "}\n";
}

// One rank's dump of one world-wide communicator.
struct Dump {
  int rank = 0, world = 4, node = 0;
  std::string job = "job-1", backend = "shm", phase = "backward";
  int version = 1;
  int64_t step = 0;
  double phase_for_ms = 10;
  std::vector<Op> ops;
  bool end = true;
  std::string text() const {
    std::string s =
        "{\"type\":\"header\",\"schema\":\"gz-flight-recorder\",\"version\":" + std::to_string(version) +
        ",\"job\":\"" + job + "\",\"rank\":" + std::to_string(rank) + ",\"world\":" + std::to_string(world) +
        ",\"local_rank\":" + std::to_string(rank % 2) + ",\"node\":" + std::to_string(node) +
        ",\"host\":\"h" + std::to_string(node) + "\",\"pid\":" + std::to_string(1000 + rank) +
        ",\"reason\":\"signal\",\"request\":1,\"time_unix_ms\":1000,\"phase\":{\"name\":\"" + phase +
        "\",\"step\":" + std::to_string(step) + ",\"for_ms\":" + std::to_string(phase_for_ms) + "}}\n";
    s += "{\"type\":\"comm\",\"id\":1,\"name\":\"comm1\",\"backend\":\"" + backend +
         "\",\"rank\":" + std::to_string(rank) + ",\"size\":" + std::to_string(world) +
         ",\"ranks\":null,\"parent\":0,\"next_seq\":" + std::to_string(ops.size()) + "}\n";
    for (const Op& o : ops) s += op_line(1, o);
    if (end) s += "{\"type\":\"end\",\"comms\":1,\"ops\":" + std::to_string(ops.size()) + "}\n";
    return s;
  }
};

// A training loop's history: per step, all-reduces of `counts` (done).
std::vector<Op> history(int steps, const std::vector<uint64_t>& counts) {
  std::vector<Op> ops;
  for (int s = 0; s < steps; ++s)
    for (uint64_t c : counts) {
      Op o{ops.size()};
      o.count = c;
      o.step = s;
      ops.push_back(o);
    }
  return ops;
}

// The node report of a 2-rank node; `states` per local rank.
std::string node_line(int node, const std::vector<std::string>& states,
                      const std::vector<std::string>& status = {}, int first_failure = -1,
                      const std::string& job = "job-1") {
  std::string s = "{\"type\":\"gzrun\",\"node\":" + std::to_string(node) + ",\"host\":\"h" +
                  std::to_string(node) + "\",\"job\":\"" + job + "\",\"request\":1,\"ranks\":[";
  for (size_t l = 0; l < states.size(); ++l) {
    const int r = node * 2 + static_cast<int>(l);
    s += (l ? "," : "") + std::string("{\"rank\":") + std::to_string(r) +
         ",\"local_rank\":" + std::to_string(l) + ",\"pid\":" + std::to_string(1000 + r) + ",\"state\":\"" +
         states[l] + "\",\"status\":\"" + (l < status.size() ? status[l] : "") +
         "\",\"first_failure\":" + (r == first_failure ? "true" : "false") +
         ",\"answered\":" + (states[l] == "running" ? "true" : "false") + "}";
  }
  return s + "]}\n";
}

std::string job_line(int nnodes, int world, const std::string& failure = "",
                     const std::string& job = "job-1") {
  return "{\"type\":\"job\",\"job\":\"" + job + "\",\"world\":" + std::to_string(world) +
         ",\"nnodes\":" + std::to_string(nnodes) + ",\"nproc_per_node\":2,\"failure\":\"" + failure + "\"}\n";
}

Verdict judge_text(const std::string& text, Picture* out = nullptr, double stuck_ms = 1000) {
  Picture pic;
  read_text(pic, text, "test");
  settle(pic);
  JudgeOptions jo;
  jo.stuck_ms = stuck_ms;
  Verdict v = judge(pic, jo);
  if (out) *out = pic;
  return v;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Ranks 0..3 on nodes 0, 0, 1, 1; `victim` has stopped calling after collective `last`.
std::string hang_case(int victim, bool victim_dump, const std::string& victim_phase) {
  std::string text = job_line(2, 4);
  for (int r = 0; r < 4; ++r) {
    Dump d;
    d.rank = r, d.node = r / 2;
    d.ops = history(10, {1024});
    if (r == victim) {
      d.phase = victim_phase, d.step = 10, d.phase_for_ms = 41000;
      if (victim_dump) text += d.text();
      continue;
    }
    Op run{10};
    run.state = "running", run.step = 10, run.age_ms = 41000;
    run.late = {0, 0, 0, 0};
    run.late[victim] = -1;
    run.waiting_for = victim;
    d.ops.push_back(run);
    text += d.text();
  }
  return text;
}

TEST(Doctor, StoppedRankIsNamedFromItsProcessState) {
  std::string text = hang_case(3, false, "data") + node_line(0, {"running", "running"}) +
                     node_line(1, {"running", "stopped"});
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "stopped") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{3});
  EXPECT_TRUE(has(v.headline, "rank 3 (node 1)")) << v.headline;
  EXPECT_TRUE(has(v.headline, "SIGSTOP")) << v.headline;
  EXPECT_TRUE(has(v.headline, "allreduce(f32 x 1024, sum) #10")) << v.headline;
}

TEST(Doctor, HungRankNamesItsPhaseStepAndTime) {
  std::string text = hang_case(2, true, "data") + node_line(0, {"running", "running"}) +
                     node_line(1, {"running", "running"});
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "hung") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{2});
  EXPECT_TRUE(has(v.headline, "rank 2 (node 1) has not entered allreduce(f32 x 1024, sum) #10"))
      << v.headline;
  EXPECT_TRUE(has(v.headline, "step 10, phase data, 41.0 s")) << v.headline;
}

TEST(Doctor, SkippedCollectiveIsToldFromMismatch) {
  // Every step: 1000 then 300 floats. Rank 1 skips the 1000 of step 5 and calls the 300.
  std::string text = job_line(2, 4);
  for (int r = 0; r < 4; ++r) {
    Dump d;
    d.rank = r, d.node = r / 2;
    d.ops = history(5, {1000, 300});
    Op o{10};
    o.count = r == 1 ? 300 : 1000;
    o.step = 5;
    o.state = "failed", o.error = "collective mismatch", o.error_kind = "invalid";
    d.ops.push_back(o);
    text += d.text();
  }
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "skipped") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{1});
  EXPECT_TRUE(has(v.headline, "rank 1 (node 0) skipped a collective")) << v.headline;
  EXPECT_TRUE(has(v.headline, "allreduce(f32 x 1000, sum) #10")) << v.headline;
}

TEST(Doctor, MismatchedSizeIsNamedWithWhatDiffers) {
  std::string text = job_line(2, 4);
  for (int r = 0; r < 4; ++r) {
    Dump d;
    d.rank = r, d.node = r / 2;
    d.ops = history(5, {1000, 300});
    Op o{10};
    o.count = r == 2 ? 2000 : 1000;
    o.step = 5;
    o.state = "running", o.age_ms = 3000;
    d.ops.push_back(o);
    text += d.text();
  }
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "mismatch") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{2});
  EXPECT_TRUE(has(v.headline, "count differs")) << v.headline;
  EXPECT_TRUE(has(v.headline, "allreduce(f32 x 2000, sum)")) << v.headline;
}

TEST(Doctor, MismatchedDtypeBetweenTwoRanksUsesHistory) {
  // Two ranks, 1 vs 1: history (f64 every time) decides who is off, not the order of the names.
  std::string text;
  for (int r = 0; r < 2; ++r) {
    Dump d;
    d.rank = r, d.world = 2;
    d.ops = history(4, {256});
    for (auto& o : d.ops) o.dtype = "f64";
    Op o{4};
    o.count = 256;
    o.dtype = r == 0 ? "f32" : "f64";
    o.step = 4;
    d.ops.push_back(o);
    text += d.text();
  }
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "mismatch") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{0});
  EXPECT_TRUE(has(v.headline, "dtype differs")) << v.headline;
}

TEST(Doctor, DeadRankIsNamedWithItsSignal) {
  std::string text = job_line(2, 4, "node 1 (h1): rank 3 killed by signal 9");
  for (int r = 0; r < 3; ++r) {
    Dump d;
    d.rank = r, d.node = r / 2;
    d.ops = history(10, {1024});
    Op o{10};
    o.state = "failed", o.error = "peer rank 3 died", o.error_kind = "peer", o.error_peer = 3, o.step = 10;
    d.ops.push_back(o);
    text += d.text();
  }
  text += node_line(0, {"exited", "exited"}, {"exited with code 1", "exited with code 1"});
  text += node_line(1, {"exited", "killed"}, {"exited with code 1", "killed by signal 9 (SIGKILL)"}, 3);
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "died") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{3});
  EXPECT_TRUE(has(v.headline, "rank 3 (node 1) died (killed by signal 9 (SIGKILL))")) << v.headline;
}

TEST(Doctor, DeadRankWinsOverTheRanksStuckBehindIt) {
  // Rank 3 was killed; its node partner rank 2 has not entered #10 either (it was about to fail
  // on rank 3) and more ranks wait for rank 2 than for rank 3. gzrun saw rank 3 die first.
  std::string text = job_line(2, 4, "node 1 (h1): rank 3 killed by signal 9");
  for (int r = 0; r < 3; ++r) {
    Dump d;
    d.rank = r, d.node = r / 2;
    d.ops = history(10, {1024});
    if (r < 2) {
      Op o{10};
      o.state = "running", o.age_ms = 5, o.waiting_for = 2, o.step = 10;
      d.ops.push_back(o);
    }
    text += d.text();
  }
  text += node_line(0, {"running", "running"});
  text += node_line(1, {"running", "killed"}, {"", "killed by signal 9 (SIGKILL)"}, 3);
  const Verdict v = judge_text(text, nullptr, 0);  // gzrun judges failures with no "stuck" threshold
  EXPECT_EQ(v.cause, "died") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{3}) << v.headline;
}

TEST(Doctor, KilledNodeIsNamedFromClosedConnections) {
  std::string text = job_line(2, 4, "node 0 (h0): rank 0 exited with code 1");
  for (int r = 0; r < 2; ++r) {
    Dump d;
    d.rank = r, d.node = 0, d.backend = "gloo";
    d.ops = history(10, {1024});
    Op o{10};
    o.state = "failed", o.error = "connection closed by peer", o.error_kind = "peer", o.error_peer = 2 + r,
    o.step = 10;
    d.ops.push_back(o);
    text += d.text();
  }
  text += node_line(0, {"exited", "exited"}, {"exited with code 1", "exited with code 1"}, 0);
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "node_died") << v.headline;
  EXPECT_EQ(v.node, 1);
  EXPECT_TRUE(has(v.headline, "node 1 (ranks 2, 3) died")) << v.headline;
}

TEST(Doctor, SilentNodeWithoutClosedConnectionsIsCutOff) {
  std::string text = job_line(2, 4, "node 1 lost: no heartbeat for 3.0 s");
  for (int r = 0; r < 2; ++r) {
    Dump d;
    d.rank = r, d.node = 0, d.backend = "gloo";
    d.ops = history(10, {1024});
    Op o{10};
    o.state = "running", o.age_ms = 4200, o.waiting_for = 2 + r, o.step = 10;
    d.ops.push_back(o);
    text += d.text();
  }
  text += node_line(0, {"running", "running"});
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "link") << v.headline;
  EXPECT_EQ(v.node, 1);
  EXPECT_TRUE(has(v.headline, "node 1 (ranks 2, 3) is cut off")) << v.headline;
}

TEST(Doctor, EveryoneInTheOpWaitingAcrossOneNodeIsItsLink) {
  // 3 nodes x 1 rank: all entered #10; node 2 waits for the others, they wait for node 2.
  std::string text;
  for (int r = 0; r < 3; ++r) {
    Dump d;
    d.rank = r, d.world = 3, d.node = r, d.backend = "gloo";
    d.ops = history(10, {1024});
    Op o{10};
    o.state = "running", o.age_ms = 5000, o.waiting_for = r == 2 ? 0 : 2, o.step = 10;
    d.ops.push_back(o);
    text += d.text();
  }
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "link") << v.headline;
  EXPECT_EQ(v.node, 2) << v.headline;
  EXPECT_TRUE(has(v.headline, "the link of node 2")) << v.headline;
}

TEST(Doctor, HealthyJobHasNoCulprit) {
  std::string text;
  for (int r = 0; r < 4; ++r) {
    Dump d;
    d.rank = r, d.node = r / 2;
    d.ops = history(10, {1024});
    if (r < 3) {  // in op #10 for 0.2 ms, rank 3 about to join: an op in flight, not a hang
      Op o{10};
      o.state = "running", o.age_ms = 0.2, o.step = 10, o.waiting_for = 3, o.late = {0, 0, 0, -1};
      d.ops.push_back(o);
    }
    text += d.text();
  }
  const Verdict v = judge_text(text);
  EXPECT_EQ(v.cause, "healthy") << v.headline;
  EXPECT_TRUE(v.ranks.empty());
}

// ---- bad input: a clear note each, and the verdict from what is left

TEST(DoctorInput, CorruptLineIsNotedAndSkipped) {
  std::string text = hang_case(2, true, "data");
  const size_t at = text.find("{\"type\":\"op\"", text.find("\"rank\":1"));
  text.insert(at, "{\"type\":\"op\",\"comm\":1,\"seq\":3,\"op\":\"allre\n");  // a torn line
  text += node_line(0, {"running", "running"}) + node_line(1, {"running", "running"});
  Picture pic;
  const Verdict v = judge_text(text, &pic);
  EXPECT_EQ(v.cause, "hung") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{2});
  bool noted = false;
  for (const auto& n : pic.notes) noted = noted || has(n, "is not JSON");
  EXPECT_TRUE(noted);
}

TEST(DoctorInput, TruncatedDumpIsUsedAndNoted) {
  Dump a;
  a.rank = 0, a.world = 2;
  a.ops = history(3, {64});
  Op run{3};
  run.state = "running", run.age_ms = 9000, run.waiting_for = 1, run.late = {0, -1};
  a.ops.push_back(run);
  std::string cut = a.text();
  cut = cut.substr(0, cut.rfind("{\"type\":\"end\""));
  Dump b;
  b.rank = 1, b.world = 2, b.phase = "checkpoint", b.step = 3;
  b.ops = history(3, {64});
  Picture pic;
  const Verdict v = judge_text(cut + b.text(), &pic);
  EXPECT_EQ(v.cause, "hung") << v.headline;
  ASSERT_EQ(v.ranks, std::vector<int>{1});
  EXPECT_TRUE(has(v.headline, "phase checkpoint")) << v.headline;
  bool noted = false;
  for (const auto& n : pic.notes) noted = noted || has(n, "cut short");
  EXPECT_TRUE(noted);
}

TEST(DoctorInput, DumpOfAnotherJobIsIgnored) {
  std::string text = hang_case(3, false, "data") + node_line(0, {"running", "running"}) +
                     node_line(1, {"running", "stopped"});
  Dump stray;
  stray.rank = 3, stray.node = 1, stray.job = "old-job";  // would say rank 3 is fine
  stray.ops = history(11, {1024});
  Picture pic;
  const Verdict v = judge_text(text + stray.text(), &pic);
  EXPECT_EQ(v.cause, "stopped") << v.headline;
  bool noted = false;
  for (const auto& n : pic.notes) noted = noted || has(n, "job \"old-job\", not of this job");
  EXPECT_TRUE(noted);
}

TEST(DoctorInput, DumpOfAnotherVersionIsSkippedWithReason) {
  std::string text = hang_case(3, false, "data") + node_line(0, {"running", "running"}) +
                     node_line(1, {"running", "stopped"});
  Dump future;
  future.rank = 3, future.node = 1, future.version = 2;
  future.ops = history(11, {1024});
  Picture pic;
  const Verdict v = judge_text(text + future.text(), &pic);
  EXPECT_EQ(v.cause, "stopped") << v.headline;
  bool noted = false;
  for (const auto& n : pic.notes)
    noted = noted || has(n, "dump format version 2, this reader knows version 1");
  EXPECT_TRUE(noted);
}

TEST(DoctorInput, MissingNodeIsNotedAndJudgedFromTheOthers) {
  Picture pic;
  const Verdict v = judge_text(hang_case(3, false, "data") + node_line(0, {"running", "running"}), &pic);
  // Node 1 sent nothing: rank 3 is named from the others' waits; node 1 is silent (no report).
  ASSERT_FALSE(v.ranks.empty());
  EXPECT_NE(std::find(v.ranks.begin(), v.ranks.end(), 3), v.ranks.end()) << v.headline;
  int missing = 0;
  for (const auto& n : pic.notes) missing += has(n, "no dump from rank");
  EXPECT_EQ(missing, 1);
}

TEST(DoctorInput, GarbageAndEmptyInputGiveAVerdictAndNotes) {
  Picture pic;
  read_text(pic, "", "empty.jsonl");
  read_text(pic, "\x01\x02 not json at all\n{\"no\":\"type\"}\n", "junk.jsonl");
  settle(pic);
  const Verdict v = judge(pic);
  EXPECT_EQ(v.cause, "unknown");
  EXPECT_GE(pic.notes.size(), 3u);
  EXPECT_TRUE(has(render(v, pic), "junk.jsonl: line 1 is not JSON"));
}

}  // namespace
