// Minimal leveled logging to stderr. GZ_LOG_LEVEL=debug|info|warn|error (default warn).
#pragma once

#include <string>

#include "gz/core/error.h"

namespace gz {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

/// @brief Current threshold (read once from GZ_LOG_LEVEL).
LogLevel log_level();
/// @brief Write one line atomically to stderr: "[gz <level> r<rank>] message".
void log_line(LogLevel level, const std::string& message);
/// @brief The rank this process's lines carry from now on (they carry $RANK until then): a worker
/// that gzrun moved to a new round in place has another rank than its environment says.
void set_log_rank(int rank);

}  // namespace gz

#define GZ_LOG(level, ...)                                                   \
  do {                                                                       \
    if (::gz::LogLevel::level >= ::gz::log_level())                          \
      ::gz::log_line(::gz::LogLevel::level, ::gz::detail::concat(__VA_ARGS__)); \
  } while (0)
