// Every flight recorder of the process, for dumps: the live ones and copies of the last ones
// destroyed. Taken only when a recorder is created or destroyed and by readers (never per op).
#pragma once

#include <deque>
#include <mutex>
#include <vector>

#include "gz/comm/flight_recorder.h"

namespace gz::comm {

class FlightRegistry {
 public:
  void add(FlightRecorder* r);
  /// @brief Remove `r`, keeping a copy of its records (the last kRetired recorders are kept).
  void retire(FlightRecorder* r);
  /// @brief Snapshots of the live recorders (creation order), then the retired ones.
  std::vector<FlightSnapshot> snapshots(size_t max_records);
  /// @brief `r`'s own lateness plus that of its descendants, in r's group ranks (global ranks in
  /// `ranks` where r's identity knows them).
  PeerLateness lateness_of(const FlightRecorder& r);

 private:
  static constexpr size_t kRetired = 16;
  std::mutex mu_;
  std::vector<FlightRecorder*> live_;
  std::deque<FlightSnapshot> retired_;
};

/// @brief The process's registry (never destroyed: dumps may run during exit).
FlightRegistry& flight_registry();

}  // namespace gz::comm
