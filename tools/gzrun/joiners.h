// The nodes waiting to join an elastic round, and which of them are alive. A node appends itself
// to gzrun/round<r>/joined and, for as long as it waits, adds 1 to its beat key
// (gzrun/waiting/<seq>) on every poll. A node that gave up or was killed stays in the joined list
// but stops beating: only joiners whose beat was seen to move within the lease count as waiting,
// may be given a node rank, or make a running round end to admit them.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "gz/core/deadline.h"
#include "options.h"

namespace gz {
class Store;
}

namespace gz::launcher {

/// @brief "seq" of a "seq:host:id" entry.
long long seq_of(const std::string& entry);
/// @brief The "seq:host:id" entries of a joined/members value, in order, repeats of a seq dropped.
std::vector<std::string> parse_entries(const std::string& text);
/// @brief The host of an entry ("seq:host:id" -> host; empty when malformed).
std::string host_of(const std::string& entry);
/// @brief The beat key of the joiner with this seq.
std::string joiner_beat_key(long long seq);
/// @brief How long a joiner's beat may stand still before it no longer counts: at least 1 s,
/// and three heartbeat intervals (joiners beat every 50 ms); with etcd also two attempt timeouts
/// and two intervals (a beat that waits out a failed member, then lands on the next).
Duration joiner_lease(const LaunchOptions& o);

/// @brief What one observer has seen of the joiners' beats (each gzrun keeps its own: a beat is
/// a counter in the store, a change is noticed by reading it twice, by the observer's own clock).
class JoinerBeats {
 public:
  explicit JoinerBeats(Duration lease) : lease_(lease) {}
  /// @brief Read the beat of every entry (one round trip each) and note the ones that moved.
  void observe(Store& s, const std::vector<std::string>& entries);
  /// @brief The entries whose beat moved within the lease, as of the last observe(), plus
  /// `self` (this observer's own entry, alive by definition) when it is among them; in order.
  std::vector<std::string> alive(const std::vector<std::string>& entries, const std::string& self = {}) const;
  /// @brief Whether some entry (not `self`) is undecided: first read less than a lease ago and not
  /// seen to move yet (one read cannot tell a live joiner from a dead one). A round is not closed
  /// while one is: waiting at most a lease beats leaving a live joiner out of it.
  bool undecided(const std::vector<std::string>& entries, const std::string& self = {}) const;

 private:
  struct Seen {
    int64_t beats = -1;
    bool moved = false;  // changed at least once since first read
    std::chrono::steady_clock::time_point first{};
    std::chrono::steady_clock::time_point changed{};
  };
  Duration lease_;
  std::map<long long, Seen> seen_;
};

/// @brief Wait (at most the lease) until `want` of `entries` are seen alive, reading their beats
/// every 50 ms; returns those seen alive (fewer when the lease passed first).
std::vector<std::string> wait_for_alive(Store& s, const std::vector<std::string>& entries, size_t want,
                                        Duration lease);

}  // namespace gz::launcher
