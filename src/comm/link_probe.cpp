// Link probe: timed point-to-point exchanges between pairs of ranks, round by round, and the
// judgement of which links and nodes are slow (see gz/comm/link_probe.h).
#include "gz/comm/link_probe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>

#include "gz/core/error.h"

namespace gz::comm {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One pair, both ends: the initiator (a) times, the responder (b) echoes.
LinkMeasure probe_pair(Communicator& comm, int a, int b, const LinkProbeOptions& o) {
  const bool initiator = comm.rank() == a;
  const int peer = initiator ? b : a;
  OpOptions op;
  op.tag = o.tag;
  op.timeout = o.timeout;
  int64_t word = 0;
  const auto round_trip = [&] {
    if (initiator) {
      comm.send(&word, 1, DType::i64, peer, op);
      comm.recv(&word, 1, DType::i64, peer, op);
    } else {
      comm.recv(&word, 1, DType::i64, peer, op);
      comm.send(&word, 1, DType::i64, peer, op);
    }
  };
  round_trip();  // untimed: both ends start together; a lazy transport connects here
  std::vector<double> rtts;
  for (int i = 0; i < o.pings; ++i) {
    const auto t0 = Clock::now();
    round_trip();
    rtts.push_back(seconds_since(t0) * 1e6);
  }
  std::vector<uint8_t> buffer(o.bytes, 0x5a);
  double best = INFINITY;
  for (int k = 0; k < o.repeats; ++k) {
    const auto t0 = Clock::now();
    if (initiator) {
      comm.send(buffer.data(), buffer.size(), DType::u8, peer, op);
      comm.recv(buffer.data(), buffer.size(), DType::u8, peer, op);
    } else {
      comm.recv(buffer.data(), buffer.size(), DType::u8, peer, op);
      comm.send(buffer.data(), buffer.size(), DType::u8, peer, op);
    }
    best = std::min(best, seconds_since(t0));
  }
  LinkMeasure m;
  m.a = a;
  m.b = b;
  m.rtt_us = *std::min_element(rtts.begin(), rtts.end());
  m.bytes_per_s = 2.0 * static_cast<double>(o.bytes) / std::max(best, 1e-9);
  return m;
}

}  // namespace

std::vector<std::vector<std::pair<int, int>>> link_probe_rounds(std::vector<std::pair<int, int>> pairs) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  std::vector<std::set<int>> busy;
  std::set<std::pair<int, int>> seen;
  for (auto [a, b] : pairs) {
    if (a < 0 || b < 0 || a == b)
      GZ_THROW(InvalidArgument, "link probe: bad pair (", a, ", ", b, "): two different non-negative ranks");
    if (a > b) std::swap(a, b);
    if (!seen.insert({a, b}).second) continue;
    size_t r = 0;
    while (r < rounds.size() && (busy[r].count(a) || busy[r].count(b))) ++r;
    if (r == rounds.size()) {
      rounds.emplace_back();
      busy.emplace_back();
    }
    rounds[r].push_back({a, b});
    busy[r].insert(a);
    busy[r].insert(b);
  }
  return rounds;
}

std::vector<LinkMeasure> probe_links(Communicator& comm, const std::vector<std::pair<int, int>>& pairs,
                                     const LinkProbeOptions& o) {
  if (o.bytes < 4096 || o.bytes > (size_t{64} << 20))
    GZ_THROW(InvalidArgument, "link probe: bytes must be in [4 KiB, 64 MiB], got ", o.bytes);
  if (o.pings < 1 || o.pings > 1000)
    GZ_THROW(InvalidArgument, "link probe: pings must be in [1, 1000], got ", o.pings);
  if (o.repeats < 1 || o.repeats > 100)
    GZ_THROW(InvalidArgument, "link probe: repeats must be in [1, 100], got ", o.repeats);
  for (const auto& [a, b] : pairs)
    if (a >= comm.size() || b >= comm.size())
      GZ_THROW(InvalidArgument, "link probe: pair (", a, ", ", b, ") outside the ", comm.size(), " ranks");
  std::vector<LinkMeasure> mine;
  const int me = comm.rank();
  for (const auto& round : link_probe_rounds(pairs)) {
    for (const auto& [a, b] : round) {
      if (me != a && me != b) continue;
      LinkMeasure m = probe_pair(comm, a, b, o);
      if (me == a) mine.push_back(m);
      break;  // a rank is in at most one pair per round
    }
  }
  return mine;
}

LinkJudgement judge_links(int nodes, const std::vector<LinkMeasure>& measures, double fraction) {
  GZ_CHECK_ARG(nodes >= 0, "judge_links: negative node count");
  GZ_CHECK_ARG(fraction > 0 && fraction < 1, "judge_links: fraction must be in (0, 1), got ", fraction);
  LinkJudgement j;
  j.best_link_bps.assign(static_cast<size_t>(nodes), 0.0);
  std::vector<double> rates;
  for (const auto& m : measures) {
    GZ_CHECK_ARG(m.a >= 0 && m.a < nodes && m.b >= 0 && m.b < nodes && m.a != m.b, "judge_links: measure (",
                 m.a, ", ", m.b, ") outside the ", nodes, " nodes");
    rates.push_back(m.bytes_per_s);
    for (int n : {m.a, m.b}) {
      auto& best = j.best_link_bps[static_cast<size_t>(n)];
      best = std::max(best, m.bytes_per_s);
    }
  }
  j.median_link_bps = median(rates);
  for (size_t i = 0; i < measures.size(); ++i)
    if (measures[i].bytes_per_s < fraction * j.median_link_bps) j.slow_links.push_back(i);
  std::vector<double> bests;
  for (double b : j.best_link_bps)
    if (b > 0) bests.push_back(b);
  j.median_best_bps = median(bests);
  for (int n = 0; n < nodes; ++n) {
    const double b = j.best_link_bps[static_cast<size_t>(n)];
    if (b > 0 && b < fraction * j.median_best_bps) j.slow_nodes.push_back(n);
  }
  return j;
}

std::string format_rate(double bytes_per_s) {
  char buf[32];
  if (bytes_per_s >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB/s", bytes_per_s / 1e9);
  else if (bytes_per_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB/s", bytes_per_s / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.0f kB/s", bytes_per_s / 1e3);
  return buf;
}

}  // namespace gz::comm
