// gzrun --preflight[=strict]: before a job starts (or alone, without a program), measure every
// node and flag the outliers: link bandwidth and round trip to the ring neighbours and a sample of
// other nodes (the comm layer's link probe over Gloo), a compute rate per local rank (a fixed
// GEMM), free /dev/shm and memory. Node 0 prints one table; strict mode refuses to start the job
// when a node is flagged. Bounded time and traffic: see PreflightOptions and docs/debugging-slow.md.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gz/comm/link_probe.h"
#include "options.h"

namespace gz::launcher {

class StoreHost;

/// @brief What the pre-flight check measures and how long it may take.
struct PreflightOptions {
  bool strict = false;          ///< flagged node: refuse to start the job
  double compute_s = 0.3;       ///< GEMM time per node (in turns when the nodes share a machine)
  size_t link_bytes = 1 << 20;  ///< each way, per probed pair
  int pings = 5;                ///< 8-byte round trips per pair
  double timeout_s = 60;        ///< deadline of the whole check (and of every probe op)
  double fraction = 0.5;        ///< outlier: below this fraction of the median
};

/// @brief One node's own measurements.
struct NodeFacts {
  int node = 0;
  std::string host;            ///< hostname
  std::string addr;            ///< the address other nodes reach it on
  std::string boot_id;         ///< /proc/sys/kernel/random/boot_id: equal on simulated hosts of one machine
  double shm_free = 0;         ///< bytes free in /dev/shm
  double mem_avail = 0;        ///< MemAvailable, bytes
  std::vector<double> gflops;  ///< per local rank
};

/// @brief "node|host|addr|boot|shm|mem|g0,g1,..." and back (store records); throws gz::Error on a
/// malformed record.
std::string encode_facts(const NodeFacts& f);
NodeFacts decode_facts(const std::string& s);
/// @brief "a,b,rtt,bps;..." and back.
std::string encode_links(const std::vector<comm::LinkMeasure>& m);
std::vector<comm::LinkMeasure> decode_links(const std::string& s);

/// @brief Pairs probed among `nodes`: each node with its ring successor, plus with the node half
/// way round (4 nodes or more) and, from 8 nodes on, one more partner drawn from `seed`: at most
/// 3 x nodes pairs, about 2-4 rounds.
std::vector<std::pair<int, int>> preflight_pairs(int nodes, uint64_t seed);

/// @brief GFLOP/s of a fixed 64 x 64 single-precision GEMM loop run for `seconds` on each of
/// `threads` threads at once (one per local rank).
std::vector<double> measure_compute(int threads, double seconds);

/// @brief The verdict: per-node flags and the printed table.
struct PreflightResult {
  std::vector<std::string> flags;  ///< per node: "" or "slow link ...; slow compute ..."
  int flagged = 0;
  std::string table;    ///< header, one row per node, slow links, the final line
  std::string verdict;  ///< the last line alone
};

/// @brief Judge the nodes' facts and the link measures (node indices); pure, for tests.
PreflightResult judge_preflight(const std::vector<NodeFacts>& nodes,
                                const std::vector<comm::LinkMeasure>& links, const PreflightOptions& options,
                                const std::string& how);

/// @brief Run the check on this node (every node of the job calls it). Returns 0 when the job may
/// start (nothing flagged, or flagged without strict), 4 when strict refuses it or, for the check
/// alone (no PROGRAM), when any node is flagged. Prints the table on node 0, one line elsewhere. Throws
/// gz::Error when the check itself fails (a node missing past the deadline, a probe error).
int run_preflight(const LaunchOptions& options, StoreHost& store, const PreflightOptions& preflight);

}  // namespace gz::launcher
