#include "gz/core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace gz {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* v = std::getenv("GZ_LOG_LEVEL");
    if (!v) return LogLevel::warn;
    if (!std::strcmp(v, "debug")) return LogLevel::debug;
    if (!std::strcmp(v, "info")) return LogLevel::info;
    if (!std::strcmp(v, "error")) return LogLevel::error;
    return LogLevel::warn;
  }();
  return level;
}

namespace {
std::atomic<int> g_log_rank{-1};  // -1: $RANK
}  // namespace

void set_log_rank(int rank) { g_log_rank.store(rank); }

void log_line(LogLevel level, const std::string& message) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  const int set = g_log_rank.load();
  const char* env = std::getenv("RANK");
  const std::string rank = set >= 0 ? std::to_string(set) : env ? env : "";
  std::string line = std::string("[gz ") + names[static_cast<int>(level)];
  if (!rank.empty()) line += " r" + rank;
  line += "] " + message + "\n";
  // One write() per line keeps lines whole when several threads or processes share stderr.
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

}  // namespace gz
