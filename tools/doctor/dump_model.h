// What the doctor reads: the flight-recorder dumps of the ranks (schema "gz-flight-recorder",
// docs/debugging.md) and what each node's gzrun saw of its workers. Plain data, parsed by
// dump_reader, judged by verdict.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace gz::doctor {

/// @brief One op record of a dump ("type":"op").
struct OpRec {
  uint64_t seq = 0;
  uint64_t coll = 0;    ///< number among the group's collectives (aligned across ranks)
  bool queued = false;  ///< an async op waiting to run (no seq yet)
  std::string op, dtype, reduce, state;
  uint64_t count = 0;
  int root = -1, peer = -1, tag = 0;
  double age_ms = NAN, dur_ms = NAN;
  std::string phase;
  int64_t step = -1;
  int waiting_for = -1;
  std::vector<double> late_us;  ///< per peer (group rank); NAN = not seen at this op
  std::string error, error_kind;
  int error_peer = -1;
  /// @brief "allreduce(f32 x 1024, sum)": what must agree across ranks.
  std::string signature() const;
};

/// @brief One communicator of a dump ("type":"comm") and its records, oldest first.
struct CommDump {
  uint64_t id = 0;
  std::string name, backend;
  int rank = 0, size = 1;
  std::vector<int> ranks;  ///< global rank of every member; empty = unknown
  uint64_t parent = 0;
  uint64_t next_seq = 0;
  bool retired = false;
  std::vector<OpRec> ops;
  /// @brief Global rank of member `r` (-1 unknown).
  int global(int r) const { return r >= 0 && r < static_cast<int>(ranks.size()) ? ranks[r] : -1; }
};

/// @brief One process's dump.
struct RankDump {
  std::string source;  ///< file (and position) it came from
  std::string job;
  int version = 0;
  int rank = -1, world = -1, local_rank = -1, node = -1, pid = -1;
  std::string host, reason, note;
  int64_t request = 0;
  long long time_unix_ms = 0;
  std::string phase;
  int64_t step = -1;
  double phase_for_ms = NAN;
  std::vector<CommDump> comms;
  bool complete = false;  ///< its "end" line was read
};

/// @brief What a node's gzrun knew about one of its workers when it collected the dumps.
struct RankFacts {
  int rank = -1, local_rank = -1, pid = -1;
  /// @brief "running", "stopped" (state T: SIGSTOP, a debugger), "exited", "killed" (by a signal),
  /// "gone" (not a child any more), "unknown".
  std::string state = "unknown";
  std::string status;          ///< "exited with code 1", "killed by signal 9 (SIGKILL)"
  bool first_failure = false;  ///< this worker's end was the node's first failure (not a stop)
  bool stopped_by_gzrun = false;
  bool answered = false;  ///< wrote a dump for this request
};

/// @brief One node's gzrun report ("type":"gzrun").
struct NodeFacts {
  int node = -1;
  std::string host, job;
  int64_t request = 0;
  std::vector<RankFacts> ranks;
};

/// @brief What the collecting gzrun knew about the job ("type":"job").
struct JobFacts {
  std::string job;
  int world = -1, nnodes = -1, nproc_per_node = -1;
  std::string failure;       ///< the job's failure record text, "" while it runs
  std::string failure_kind;  ///< "worker", "node_lost", "store_lost", "interrupted", ""
  int failure_node = -1;
  std::vector<int> silent_nodes;  ///< nodes whose gzrun neither reported nor heartbeat
};

/// @brief Everything read, plus what was wrong with the input.
struct Picture {
  std::vector<RankDump> dumps;
  std::vector<NodeFacts> nodes;
  JobFacts job;
  bool have_job = false;
  std::vector<std::string> notes;  ///< problems with the input, one clear sentence each
};

}  // namespace gz::doctor
