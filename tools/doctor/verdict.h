// The one verdict: from every rank's flight-recorder dump and what each node's gzrun saw of its
// workers, which rank (or node, or link) is the culprit and why. Used by gzrun when a job fails,
// by `gzrun --status` on a running job and by `gzrun --analyze DIR` offline: the logic lives here
// once.
#pragma once

#include <string>
#include <vector>

#include "dump_model.h"

namespace gz::doctor {

/// @brief Knobs of the judgement.
struct JudgeOptions {
  /// @brief A wait shorter than this is an op in flight, not a hang (a running job's --status).
  double stuck_ms = 1000;
};

/// @brief What went wrong, and where.
struct Verdict {
  /// @brief "stopped" (a rank's process is stopped), "hung" (alive, not entering the op),
  /// "skipped" (a rank left out a collective), "mismatch" (different op, size, dtype or group),
  /// "died" (a rank died), "node_died", "link" (a lost link or an unreachable node),
  /// "failed" (an op failed, no pattern), "healthy" (nobody waits), "unknown" (too little input).
  std::string cause = "unknown";
  std::vector<int> ranks;  ///< the culprit ranks (global; group ranks when the dumps do not say)
  int node = -1;           ///< the culprit node where one is named
  std::string headline;    ///< ONE line naming the culprit and the cause
  std::vector<std::string> details;
};

/// @brief Judge a picture (after settle()).
Verdict judge(const Picture& pic, const JudgeOptions& options = {});

/// @brief "verdict: <headline>" then indented details, then the input notes.
std::string render(const Verdict& v, const Picture& pic);

}  // namespace gz::doctor
