// Who the store server lets wait for authentication, and for how long: bounded slots for
// unauthenticated connections (in all and per source address), the oldest evicted first and
// never an authenticated one; a pause after each refused token per source; and a log of abuse
// that says what happened without writing a line per connection. No sockets here: the server
// passes connection ids, source keys and the time, so all of it is testable alone.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gz/core/deadline.h"

namespace gz::wire {

/// @brief The address a connection's slot limit applies to: the IPv4 address (also for
/// IPv4-mapped IPv6), or the /64 prefix of an IPv6 address (one host usually owns a whole /64).
std::string source_key(const sockaddr_storage& addr);

/// @brief Slots of unauthenticated connections.
struct AdmissionLimits {
  size_t max_pending = 256;            ///< in all
  size_t max_pending_per_source = 32;  ///< per source_key()
  Duration failure_delay{100};         ///< after a refused token, the source's next hello waits this long
};

/// @brief Bookkeeping of unauthenticated connections (ids are unique and increasing).
class Admission {
 public:
  explicit Admission(const AdmissionLimits& limits);

  /// @brief Track a new unauthenticated connection. Returns the connections to drop to stay
  /// within the limits, never `id` itself: the oldest of the same source when that source is
  /// full, else the oldest of the source holding the most slots. Evicted ids are no longer
  /// tracked.
  std::vector<uint64_t> admit(uint64_t id, const std::string& source);
  /// @brief `id` authenticated or went away: free its slot. Unknown ids are ignored.
  void release(uint64_t id, const std::string& source);
  /// @brief A hello from `source` was refused for its token at `now`.
  void failed(const std::string& source, Clock::time_point now);
  /// @brief Earliest time the next hello from `source` may be judged (a past time if at once).
  Clock::time_point gate(const std::string& source) const;
  /// @brief Forget sources with no slot and an open gate.
  void forget_idle(Clock::time_point now);

  size_t pending() const { return pending_; }
  size_t pending_from(const std::string& source) const;
  size_t sources() const { return sources_.size(); }
  const AdmissionLimits& limits() const { return limits_; }

 private:
  struct Source {
    std::deque<uint64_t> ids;  // oldest first
    Clock::time_point gate{};
  };
  void drop_front(const std::string& key, std::vector<uint64_t>& out);

  AdmissionLimits limits_;
  std::unordered_map<std::string, Source> sources_;
  size_t pending_ = 0;
};

/// @brief What the server tells its log about unauthenticated clients: the first refusal from a
/// source at once (for at most kLinesPerPeriod sources per period: an attacker with many
/// addresses gets counted, not listed), then counts at most every `interval`.
class AbuseLog {
 public:
  enum class Kind { wrong_token, bad_hello, oversized, timed_out, evicted, count_ };
  static constexpr size_t kLinesPerPeriod = 4;
  explicit AbuseLog(Duration interval = Duration(10000)) : interval_(interval) {}
  /// @brief Count one event; returns a line to log now, or "" (most events).
  std::string note(Kind kind, const std::string& source, const std::string& detail, Clock::time_point now);
  /// @brief The summary line when one is due (or `force` and anything was counted), else "".
  std::string summary(Clock::time_point now, bool force = false);

 private:
  Duration interval_;
  uint64_t counts_[static_cast<size_t>(Kind::count_)] = {};
  std::unordered_set<std::string> told_;     // sources whose first refusal was logged
  std::unordered_set<std::string> sources_;  // sources in the current summary period
  std::string latest_;
  size_t lines_ = 0;  // refusal lines written in the current period
  Clock::time_point last_summary_ = Clock::now();
};

}  // namespace gz::wire
