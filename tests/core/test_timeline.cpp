// Timeline (GZ_TIMELINE): Chrome-trace output of spans and instants, escaping, the event cap.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "gz/core/timeline.h"

using namespace gz;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(Timeline, WritesSpansAndInstantsAsChromeTrace) {
  const std::string path = "/tmp/gz_test_timeline_" + std::to_string(::getpid()) + ".json";
  {
    Timeline tl(path, 3, /*max_events=*/4);
    auto t0 = Clock::now();
    tl.span("comm", "bucket \"0\"", t0, t0 + std::chrono::microseconds(1500), "\"bytes\":1024");
    std::thread([&] { tl.instant("ddp", "ready a\\b"); }).join();
    tl.instant("ddp", "third");
    tl.instant("ddp", "fourth");
    tl.instant("ddp", "dropped one");
    tl.instant("ddp", "dropped two");
    EXPECT_EQ(tl.dropped(), 2u);
    EXPECT_GT(Timeline::thread_cpu_us(), 0.0);
  }  // the destructor writes the file
  const auto s = slurp(path);
  std::remove(path.c_str());
  ASSERT_FALSE(s.empty());
  EXPECT_NE(s.find("\"traceEvents\":["), std::string::npos);
  EXPECT_NE(s.find("\"rank\":3,\"dropped\":2"), std::string::npos);
  EXPECT_NE(s.find("\"name\":\"bucket \\\"0\\\"\""), std::string::npos) << s;  // quotes escaped
  EXPECT_NE(s.find("\"name\":\"ready a\\\\b\""), std::string::npos) << s;      // backslash escaped
  EXPECT_NE(s.find("\"ph\":\"X\",\"dur\":1500.000"), std::string::npos) << s;
  EXPECT_NE(s.find("\"args\":{\"bytes\":1024}"), std::string::npos);
  EXPECT_EQ(count(s, "\"ph\":\"i\""), 3u);
  EXPECT_EQ(count(s, "\"pid\":3"), 4u);
  EXPECT_EQ(s.find("dropped one"), std::string::npos);
  // Balanced: one object per event plus the wrappers.
  EXPECT_EQ(count(s, "{"), count(s, "}"));
}

TEST(Timeline, OffWithoutTheVariable) {
  // The test runner does not set GZ_TIMELINE: nothing is recorded anywhere.
  if (std::getenv("GZ_TIMELINE")) GTEST_SKIP() << "GZ_TIMELINE is set";
  EXPECT_EQ(Timeline::process(), nullptr);
}
