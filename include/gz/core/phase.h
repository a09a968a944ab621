// Where this process's training loop is: phase (data, forward, ...) and step. Written by the
// front ends (trainer, DDP, Horovod mode) at phase changes; read by the flight recorder's dumps
// and the straggler report. Lives in core so the LibTorch-free comm layer can read it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace gz {

/// @brief A phase of the training loop. `idle` = outside any marked phase (set-up, tests).
enum class Phase : uint8_t { idle, data, forward, backward, optimizer, comm, checkpoint, eval, recovery };

/// @brief Number of Phase values (0 .. kPhaseCount - 1).
constexpr int kPhaseCount = 9;

/// @brief "idle", "data", "forward", ... (stable names: they appear in dumps and reports).
const char* phase_name(Phase phase);

/// @brief The phase, step and start time (steady clock, ns since its epoch) last marked.
struct PhaseMark {
  Phase phase = Phase::idle;
  int64_t step = -1;
  int64_t since_ns = 0;
};

/// @brief Mark the phase the calling process is in now; `step` < 0 keeps the current step.
/// Wait-free (a seqlock over a few words, which also charges the phase it leaves in phase_totals()):
/// cheap enough for every phase change.
void set_phase(Phase phase, int64_t step = -1);
/// @brief The latest mark; consistent (never a phase from one mark with a step from another).
/// Safe from any thread and from a signal handler (one that interrupted a mark on its own thread
/// gets the words as they stood).
PhaseMark current_phase();

/// @brief Time this process spent in each phase since it started (steady clock, ns), up to `at_ns`
/// (the read), the phase now marked included. Differences of two reads give a window's breakdown.
struct PhaseTotals {
  std::array<int64_t, kPhaseCount> ns{};
  int64_t at_ns = 0;
  int64_t of(Phase phase) const { return ns[static_cast<size_t>(phase)]; }
};

/// @brief Cumulative time per phase (set_phase charges the phase it leaves; a read adds the time
/// in the current one). Consistent like current_phase(): the totals of one read add up to the time
/// since the process started, and none shrinks from one read to the next.
PhaseTotals phase_totals();

/// @brief Marks `phase` for its lifetime, then restores the phase it found (the step is kept).
class ScopedPhase {
 public:
  explicit ScopedPhase(Phase phase, int64_t step = -1);
  ~ScopedPhase();
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  Phase previous_;
};

}  // namespace gz
