// Who the store server lets wait for authentication: bounded slots for unauthenticated
// connections (in all and per source), refused connections evicted first, then the oldest of the
// source holding the most, never an authenticated one; and a log of abuse that says what happened
// without writing a line per connection. No sockets here: the server passes connection ids,
// source keys (peer_identity.h) and the time, so all of it is testable alone.
//
// Nothing here delays a handshake: a correct proof is accepted the moment it arrives, whatever
// others sent before it. Guessing is bounded by the token's strength, not by a pause: the server
// proves itself first (handshake.h), so a pause on wrong proofs would slow only the online
// guesser, never the offline one, while it made every client of a shared source (all local
// processes of a user, a NAT) wait behind the guesser.
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
/// Loopback peers are told apart by user instead (peer_identity.h).
std::string source_key(const sockaddr_storage& addr);

/// @brief Slots of unauthenticated connections.
struct AdmissionLimits {
  size_t max_pending = 256;            ///< in all (waiting and refused)
  size_t max_pending_per_source = 32;  ///< waiting ones per source key
};

/// @brief Bookkeeping of unauthenticated connections (ids are unique and increasing).
class Admission {
 public:
  explicit Admission(const AdmissionLimits& limits);

  /// @brief Track a new unauthenticated connection. Returns the connections to drop to stay
  /// within the limits, never `id` itself: when its source has too many waiting, that source's
  /// oldest; when all slots are taken, the oldest refused connection, else the oldest of the
  /// source waiting with the most. Evicted ids are no longer tracked.
  std::vector<uint64_t> admit(uint64_t id, const std::string& source);
  /// @brief `id` was refused (it only lingers to deliver the reason): the first to go.
  void refused(uint64_t id, const std::string& source);
  /// @brief `id` authenticated or went away: free its slot. Unknown ids are ignored.
  void release(uint64_t id, const std::string& source);
  /// @brief Forget sources with nothing waiting.
  void forget_idle();

  size_t pending() const { return waiting_ + refused_.size(); }
  /// @brief Connections of `source` waiting to authenticate (refused ones not counted).
  size_t pending_from(const std::string& source) const;
  size_t refused_count() const { return refused_.size(); }
  size_t sources() const { return sources_.size(); }
  const AdmissionLimits& limits() const { return limits_; }

 private:
  void drop_front(const std::string& key, std::vector<uint64_t>& out);

  AdmissionLimits limits_;
  std::unordered_map<std::string, std::deque<uint64_t>> sources_;  // waiting ids, oldest first
  std::deque<uint64_t> refused_;                                   // oldest first
  size_t waiting_ = 0;
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
