// Dumps of the flight recorder: every recorder of this process (live communicators and the last
// destroyed ones) and the process's phase mark, as JSON lines under a per-job directory. Written
// by a dump thread on request: a failed op, SIGUSR1 (gzrun sends it with sigqueue, the value being
// its request number), or a call. The schema (kFlightDumpSchema, version kFlightDumpVersion) is
// documented in docs/debugging.md; tools/doctor reads it. LibTorch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gz/comm/flight_recorder.h"
#include "gz/core/deadline.h"

namespace gz::comm {

constexpr const char* kFlightDumpSchema = "gz-flight-recorder";
constexpr int kFlightDumpVersion = 1;

/// @brief Why a dump was written (the header's "reason").
enum class DumpReason : uint8_t { request = 0, signal, failure, exit };
const char* dump_reason_name(DumpReason r);

/// @brief Every recorder of this process: live ones, then those retired (destroyed) lately;
/// at most `max_records` records each (0 = all kept).
std::vector<FlightSnapshot> flight_snapshots(size_t max_records = 0);

/// @brief This process's dump as JSON lines: a header (job, rank, node, host, pid, clock, phase,
/// reason), one "comm" line per recorder, one "op" line per record, an "end" line with counts
/// (a file without it was cut short).
std::string format_flight_dump(const std::vector<FlightSnapshot>& snaps, DumpReason reason, int64_t request,
                               const std::string& note);

/// @brief The directory dumps go to: GZ_DUMP_DIR, else /tmp/gz-dumps/<GZ_RUN_ID> (gzrun sets both),
/// else /tmp/gz-dumps/pid-<pid>.
std::string flight_dump_dir();
/// @brief This process's dump file in it: rank-<RANK>.jsonl, or pid-<pid>.jsonl without RANK.
std::string flight_dump_path();
/// @brief The marker file saying this process answers SIGUSR1 with a dump: rank-<RANK>.ready
/// (holds the pid). gzrun signals only workers that wrote one.
std::string flight_ready_path();

/// @brief Who this process is in its dumps once the launcher moved it to another run (gzrun
/// --recovery in-place of an elastic job): until then the environment it started with says
/// (GZ_RUN_ID, RANK, WORLD_SIZE, GROUP_RANK).
struct FlightDumpIdentity {
  std::string run_id;
  int rank = 0;
  int world = 1;
  int node = 0;
};
/// @brief Dumps and the ready file use `id` from now on: file rank-<id.rank>, header fields from
/// `id`, and the new run's folder where gzrun looks for it: GZ_DUMP_DIR with its last component,
/// when that is the run id the process started with (gzrun's folder per round), replaced by
/// id.run_id; /tmp/gz-dumps/<id.run_id> without GZ_DUMP_DIR. Writes the ready file there now
/// when the dump thread answers SIGUSR1.
void set_flight_dump_identity(const FlightDumpIdentity& id);

/// @brief Write a dump now on the calling thread (write to a temporary file, then rename);
/// returns the path. Throws gz::SystemError when the file cannot be written.
std::string write_flight_dump(DumpReason reason, int64_t request = 0, const std::string& note = "");
/// @brief Ask the dump thread for a dump; returns at once (the caller only wakes a thread).
/// Requests that come while one is written are served by one more dump.
void request_flight_dump(DumpReason reason, int64_t request = 0, const std::string& note = "");
/// @brief Wait until every dump asked for so far has been written, at most `timeout`. True when
/// none is pending. Runs at exit too (bounded by GZ_DUMP_EXIT_WAIT_MS, default 3000).
bool flush_flight_dumps(Duration timeout);
/// @brief Dumps written by the dump thread so far (tests).
uint64_t flight_dumps_written();

/// @brief Start the dump thread and, unless GZ_DUMP_SIGNAL=0 or the program handles SIGUSR1
/// itself, the SIGUSR1 handler (which only wakes the thread) and the ready file. Called by the
/// first recorder; idempotent and cheap afterwards. GZ_DUMP=0 turns dumps off entirely.
void start_flight_dump_service();

}  // namespace gz::comm
