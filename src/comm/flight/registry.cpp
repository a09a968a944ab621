// The process's flight recorders (registry.h) and the recorder's clock (flight_recorder.h).
#include "comm/flight/registry.h"

#include <algorithm>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace gz::comm {

// ---------------------------------------------------------------- clock

namespace flight_detail {

namespace {
bool invariant_tsc() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, a, b, c, d);
  return (d & (1u << 8)) != 0;  // "TscInvariant": constant rate in every P-, C- and T-state
#else
  return false;
#endif
}
}  // namespace

bool g_use_tsc = invariant_tsc();

uint64_t steady_ticks() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace flight_detail

namespace {

struct Calibration {
  uint64_t ticks0;
  int64_t ns0;
  Calibration() : ticks0(flight_ticks()), ns0(static_cast<int64_t>(flight_detail::steady_ticks())) {}
};
Calibration& calibration() {
  static Calibration* c = new Calibration();  // never destroyed
  return *c;
}
// Taken at load time, so the calibration spans the process's life.
const bool g_calibrated = (calibration(), true);

// Ticks per ns from the start of the process to now; at least 20 ms apart (measured now if the
// process is younger than that).
double measure_rate() {
  const Calibration& c = calibration();
  uint64_t t1 = flight_ticks();
  int64_t n1 = static_cast<int64_t>(flight_detail::steady_ticks());
  if (n1 - c.ns0 < 20000000) {
    const uint64_t ta = flight_ticks();
    const int64_t na = static_cast<int64_t>(flight_detail::steady_ticks());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t1 = flight_ticks();
    n1 = static_cast<int64_t>(flight_detail::steady_ticks());
    return static_cast<double>(t1 - ta) / static_cast<double>(n1 - na);
  }
  return static_cast<double>(t1 - c.ticks0) / static_cast<double>(n1 - c.ns0);
}

}  // namespace

double flight_ticks_per_ns() {
  if (!flight_detail::g_use_tsc) return 1.0;
  // Re-measured at most every second (readers are dumps and reports, never the op path).
  static std::mutex mu;
  static double rate = 0;
  static int64_t at = 0;
  std::lock_guard<std::mutex> lock(mu);
  const int64_t now = static_cast<int64_t>(flight_detail::steady_ticks());
  if (rate == 0 || now - at > 1000000000) {
    rate = measure_rate();
    at = now;
  }
  return rate > 0 ? rate : 1.0;
}

int64_t flight_ticks_to_steady_ns(uint64_t ticks) {
  if (!flight_detail::g_use_tsc) return static_cast<int64_t>(ticks);
  (void)g_calibrated;
  // Relative to a fresh pair (now), so the error grows with the age of `ticks`, not of the process.
  const uint64_t t1 = flight_ticks();
  const int64_t n1 = static_cast<int64_t>(flight_detail::steady_ticks());
  const double back = static_cast<double>(static_cast<int64_t>(t1 - ticks)) / flight_ticks_per_ns();
  return n1 - static_cast<int64_t>(back);
}

const char* flight_clock_source() { return flight_detail::g_use_tsc ? "tsc" : "steady"; }

// ---------------------------------------------------------------- registry

FlightRegistry& flight_registry() {
  static FlightRegistry* r = new FlightRegistry();  // never destroyed: dumps may run during exit
  return *r;
}

void FlightRegistry::add(FlightRecorder* r) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.push_back(r);
}

void FlightRegistry::retire(FlightRecorder* r) {
  FlightSnapshot snap = r->snapshot();
  snap.retired = true;
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(std::remove(live_.begin(), live_.end(), r), live_.end());
  if (snap.next_seq == 0 && snap.records.empty()) return;  // never used: nothing to tell
  retired_.push_back(std::move(snap));
  if (retired_.size() > kRetired) retired_.pop_front();
}

std::vector<FlightSnapshot> FlightRegistry::snapshots(size_t max_records) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightSnapshot> out;
  out.reserve(live_.size() + retired_.size());
  for (FlightRecorder* r : live_) out.push_back(r->snapshot(max_records));
  for (const FlightSnapshot& s : retired_) {
    out.push_back(s);
    if (max_records && out.back().records.size() > max_records)
      out.back().records.erase(out.back().records.begin(),
                               out.back().records.end() - static_cast<std::ptrdiff_t>(max_records));
  }
  return out;
}

PeerLateness FlightRegistry::lateness_of(const FlightRecorder& r) {
  PeerLateness total = r.own_lateness();
  const FlightIdentity me = r.identity();
  std::lock_guard<std::mutex> lock(mu_);
  // Descendants fold into their parent's numbering, level by level.
  std::vector<std::pair<const FlightRecorder*, std::vector<int>>> todo;  // recorder, map to r's ranks
  for (FlightRecorder* c : live_)
    if (c != &r && c->identity().parent == r.id()) todo.push_back({c, c->identity().ranks});
  while (!todo.empty()) {
    auto [c, map] = todo.back();
    todo.pop_back();
    const PeerLateness l = c->own_lateness();
    for (size_t p = 0; p < l.late_ns.size() && p < map.size(); ++p) {
      const int to = map[p];
      if (to < 0 || to >= static_cast<int>(total.late_ns.size())) continue;
      total.late_ns[to] += l.late_ns[p];
      total.times_last[to] += l.times_last[p];
    }
    total.ops = std::max(total.ops, l.ops);
    for (FlightRecorder* g : live_) {
      const FlightIdentity gi = g->identity();
      if (gi.parent != c->id() || g == c) continue;
      std::vector<int> m;
      for (int x : gi.ranks) m.push_back(x >= 0 && x < static_cast<int>(map.size()) ? map[x] : -1);
      todo.push_back({g, m});
    }
  }
  if (me.ranks.size() == total.ranks.size()) total.ranks = me.ranks;
  return total;
}

}  // namespace gz::comm
