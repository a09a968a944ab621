// Parsing and checking a sharded checkpoint's manifest (see sharded_manifest.h).
#include "torch/zero/sharded_manifest.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gz/core/error.h"
#include "gz/torch/sharded_checkpoint.h"
#include "torch/zero/sharded_format.h"

namespace gz::zero {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
// Far above any real job; bounds the per-shard vectors a corrupt "world" would make us allocate.
constexpr int64_t kMaxWorld = 1 << 20;

// Raised with the path of the offending field; parse_manifest() adds the directory.
struct FieldError {
  std::string field, what;
};

const json& field_at(const json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw FieldError{where + key, "is missing"};
  return j[key];
}

int64_t int_in(const json& j, const std::string& key, int64_t lo, int64_t hi, const std::string& where) {
  const json& v = field_at(j, key, where);
  if (!v.is_number_integer()) throw FieldError{where + key, "is not an integer"};
  // A value past int64 is stored unsigned: out of range as well.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMax))
    throw FieldError{where + key, "is out of range"};
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw FieldError{where + key, "is " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " +
                                      std::to_string(hi) + "]"};
  return x;
}

std::string string_at(const json& j, const std::string& key, const std::string& where) {
  const json& v = field_at(j, key, where);
  if (!v.is_string()) throw FieldError{where + key, "is not a string"};
  return v.get<std::string>();
}

const json& array_at(const json& j, const std::string& key, const std::string& where) {
  const json& v = field_at(j, key, where);
  if (!v.is_array()) throw FieldError{where + key, "is not an array"};
  return v;
}

ManifestParam parse_param(const json& p, int64_t group_numel, const std::string& where) {
  ManifestParam out;
  out.name = string_at(p, "name", where);
  out.dtype = string_at(p, "dtype", where);
  int64_t elements = 1;
  for (const json& d : array_at(p, "shape", where)) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) throw FieldError{where + "shape", "holds a bad size"};
    const int64_t n = d.get<int64_t>();
    if (n > 0 && elements > kMax / n) throw FieldError{where + "shape", "overflows"};
    elements *= n;
    out.shape.push_back(n);
  }
  out.numel = int_in(p, "numel", elements, elements, where);  // must equal the shape's product
  out.offset = int_in(p, "offset", 0, group_numel - out.numel, where);
  return out;
}

ManifestGroup parse_group(const json& g, int64_t world, const std::string& where) {
  ManifestGroup out;
  out.numel = int_in(g, "numel", 0, kMax, where);
  // The world's blocks must cover the group (a loader reads block numel / shard at most); blocks
  // are padded to an alignment, so a shard may exceed numel / world, but shard x world must not
  // overflow.
  out.shard = int_in(g, "shard", std::max<int64_t>(1, (out.numel + world - 1) / world), kMax / world, where);
  const json& params = array_at(g, "params", where);
  for (size_t i = 0; i < params.size(); ++i)
    out.params.push_back(parse_param(params[i], out.numel, where + "params[" + std::to_string(i) + "]."));
  const json& state = field_at(g, "state", where);
  if (!state.is_null()) {
    if (!state.is_object()) throw FieldError{where + "state", "is neither null nor an object"};
    out.has_state = true;
    const auto types = static_cast<int64_t>(c10::ScalarType::NumOptions);
    for (const auto& item : state.items()) {
      const int64_t t = int_in(state, item.key(), 0, types - 1, where + "state.");
      out.state.emplace_back(item.key(), static_cast<c10::ScalarType>(t));
    }
  }
  if (!field_at(g, "step", where).is_null()) out.step = int_in(g, "step", 0, kMax, where);
  return out;
}

Manifest parse_json(const json& j, const std::string& dir) {
  Manifest m;
  m.dir = dir;
  m.world = static_cast<int>(int_in(j, "world", 1, kMaxWorld, ""));
  m.step = int_in(j, "step", -1, kMax, "");
  m.id = int_in(j, "save_id", 0, kMax, "");
  m.job = string_at(j, "job", "");
  const json& shards = array_at(j, "shards", "");
  if (shards.size() != static_cast<size_t>(m.world))
    throw FieldError{
        "shards", "lists " + std::to_string(shards.size()) + " files for world " + std::to_string(m.world)};
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string where = "shards[" + std::to_string(s) + "].";
    m.bytes.push_back(int_in(shards[s], "bytes", 0, kMax, where));
    m.checksums.push_back(string_at(shards[s], "checksum", where));
  }
  const json& groups = array_at(j, "groups", "");
  for (size_t k = 0; k < groups.size(); ++k)
    m.groups.push_back(parse_group(groups[k], m.world, "groups[" + std::to_string(k) + "]."));
  m.opt_groups = static_cast<size_t>(int_in(j, "optimizer_groups", 0, kMaxWorld, ""));
  return m;
}

}  // namespace

Manifest parse_manifest(const std::string& dir) {
  const fs::path path = fs::path(dir) / kShardedManifest;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    GZ_THROW(Error, "sharded checkpoint ", dir, ": no manifest (", path.string(), ")");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return parse_manifest_text(text.str(), dir, path.string());
}

Manifest parse_manifest_text(const std::string& text, const std::string& dir, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    GZ_THROW(Error, "sharded checkpoint ", dir, ": corrupt manifest ", where, ": ", e.what());
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kShardedFormat)
    GZ_THROW(Error, "sharded checkpoint ", dir, ": ", where, " is not a ", kShardedFormat, " manifest");
  try {
    return parse_json(j, dir);
  } catch (const FieldError& e) {
    GZ_THROW(Error, "sharded checkpoint ", dir, ": corrupt manifest ", where, ": \"", e.field, "\" ", e.what);
  } catch (const json::exception& e) {  // a type the checks above did not foresee
    GZ_THROW(Error, "sharded checkpoint ", dir, ": corrupt manifest ", where, ": ", e.what());
  }
}

}  // namespace gz::zero
