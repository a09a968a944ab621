// The pre-flight check's pure parts: store records, the probed pairs, the GEMM rate, and the
// judgement that flags outlier nodes and prints the table (see preflight.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <thread>

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "preflight.h"

namespace gz::launcher {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string gib(double bytes) { return fmt("%.1f GiB", bytes / (1 << 30)); }

double min_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

}  // namespace

std::string encode_facts(const NodeFacts& f) {
  std::ostringstream os;
  os << f.node << '|' << f.host << '|' << f.addr << '|' << f.boot_id << '|' << f.shm_free << '|'
     << f.mem_avail << '|';
  for (size_t i = 0; i < f.gflops.size(); ++i) os << (i ? "," : "") << f.gflops[i];
  return os.str();
}

NodeFacts decode_facts(const std::string& s) {
  const auto p = split(s, '|');
  if (p.size() != 7) GZ_THROW(Error, "preflight: malformed node record '", s, "'");
  NodeFacts f;
  f.node = static_cast<int>(parse_int(p[0], "preflight node"));
  f.host = p[1];
  f.addr = p[2];
  f.boot_id = p[3];
  f.shm_free = parse_double(p[4], "preflight /dev/shm");
  f.mem_avail = parse_double(p[5], "preflight memory");
  if (!p[6].empty())
    for (const auto& g : split(p[6], ',')) f.gflops.push_back(parse_double(g, "preflight GFLOP/s"));
  return f;
}

std::string encode_links(const std::vector<comm::LinkMeasure>& m) {
  std::ostringstream os;
  for (size_t i = 0; i < m.size(); ++i)
    os << (i ? ";" : "") << m[i].a << ',' << m[i].b << ',' << m[i].rtt_us << ',' << m[i].bytes_per_s;
  return os.str();
}

std::vector<comm::LinkMeasure> decode_links(const std::string& s) {
  std::vector<comm::LinkMeasure> out;
  if (s.empty()) return out;
  for (const auto& rec : split(s, ';')) {
    const auto f = split(rec, ',');
    if (f.size() != 4) GZ_THROW(Error, "preflight: malformed link record '", rec, "'");
    out.push_back({static_cast<int>(parse_int(f[0], "link a")), static_cast<int>(parse_int(f[1], "link b")),
                   parse_double(f[2], "link rtt"), parse_double(f[3], "link rate")});
  }
  return out;
}

std::vector<std::pair<int, int>> preflight_pairs(int nodes, uint64_t seed) {
  std::vector<std::pair<int, int>> pairs;
  if (nodes < 2) return pairs;
  for (int i = 0; i < nodes; ++i) {
    const int j = (i + 1) % nodes;
    if (nodes == 2 && i == 1) break;
    pairs.push_back({std::min(i, j), std::max(i, j)});
  }
  if (nodes >= 4)
    for (int i = 0; i < nodes; ++i) {
      const int j = (i + nodes / 2) % nodes;
      pairs.push_back({std::min(i, j), std::max(i, j)});
    }
  if (nodes >= 8) {
    // One more partner per node at a distance drawn once for the job (the same on every node).
    std::mt19937_64 rng(seed);
    const int d = 2 + static_cast<int>(rng() % static_cast<uint64_t>(nodes / 2 - 2));
    for (int i = 0; i < nodes; ++i) {
      const int j = (i + d) % nodes;
      pairs.push_back({std::min(i, j), std::max(i, j)});
    }
  }
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  return pairs;
}

std::vector<double> measure_compute(int threads, double seconds) {
  std::vector<double> rates(static_cast<size_t>(std::max(threads, 1)), 0.0);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < rates.size(); ++t)
    pool.emplace_back([&rates, t, seconds] {
      constexpr int n = 64;
      std::vector<float> a(n * n), b(n * n), c(n * n, 0.f);
      for (int i = 0; i < n * n; ++i)
        a[i] = 0.001f * static_cast<float>(i % 97), b[i] = 0.002f * static_cast<float>(i % 89);
      using Clock = std::chrono::steady_clock;
      const auto t0 = Clock::now();
      double elapsed = 0;
      long long loops = 0;
      do {
        for (int i = 0; i < n; ++i)
          for (int k = 0; k < n; ++k) {
            const float x = a[i * n + k];
            for (int j = 0; j < n; ++j) c[i * n + j] += x * b[k * n + j];
          }
        ++loops;
        elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      } while (elapsed < seconds);
      volatile float sink = c[n + 1];  // the result is used: the loop cannot be dropped
      (void)sink;
      rates[t] = 2.0 * n * n * n * static_cast<double>(loops) / elapsed / 1e9;
    });
  for (auto& th : pool) th.join();
  return rates;
}

PreflightResult judge_preflight(const std::vector<NodeFacts>& nodes,
                                const std::vector<comm::LinkMeasure>& links, const PreflightOptions& o,
                                const std::string& how) {
  const int n = static_cast<int>(nodes.size());
  PreflightResult r;
  r.flags.assign(nodes.size(), "");
  const auto flag = [&](int node, const std::string& what) {
    auto& f = r.flags[static_cast<size_t>(node)];
    f += (f.empty() ? "" : "; ") + what;
  };
  const comm::LinkJudgement j = comm::judge_links(n, links, o.fraction);
  for (int s : j.slow_nodes)
    flag(s, "slow link: " + comm::format_rate(j.best_link_bps[static_cast<size_t>(s)]) + " at best, below " +
                fmt("%.0f%%", 100 * o.fraction) + " of the median " + comm::format_rate(j.median_best_bps));
  // Round trips: a node whose fastest round trip is far above everyone's.
  std::vector<double> best_rtt(nodes.size(), 0);
  for (const auto& m : links)
    for (int x : {m.a, m.b}) {
      double& b = best_rtt[static_cast<size_t>(x)];
      b = b == 0 ? m.rtt_us : std::min(b, m.rtt_us);
    }
  std::vector<double> rtts;
  for (double b : best_rtt)
    if (b > 0) rtts.push_back(b);
  const double med_rtt = median(rtts);
  std::vector<double> gmin, shm, mem;
  for (const auto& f : nodes) {
    gmin.push_back(min_of(f.gflops));
    shm.push_back(f.shm_free);
    mem.push_back(f.mem_avail);
  }
  const double med_g = median(gmin), med_shm = median(shm), med_mem = median(mem);
  for (int i = 0; i < n; ++i) {
    const auto& f = nodes[static_cast<size_t>(i)];
    const double rtt = best_rtt[static_cast<size_t>(i)];
    if (rtt > 0 && rtt > std::max(4 * med_rtt, med_rtt + 1000))
      flag(i, "high latency: " + fmt("%.0f us", rtt) + " round trip against a median of " +
                  fmt("%.0f us", med_rtt));
    if (gmin[static_cast<size_t>(i)] < o.fraction * med_g)
      flag(i, "slow compute: " + fmt("%.2f", gmin[static_cast<size_t>(i)]) + " GFLOP/s per rank, median " +
                  fmt("%.2f", med_g));
    if (f.shm_free < o.fraction * med_shm || f.shm_free < 64.0 * (1 << 20))
      flag(i, "little /dev/shm: " + gib(f.shm_free) + " free, median " + gib(med_shm));
    if (f.mem_avail < o.fraction * med_mem)
      flag(i, "little memory: " + gib(f.mem_avail) + " available, median " + gib(med_mem));
  }
  std::ostringstream t;
  t << "preflight: " << n << " node(s); " << how << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%5s  %-12s %-15s %12s %9s %-18s %10s %10s  %s\n", "node", "host",
                "address", "best link", "rtt", "GFLOP/s per rank", "/dev/shm", "memory", "flags");
  t << line;
  for (int i = 0; i < n; ++i) {
    const auto& f = nodes[static_cast<size_t>(i)];
    std::string g;
    for (size_t k = 0; k < f.gflops.size() && k < 4; ++k) g += (k ? " " : "") + fmt("%.2f", f.gflops[k]);
    if (f.gflops.size() > 4) g += " ...";
    const double best = j.best_link_bps.empty() ? 0 : j.best_link_bps[static_cast<size_t>(i)];
    std::snprintf(
        line, sizeof line, "%5d  %-12s %-15s %12s %9s %-18s %10s %10s  %s\n", i, f.host.c_str(),
        f.addr.c_str(), best > 0 ? comm::format_rate(best).c_str() : "-",
        best_rtt[static_cast<size_t>(i)] > 0 ? fmt("%.0f us", best_rtt[static_cast<size_t>(i)]).c_str() : "-",
        g.c_str(), gib(f.shm_free).c_str(), gib(f.mem_avail).c_str(),
        r.flags[static_cast<size_t>(i)].empty() ? "ok" : r.flags[static_cast<size_t>(i)].c_str());
    t << line;
  }
  if (!j.slow_links.empty()) {
    t << "links below " << fmt("%.0f%%", 100 * o.fraction) << " of the median "
      << comm::format_rate(j.median_link_bps) << ":";
    for (size_t k : j.slow_links) {
      const auto& m = links[k];
      t << " " << nodes[static_cast<size_t>(m.a)].host << "-" << nodes[static_cast<size_t>(m.b)].host << " "
        << comm::format_rate(m.bytes_per_s) << ";";
    }
    t << "\n";
  }
  std::string flagged;
  for (int i = 0; i < n; ++i)
    if (!r.flags[static_cast<size_t>(i)].empty()) {
      ++r.flagged;
      flagged += (flagged.empty() ? "" : "; ") + std::string("node ") + std::to_string(i) + " (" +
                 nodes[static_cast<size_t>(i)].host + "): " + r.flags[static_cast<size_t>(i)];
    }
  r.verdict = r.flagged == 0 ? "preflight: all " + std::to_string(n) + " node(s) ok"
                             : "preflight: flagged " + std::to_string(r.flagged) + " of " +
                                   std::to_string(n) + " node(s): " + flagged;
  t << r.verdict;
  r.table = t.str();
  return r;
}

}  // namespace gz::launcher
