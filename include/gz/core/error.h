// Error hierarchy of Guozhuang. Exceptions at the public API; messages carry rank, peer, op,
// sequence number and elapsed time where they are known (see ErrorContext).
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace gz {

/// @brief Base of every exception Guozhuang throws.
///
/// Besides its message an error may name the peer rank involved (in the group of the op that
/// raised it) and keep the error that caused it, so a layer that adds context (the hierarchical
/// backend naming its sub-step) rethrows the same type with the cause attached, never a string.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  /// @brief With the peer rank involved (-1: none or unknown) and the error it wraps (may be null).
  Error(const std::string& what, int peer, std::exception_ptr cause = nullptr)
      : std::runtime_error(what), peer_(peer), cause_(std::move(cause)) {}
  /// @brief Rank of the peer that failed, in the group of the op that raised this; -1 if unknown.
  int peer() const { return peer_; }
  /// @brief The error this one wraps, or null.
  std::exception_ptr cause() const { return cause_; }

 private:
  int peer_ = -1;
  std::exception_ptr cause_;
};

/// @brief A blocking call passed its deadline (a peer is missing, stuck or slow).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// @brief A peer disconnected, died or sent something that makes no sense.
class PeerError : public Error {
 public:
  using Error::Error;
};

/// @brief Bad input from the caller: nothing was changed.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// @brief The operation was cancelled by abort() (locally or on a peer).
class Aborted : public Error {
 public:
  using Error::Error;
};

/// @brief gzrun moved this worker to a new round (an elastic job's node lost or admitted) when it
/// could not follow the move: it withdrew from moves (RoundFollower::accept(false)) after gzrun
/// had committed to the move. Never an end of the job: the new round waits for this worker.
class MovedError : public Error {
 public:
  using Error::Error;
};

/// @brief Operating-system failure (socket, file, shared memory) with errno text.
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int err);
  int code() const { return code_; }

 private:
  int code_;
};

}  // namespace gz

/// Throw `type` with a message built by streaming the arguments, e.g.
/// GZ_THROW(gz::InvalidArgument, "bad count ", n);
#define GZ_THROW(type, ...) throw type(::gz::detail::concat(__VA_ARGS__))

/// Check a precondition; throws gz::InvalidArgument naming the condition.
#define GZ_CHECK_ARG(cond, ...)                                                           \
  do {                                                                                    \
    if (!(cond)) GZ_THROW(::gz::InvalidArgument, "invalid argument (" #cond "): ", ##__VA_ARGS__); \
  } while (0)

#include <sstream>
namespace gz::detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace gz::detail
