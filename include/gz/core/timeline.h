// A per-process event timeline (Chrome trace format) for finding where a training step's time goes:
// compute vs communication, queueing on the progress thread, idle wire. Off unless GZ_TIMELINE is set.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gz/core/deadline.h"

namespace gz {

/// @brief Records spans and instants from any thread; writes them as Chrome trace JSON
/// (chrome://tracing, Perfetto) when flushed or destroyed.
///
/// Horovod's HOROVOD_TIMELINE is the model: one file per rank, named by the user. Recording is a
/// mutex and a vector push (well under a microsecond); events past `max_events` are dropped and
/// counted, so a long run cannot eat memory.
class Timeline {
 public:
  /// @brief The process's timeline: with `GZ_TIMELINE=PREFIX` in the environment, one writing
  /// PREFIX.rank<R>.json (R = $RANK, else 0), shared by every component of the process and written
  /// at exit; nullptr when unset or empty (the normal case: callers skip recording).
  static Timeline* process();
  Timeline(std::string path, int rank, size_t max_events = 1000000);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// @brief A complete span [begin, end] on the calling thread. `args` is a JSON object body
  /// (e.g. `"bytes":1024`) or empty.
  void span(const char* category, std::string name, Clock::time_point begin, Clock::time_point end,
            std::string args = {});
  /// @brief A point event on the calling thread.
  void instant(const char* category, std::string name, std::string args = {});
  /// @brief CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID), in microseconds: with
  /// two readings around a span, says whether a thread ran or waited (or was starved) in it.
  static double thread_cpu_us();
  /// @brief Write what was recorded so far (the file is rewritten whole each time).
  void flush();
  const std::string& path() const { return path_; }
  size_t dropped() const;

 private:
  struct Event {
    const char* category;
    std::string name;
    std::string args;
    int64_t ts_ns;   // since origin_
    int64_t dur_ns;  // < 0: instant
    uint64_t tid;
  };
  void push(Event e);

  std::string path_;
  int rank_;
  size_t max_events_;
  Clock::time_point origin_;
  int64_t origin_unix_us_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  size_t dropped_ = 0;
};

}  // namespace gz
