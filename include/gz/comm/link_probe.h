// Link probe: round-trip time and bandwidth between pairs of ranks, measured with the
// communicator's own point-to-point ops (so through the engine the job uses, never a transport of
// our own), and the judgement of which link or node is slow. Used by gzrun --preflight (between
// nodes, before a job) and by the straggler report (between hosts, while training).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gz/comm/communicator.h"

namespace gz::comm {

/// @brief How much one pair sends, and how long it may take.
struct LinkProbeOptions {
  /// @brief Bandwidth message: this many bytes a -> b, then the same back (4 KiB .. 64 MiB).
  size_t bytes = 1 << 20;
  /// @brief Round trips of an 8-byte message; the fastest is the pair's rtt (1 .. 1000).
  int pings = 5;
  /// @brief Bandwidth exchanges; the fastest counts (1 .. 100): one exchange may meet a
  /// scheduling hiccup or a socket buffer still draining, the best of two rarely does.
  int repeats = 2;
  /// @brief Deadline of every send/recv of the probe.
  Duration timeout = std::chrono::seconds(30);
  /// @brief Point-to-point tag of the probe's messages (kept apart from the program's).
  int tag = 0x4c50;
};

/// @brief One pair's result. a < b are ranks of the probed communicator (or, after relabelling by
/// the caller, nodes).
struct LinkMeasure {
  int a = -1;
  int b = -1;
  double rtt_us = 0;       ///< fastest round trip of an 8-byte message (robust to scheduling noise)
  double bytes_per_s = 0;  ///< 2 x bytes / (time to send bytes a -> b and back), best of repeats
};

/// @brief The pairs split into rounds in which no rank appears twice, in a deterministic order
/// (every rank computes the same rounds). Pairs are normalised to a < b; duplicates are dropped.
/// Throws gz::InvalidArgument for a pair (r, r) or a negative rank.
std::vector<std::vector<std::pair<int, int>>> link_probe_rounds(std::vector<std::pair<int, int>> pairs);

/// @brief Probe every pair, round by round (link_probe_rounds); ranks outside a round's pairs
/// wait for the next. Collective only in the sense that each pair's two ranks must both call it
/// with the same list; returns the measures of the pairs this rank initiated (the smaller rank of
/// each pair), in round order. Each pair first exchanges one message untimed (so both ends start
/// together and a lazily connected transport connects), then `pings` round trips, then `repeats`
/// bandwidth exchanges. Traffic per pair: 2 x repeats x bytes + (2 x pings + 2) x 8 bytes. Errors (a peer
/// gone, a deadline) propagate as the communicator's exceptions, naming the peer.
std::vector<LinkMeasure> probe_links(Communicator& comm, const std::vector<std::pair<int, int>>& pairs,
                                     const LinkProbeOptions& options = {});

/// @brief Which links and nodes are slow among nodes 0 .. nodes-1.
struct LinkJudgement {
  double median_link_bps = 0;      ///< median bandwidth over the measured links
  std::vector<size_t> slow_links;  ///< indices into the measures: bandwidth < fraction x median
  /// @brief Per node: its fastest measured link (0 when it has none).
  std::vector<double> best_link_bps;
  double median_best_bps = 0;  ///< median of best_link_bps over nodes with a link
  /// @brief Nodes whose fastest link is below fraction x median_best_bps: every link of theirs is
  /// slow while their neighbours have fast ones, so the fault is theirs (their NIC or cable), not
  /// a neighbour's. With two nodes (one link) no node can be told from the other: none is named.
  std::vector<int> slow_nodes;
};

/// @brief Judge measures between nodes (a, b in [0, nodes)); `fraction` is the "below half the
/// median" threshold (0 < fraction < 1).
LinkJudgement judge_links(int nodes, const std::vector<LinkMeasure>& measures, double fraction = 0.5);

/// @brief "12.3 MB/s", "1.05 GB/s".
std::string format_rate(double bytes_per_s);

}  // namespace gz::comm
