#include "gz/core/timeline.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "gz/core/log.h"

namespace gz {

namespace {
uint64_t current_tid() { return static_cast<uint64_t>(::syscall(SYS_gettid)); }

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

Timeline* Timeline::process() {
  // Built once; a static object so its destructor writes the file at normal exit.
  static const std::unique_ptr<Timeline> tl = []() -> std::unique_ptr<Timeline> {
    const char* prefix = std::getenv("GZ_TIMELINE");
    if (!prefix || !*prefix) return nullptr;
    const char* r = std::getenv("RANK");
    const int rank = r ? std::atoi(r) : 0;
    return std::make_unique<Timeline>(std::string(prefix) + ".rank" + std::to_string(rank) + ".json", rank);
  }();
  return tl.get();
}

Timeline::Timeline(std::string path, int rank, size_t max_events)
    : path_(std::move(path)), rank_(rank), max_events_(max_events), origin_(Clock::now()) {
  // Chrome traces count microseconds; anchoring to wall-clock time lets the files of several
  // ranks (processes, simulated hosts of one machine) be laid side by side.
  origin_unix_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
}

Timeline::~Timeline() { flush(); }

double Timeline::thread_cpu_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

void Timeline::push(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

void Timeline::span(const char* category, std::string name, Clock::time_point begin, Clock::time_point end,
                    std::string args) {
  push({category, std::move(name), std::move(args),
        std::chrono::duration_cast<std::chrono::nanoseconds>(begin - origin_).count(),
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count(), current_tid()});
}

void Timeline::instant(const char* category, std::string name, std::string args) {
  push({category, std::move(name), std::move(args),
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - origin_).count(), -1,
        current_tid()});
}

size_t Timeline::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  FILE* f = std::fopen(path_.c_str(), "w");
  if (!f) {
    GZ_LOG(warn, "timeline: cannot write ", path_);
    return;
  }
  std::fprintf(f,
               "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"dropped\":%zu},\"traceEvents\":[\n",
               rank_, dropped_);
  bool first = true;
  for (const auto& e : events_) {
    const double ts = static_cast<double>(origin_unix_us_) + static_cast<double>(e.ts_ns) / 1e3;
    std::fprintf(f, "%s{\"cat\":\"%s\",\"name\":\"%s\",\"pid\":%d,\"tid\":%llu,\"ts\":%.3f",
                 first ? "" : ",\n", e.category, json_escape(e.name).c_str(), rank_,
                 static_cast<unsigned long long>(e.tid), ts);
    if (e.dur_ns >= 0)
      std::fprintf(f, ",\"ph\":\"X\",\"dur\":%.3f", static_cast<double>(e.dur_ns) / 1e3);
    else
      std::fprintf(f, ",\"ph\":\"i\",\"s\":\"t\"");
    if (!e.args.empty()) std::fprintf(f, ",\"args\":{%s}", e.args.c_str());
    std::fputs("}", f);
    first = false;
  }
  std::fputs("\n]}\n", f);
  std::fclose(f);
}

}  // namespace gz
