#include "store/admission.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>

namespace gz::wire {

std::string source_key(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
    return buf;
  }
  if (ss.ss_family == AF_INET6) {
    in6_addr a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      in_addr v4{};
      std::copy(a.s6_addr + 12, a.s6_addr + 16, reinterpret_cast<uint8_t*>(&v4));
      inet_ntop(AF_INET, &v4, buf, sizeof buf);
      return buf;
    }
    if (IN6_IS_ADDR_LOOPBACK(&a)) return "::1";
    std::fill(a.s6_addr + 8, a.s6_addr + 16, 0);
    inet_ntop(AF_INET6, &a, buf, sizeof buf);
    return std::string(buf) + "/64";
  }
  return "unix";
}

Admission::Admission(const AdmissionLimits& limits) : limits_(limits) {
  limits_.max_pending = std::max<size_t>(1, limits_.max_pending);
  limits_.max_pending_per_source = std::max<size_t>(1, limits_.max_pending_per_source);
}

void Admission::drop_front(const std::string& key, std::vector<uint64_t>& out) {
  auto it = sources_.find(key);
  if (it == sources_.end() || it->second.empty()) return;
  out.push_back(it->second.front());
  it->second.pop_front();
  --waiting_;
}

std::vector<uint64_t> Admission::admit(uint64_t id, const std::string& source) {
  std::vector<uint64_t> evicted;
  auto& ids = sources_[source];
  ids.push_back(id);
  ++waiting_;
  if (ids.size() > limits_.max_pending_per_source) drop_front(source, evicted);
  while (pending() > limits_.max_pending) {
    // Refused connections only linger to deliver their reason: they go first.
    if (!refused_.empty()) {
      evicted.push_back(refused_.front());
      refused_.pop_front();
      continue;
    }
    // The source waiting with the most gives one up; among equals, the one waiting longest.
    const std::string* hog = nullptr;
    size_t most = 0;
    uint64_t oldest = 0;
    for (auto& [key, src] : sources_) {
      if (src.empty()) continue;
      if (src.size() > most || (src.size() == most && src.front() < oldest)) {
        hog = &key;
        most = src.size();
        oldest = src.front();
      }
    }
    if (!hog) break;
    drop_front(*hog, evicted);
  }
  return evicted;
}

void Admission::refused(uint64_t id, const std::string& source) {
  auto it = sources_.find(source);
  if (it == sources_.end()) return;
  auto pos = std::find(it->second.begin(), it->second.end(), id);
  if (pos == it->second.end()) return;
  it->second.erase(pos);
  --waiting_;
  refused_.push_back(id);
}

void Admission::release(uint64_t id, const std::string& source) {
  auto it = sources_.find(source);
  if (it != sources_.end()) {
    auto pos = std::find(it->second.begin(), it->second.end(), id);
    if (pos != it->second.end()) {
      it->second.erase(pos);
      --waiting_;
      return;
    }
  }
  auto r = std::find(refused_.begin(), refused_.end(), id);
  if (r != refused_.end()) refused_.erase(r);
}

size_t Admission::pending_from(const std::string& source) const {
  auto it = sources_.find(source);
  return it == sources_.end() ? 0 : it->second.size();
}

void Admission::forget_idle() {
  for (auto it = sources_.begin(); it != sources_.end();) {
    if (it->second.empty())
      it = sources_.erase(it);
    else
      ++it;
  }
}

std::string AbuseLog::note(Kind kind, const std::string& source, const std::string& detail,
                           Clock::time_point now) {
  ++counts_[static_cast<size_t>(kind)];
  latest_ = source;
  if (sources_.size() < 4096) sources_.insert(source);
  // Refusals of a hello are what a misconfigured node produces: say so once per source, at once.
  // Slot evictions and timeouts are what floods produce: only counted.
  if (kind == Kind::timed_out || kind == Kind::evicted) return {};
  if (told_.count(source) || lines_ >= kLinesPerPeriod) return {};
  if (told_.size() >= 4096) told_.clear();
  told_.insert(source);
  ++lines_;
  (void)now;
  return "store server: refused " + source + ": " + detail + " (further refusals are summarised every " +
         std::to_string(interval_.count() / 1000) + " s)";
}

std::string AbuseLog::summary(Clock::time_point now, bool force) {
  if (!force && now - last_summary_ < interval_) return {};
  uint64_t total = 0;
  for (uint64_t c : counts_) total += c;
  last_summary_ = now;
  if (total == 0) return {};
  static const char* kNames[] = {"wrong token", "bad first message", "oversized first message",
                                 "no hello in time", "evicted (slots full)"};
  std::string line = "store server: unauthenticated connections since the last report:";
  const char* sep = " ";
  for (size_t k = 0; k < static_cast<size_t>(Kind::count_); ++k) {
    if (!counts_[k]) continue;
    line += sep + std::to_string(counts_[k]) + " " + kNames[k];
    sep = ", ";
  }
  line += "; from " + std::to_string(sources_.size()) + (sources_.size() == 1 ? " source" : " sources") +
          ", latest " + latest_;
  std::fill(std::begin(counts_), std::end(counts_), 0);
  sources_.clear();
  lines_ = 0;
  return line;
}

}  // namespace gz::wire
