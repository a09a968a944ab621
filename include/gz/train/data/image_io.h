// Decode and encode PNG (libpng) and JPEG (libjpeg) images as 8-bit gray or RGB pixels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gz::train {

/// @brief An 8-bit image, rows of width * channels interleaved bytes.
struct Image {
  int64_t height = 0, width = 0, channels = 0;  ///< channels: 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;
};

/// @brief Decode a .png, .jpg or .jpeg file (by content, not name) into `channels` (1 or 3)
/// channels, converting colour as needed. @throws gz::SystemError if unreadable, gz::Error if corrupt.
Image read_image(const std::string& path, int channels);
/// @brief Write an 8-bit PNG (tests and tools). @throws gz::Error.
void write_png(const std::string& path, const Image& image);
/// @brief Write a baseline JPEG of the given quality (tests and tools). @throws gz::Error.
void write_jpeg(const std::string& path, const Image& image, int quality = 95);

}  // namespace gz::train
