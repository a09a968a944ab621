// A sharded checkpoint's manifest.json, parsed and checked once: every number a loader indexes or
// slices with is range-checked here, so a corrupt or hand-edited manifest becomes a gz::Error
// naming the field, never an out-of-range read.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gz::zero {

/// @brief One parameter's place in its group's flat layout.
struct ManifestParam {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  ///< c10::toString of the scalar type
  int64_t offset = 0, numel = 0;
};

/// @brief One flat group: its parameters and which optimizer state its blocks carry.
struct ManifestGroup {
  int64_t numel = 0;  ///< elements of the group (padding excluded)
  int64_t shard = 0;  ///< elements per rank's block (world blocks cover numel)
  std::vector<ManifestParam> params;
  bool has_state = false;
  std::vector<std::pair<std::string, c10::ScalarType>> state;  ///< field, dtype
  int64_t step = -1;                                           ///< -1: none recorded
};

/// @brief The manifest of a sharded checkpoint.
struct Manifest {
  std::string dir;
  int world = 0;
  int64_t step = 0, id = 0;
  std::string job;
  std::vector<int64_t> bytes;          ///< per shard file
  std::vector<std::string> checksums;  ///< per shard file (stream_hash.h, hex)
  std::vector<ManifestGroup> groups;
  size_t opt_groups = 0;
};

/// @brief Reads and checks `dir`/manifest.json. Throws gz::Error naming the directory and the field
/// when it is missing, not JSON, of another format, or holds a value out of range.
Manifest parse_manifest(const std::string& dir);
/// @brief The same checks on a manifest's text (a shard snapshot carries its own); `dir` and `where`
/// name it in errors.
Manifest parse_manifest_text(const std::string& text, const std::string& dir, const std::string& where);

}  // namespace gz::zero
