#include "gz/core/log.h"

#include <unistd.h>

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

void log_line(LogLevel level, const std::string& message) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  const char* rank = std::getenv("RANK");
  std::string line = std::string("[gz ") + names[static_cast<int>(level)];
  if (rank) line += std::string(" r") + rank;
  line += "] " + message + "\n";
  // One write() per line keeps lines whole when several threads or processes share stderr.
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

}  // namespace gz
