// POSIX shared-memory segments (shm_open + mmap) for the shm backend.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace gz::comm::shm {

/// @brief One mapping of a named POSIX shared-memory object; unmapped when the last owner goes.
///
/// Ranks that are threads of one process share a single mapping (a process-wide registry keyed by
/// name), so every rank sees the segment at the same address; that keeps thread sanitizers able
/// to check the protocol and saves address space.
class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  /// @brief Create a new zero-filled object (fails if the name exists) and map it.
  static std::shared_ptr<Segment> create(const std::string& name, size_t bytes);
  /// @brief Map an existing object; checks that it has the expected size.
  static std::shared_ptr<Segment> open(const std::string& name, size_t bytes);
  /// @brief Remove the name from /dev/shm (mappings stay valid); missing names are ignored.
  static void unlink(const std::string& name);

  char* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  Segment(std::string name, char* data, size_t bytes) : name_(std::move(name)), data_(data), bytes_(bytes) {}
  std::string name_;
  char* data_;
  size_t bytes_;
};

}  // namespace gz::comm::shm
