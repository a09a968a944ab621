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

/// @brief Default cap on a decoded image, width x height x channels bytes (256 MiB: a 9000 x 9000
/// RGB photo fits). A header of a few bytes can claim 65535 x 65535 pixels; this bounds what
/// an untrusted file can make us allocate.
constexpr int64_t kDefaultMaxImageBytes = int64_t(1) << 28;

/// @brief Decode a .png, .jpg or .jpeg file (by content, not name) into `channels` (1 or 3)
/// channels, converting colour as needed. The size in the header is checked against `max_bytes`
/// (width x height x channels) before any pixel buffer is allocated.
/// @throws gz::SystemError if unreadable; gz::Error if corrupt or over `max_bytes` (naming the file
/// and the dimensions).
Image read_image(const std::string& path, int channels, int64_t max_bytes = kDefaultMaxImageBytes);
/// @brief Write an 8-bit PNG (tests and tools). @throws gz::Error.
void write_png(const std::string& path, const Image& image);
/// @brief Write a baseline JPEG of the given quality (tests and tools). @throws gz::Error.
void write_jpeg(const std::string& path, const Image& image, int quality = 95);

}  // namespace gz::train
