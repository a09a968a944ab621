#include "joiners.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "etcd_backend.h"
#include "gz/store/store.h"

namespace gz::launcher {

long long seq_of(const std::string& entry) { return std::atoll(entry.substr(0, entry.find(':')).c_str()); }

std::string host_of(const std::string& entry) {
  const size_t a = entry.find(':'), b = entry.rfind(':');
  return a == std::string::npos || b <= a ? std::string() : entry.substr(a + 1, b - a - 1);
}

std::vector<std::string> parse_entries(const std::string& text) {
  std::vector<std::string> out;
  std::vector<long long> seen;
  for (size_t b = 0; b < text.size();) {
    size_t e = text.find(';', b);
    if (e == std::string::npos) e = text.size();
    std::string entry = text.substr(b, e - b);
    b = e + 1;
    if (entry.empty() || entry.find(':') == std::string::npos) continue;
    const long long seq = seq_of(entry);
    if (std::find(seen.begin(), seen.end(), seq) != seen.end()) continue;
    seen.push_back(seq);
    out.push_back(entry);
  }
  return out;
}

std::string joiner_beat_key(long long seq) { return "gzrun/waiting/" + std::to_string(seq); }

Duration joiner_lease(const LaunchOptions& o) {
  const auto interval =
      std::chrono::milliseconds(static_cast<long long>(o.effective_heartbeat_interval_s() * 1000));
  const Duration lease = std::max<Duration>(std::chrono::seconds(1), 3 * interval);
  if (!o.etcd()) return lease;
  // etcd: a beat may wait out one member that stopped answering (its attempt timeout) and then
  // the next member's answer before it lands; a live joiner must not look dead meanwhile.
  const Duration attempt = etcd_store_options(o, "", false).attempt_timeout;
  return std::max(lease, 2 * attempt + 2 * interval);
}

void JoinerBeats::observe(Store& s, const std::vector<std::string>& entries) {
  for (const std::string& e : entries) {
    const int64_t beats = s.add(joiner_beat_key(seq_of(e)), 0);
    const auto now = std::chrono::steady_clock::now();
    auto it = seen_.find(seq_of(e));
    if (it == seen_.end()) {
      seen_[seq_of(e)] = Seen{beats, false, now, now};
    } else if (beats != it->second.beats) {
      it->second = Seen{beats, true, now, it->second.first};
    }
  }
}

std::vector<std::string> JoinerBeats::alive(const std::vector<std::string>& entries,
                                            const std::string& self) const {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> out;
  for (const std::string& e : entries) {
    auto it = seen_.find(seq_of(e));
    const bool beating = it != seen_.end() && it->second.moved && now - it->second.changed < lease_;
    if (e == self || beating) out.push_back(e);
  }
  return out;
}

bool JoinerBeats::undecided(const std::vector<std::string>& entries, const std::string& self) const {
  const auto now = std::chrono::steady_clock::now();
  for (const std::string& e : entries) {
    if (e == self) continue;
    auto it = seen_.find(seq_of(e));
    if (it != seen_.end() && !it->second.moved && now - it->second.first < lease_) return true;
  }
  return false;
}

std::vector<std::string> wait_for_alive(Store& s, const std::vector<std::string>& entries, size_t want,
                                        Duration lease) {
  if (entries.size() < want) return {};  // not enough of them, alive or not: no need to look
  JoinerBeats beats(lease);
  const Deadline deadline = Deadline::after(lease);
  for (;;) {
    beats.observe(s, entries);
    std::vector<std::string> alive = beats.alive(entries);
    if (alive.size() >= want || deadline.expired()) return alive;
    ::usleep(50000);
  }
}

}  // namespace gz::launcher
