// Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.
#pragma once

#include <string>

namespace gz::train {

/// @brief Replace `path` with `data` atomically: readers see the old or the new file, never a torn
/// one. Throws gz::SystemError naming the file.
void write_file_atomic(const std::string& path, const std::string& data);
/// @brief fsync a file or directory by path (makes a rename durable). Throws gz::SystemError.
void fsync_path(const std::string& path);
/// @brief Whole file as a string; throws gz::SystemError naming the file.
std::string read_file(const std::string& path);
/// @brief A unique temp name next to `path` (same directory, so rename() is atomic).
std::string temp_name_for(const std::string& path);

}  // namespace gz::train
