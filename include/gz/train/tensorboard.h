// TensorBoard event files written by hand: TFRecord framing around hand-encoded Event protobufs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace gz::train {

/// @brief CRC-32C (Castagnoli) of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
/// @brief TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

/// @brief Appends scalar summaries to work_dir/events.out.tfevents.<time>.<host>.
///
/// Each record: uint64 length, masked CRC32C of the length, Event bytes, masked CRC32C of the bytes
/// (little-endian). The first Event carries file_version "brain.Event:2".
class TensorBoardWriter {
 public:
  /// @brief Creates the directory and the file; throws gz::SystemError.
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// @brief One Event{wall_time, step, Summary{Value{tag, simple_value}}}.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::string path_;
  FILE* file_ = nullptr;
};

}  // namespace gz::train
