#include "gz/train/checkpoint.h"

#include <fcntl.h>  // AT_FDCWD
#include <nlohmann/json.hpp>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <set>
#include <sstream>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/torch/sharded_checkpoint.h"
#include "gz/train/atomic_file.h"

namespace gz::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kFormat = "gz-checkpoint-1";
// A sharded checkpoint's state.pt lacks the trained parameters: a build that predates sharding
// must refuse it by its format, not fail later on a missing parameter.
constexpr const char* kFormatSharded = "gz-checkpoint-sharded-1";
// The old copy of a step during a fallback replace (no RENAME_EXCHANGE): see CheckpointManager.
constexpr const char* kReplacedSuffix = ".replaced";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string step_dir_name(int64_t step) {
  std::ostringstream os;
  os << kPrefix << std::setw(8) << std::setfill('0') << step;
  return os.str();
}

// Archive keys cannot hold '.', module names do.
std::string encode_key(std::string name) {
  std::string out;
  for (char c : name) out += (c == '.') ? std::string("__") : std::string(1, c);
  return out;
}

// `path` is the state.pt of a sharded checkpoint directory.
bool is_state_of_checkpoint(const std::string& path) {
  const fs::path p(path);
  if (p.filename() != "state.pt") return false;
  try {
    return CheckpointManager::read_manifest(p.parent_path().string()).sharded;
  } catch (const Error&) {
    return false;  // no manifest: a plain archive file
  }
}

}  // namespace

CheckpointManager::CheckpointManager(std::string root, int64_t keep, std::string metric, bool greater_is_better)
    : root_(std::move(root)), keep_(std::max<int64_t>(1, keep)), metric_(std::move(metric)), greater_(greater_is_better) {}

std::string CheckpointManager::save(torch::serialize::OutputArchive& archive, int64_t step, int64_t epoch,
                                    const std::map<std::string, double>& metrics) {
  return commit(begin(step, false), archive, epoch, metrics, false);
}

PendingCheckpoint CheckpointManager::begin(int64_t step, bool sharded) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw SystemError("create directory " + root_, ec.value());
  PendingCheckpoint p;
  p.step = step;
  p.dir = path_of(step);
  p.tmp_dir = temp_name_for(p.dir);
  fs::create_directories(sharded ? p.shards_dir() : p.tmp_dir, ec);
  if (ec) {
    abort(p);
    throw SystemError("create directory " + (sharded ? p.shards_dir() : p.tmp_dir), ec.value());
  }
  return p;
}

std::string CheckpointManager::path_of(int64_t step) const {
  return (fs::path(root_) / step_dir_name(step)).string();
}

void CheckpointManager::abort(const PendingCheckpoint& pending) const {
  std::error_code ec;
  fs::remove_all(pending.tmp_dir, ec);
}

std::string CheckpointManager::commit(const PendingCheckpoint& pending,
                                      torch::serialize::OutputArchive& archive, int64_t epoch,
                                      const std::map<std::string, double>& metrics, bool sharded) {
  const std::string& tmp_dir = pending.tmp_dir;
  const std::string state = tmp_dir + "/state.pt";
  try {
    try {
      archive.save_to(state);
    } catch (const c10::Error& e) {
      GZ_THROW(Error, "cannot write checkpoint ", state, ": ", e.what_without_backtrace());
    }
    fsync_path(state);
    const auto bytes = static_cast<int64_t>(fs::file_size(state));
    nlohmann::json manifest = {{"format", sharded ? kFormatSharded : kFormat},
                               {"step", pending.step},
                               {"epoch", epoch},
                               {"state_bytes", bytes},
                               {"sharded", sharded}};
    nlohmann::json& m = manifest["metrics"] = nlohmann::json::object();
    for (auto& [k, v] : metrics) m[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
    // Invalid UTF-8 in a metric name is replaced (U+FFFD) rather than failing the save.
    write_file_atomic(tmp_dir + "/manifest.json",
                      manifest.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    fsync_path(tmp_dir);
  } catch (...) {
    abort(pending);
    throw;
  }
  replace_dir(tmp_dir, pending.dir);
  rotate();
  return pending.dir;
}

void CheckpointManager::replace_dir(const std::string& tmp_dir, const std::string& final_dir) {
  std::error_code ec;
  const std::string replaced = final_dir + kReplacedSuffix;
  if (!fs::exists(final_dir, ec)) {
    if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
      throw SystemError("rename " + tmp_dir + " -> " + final_dir, errno);
    fsync_path(root_);
    // A leftover .replaced of this step (an interrupted fallback replace) is older than what is
    // now in place; deleted only now so that the step always has a complete copy.
    fs::remove_all(replaced, ec);
    return;
  }
  // Same step again (a resumed run): swap atomically, so checkpoint-<step> is complete at every
  // moment; the old one ends up under the temp name and is deleted (or removed by
  // remove_temp_dirs() after a crash).
  int err = EINVAL;
  if (!hooks_.refuse_rename_exchange) {
    err = ::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0 ? 0 : errno;
  }
  if (err == 0) {
    fsync_path(root_);
    if (hooks_.mid_replace) hooks_.mid_replace();
    fs::remove_all(tmp_dir, ec);
    return;
  }
  if (err != EINVAL && err != ENOSYS && err != EOPNOTSUPP)
    throw SystemError("renameat2(RENAME_EXCHANGE) " + tmp_dir + " <-> " + final_dir, err);
  // The file system cannot exchange (some network file systems): two renames, the old copy kept
  // under a name list() accepts for this step until the new one is in place.
  GZ_LOG(debug, "renameat2(RENAME_EXCHANGE) refused in ", root_, "; replacing ", final_dir, " in two renames");
  fs::remove_all(replaced, ec);
  if (::rename(final_dir.c_str(), replaced.c_str()) != 0)
    throw SystemError("rename " + final_dir + " -> " + replaced, errno);
  fsync_path(root_);
  if (hooks_.mid_replace) hooks_.mid_replace();
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
    throw SystemError("rename " + tmp_dir + " -> " + final_dir, errno);
  fsync_path(root_);
  fs::remove_all(replaced, ec);
}

CheckpointInfo CheckpointManager::read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  const std::string text = read_file(path);
  try {
    const auto n = nlohmann::json::parse(text);
    if (!n.is_object() || !n.contains("format") || (n["format"] != kFormat && n["format"] != kFormatSharded))
      GZ_THROW(Error, "not a Guozhuang checkpoint manifest: ", path);
    CheckpointInfo info;
    info.dir = dir;
    info.step = n.at("step").get<int64_t>();
    info.epoch = n.at("epoch").get<int64_t>();
    info.state_bytes = n.at("state_bytes").get<int64_t>();
    info.sharded = n["format"] == kFormatSharded;
    if (n.contains("metrics") && n["metrics"].is_object())
      for (auto& [k, v] : n["metrics"].items())
        if (v.is_number()) info.metrics[k] = v.get<double>();  // null = not finite when saved
    return info;
  } catch (const nlohmann::json::exception& e) {
    GZ_THROW(Error, "corrupt checkpoint manifest ", path, ": ", e.what());
  }
}

std::vector<CheckpointInfo> CheckpointManager::list() const {
  std::map<int64_t, CheckpointInfo> by_step;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return {};
  for (auto& entry : fs::directory_iterator(root_, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || !entry.is_directory()) continue;
    const bool replaced = ends_with(name, kReplacedSuffix);
    try {
      auto info = read_manifest(entry.path().string());
      // A .replaced copy stands in for its step only while checkpoint-<step> is missing.
      auto [it, inserted] = by_step.emplace(info.step, info);
      if (!inserted && !replaced) it->second = info;
    } catch (const std::exception& e) {
      GZ_LOG(warn, "skipping incomplete checkpoint ", entry.path().string(), ": ", e.what());
    }
  }
  std::vector<CheckpointInfo> out;
  for (auto& [step, info] : by_step) out.push_back(std::move(info));
  return out;
}

std::optional<CheckpointInfo> CheckpointManager::latest() const {
  auto all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<CheckpointInfo> CheckpointManager::find(int64_t step) const {
  for (auto& c : list())
    if (c.step == step) return c;
  return std::nullopt;
}

std::optional<CheckpointInfo> CheckpointManager::open_latest(torch::serialize::InputArchive& archive) const {
  auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return open(it->dir, archive);
    } catch (const Error& e) {
      GZ_LOG(warn, "checkpoint ", it->dir, " is damaged, falling back to an older one: ", e.what());
    }
  }
  return std::nullopt;
}

std::optional<CheckpointInfo> CheckpointManager::best() const {
  std::optional<CheckpointInfo> best;
  if (metric_.empty()) return best;
  for (auto& c : list()) {
    auto it = c.metrics.find(metric_);
    if (it == c.metrics.end()) continue;
    // Ties go to the earlier checkpoint (first to reach the value).
    if (!best || better(it->second, best->metrics.at(metric_))) best = c;
  }
  return best;
}

void CheckpointManager::rotate() const {
  auto all = list();
  auto b = best();
  int64_t excess = static_cast<int64_t>(all.size()) - keep_;
  for (auto& c : all) {
    if (excess <= 0) break;
    if (b && c.dir == b->dir) continue;
    if (c.dir == all.back().dir) continue;  // never the newest
    std::error_code ec;
    fs::remove_all(c.dir, ec);
    if (ec) GZ_LOG(warn, "cannot remove old checkpoint ", c.dir, ": ", ec.message());
    --excess;
  }
}

void CheckpointManager::remove_temp_dirs() const {
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return;
  std::vector<fs::path> entries;
  for (auto& entry : fs::directory_iterator(root_, ec)) entries.push_back(entry.path());
  for (auto& path : entries) {
    std::string name = path.filename().string();
    if (name.rfind(".", 0) == 0 && name.find(".tmp-") != std::string::npos) {
      fs::remove_all(path, ec);
    } else if (name.rfind(kPrefix, 0) == 0 && ends_with(name, kReplacedSuffix)) {
      // A fallback replace interrupted between its renames: the old copy is the only one if
      // checkpoint-<step> is missing.
      const fs::path original = path.parent_path() / name.substr(0, name.size() - std::string(kReplacedSuffix).size());
      if (fs::exists(original, ec)) {
        fs::remove_all(path, ec);
      } else if (::rename(path.c_str(), original.c_str()) != 0) {
        GZ_LOG(warn, "cannot restore interrupted checkpoint ", path.string(), ": ", std::strerror(errno));
      }
    }
  }
}

CheckpointInfo CheckpointManager::open(const std::string& path, torch::serialize::InputArchive& archive) {
  CheckpointInfo info;
  std::string file = path;
  if (fs::is_directory(path)) {
    info = read_manifest(path);
    file = info.state_file();
    std::error_code ec;
    auto size = fs::file_size(file, ec);
    if (ec) GZ_THROW(Error, "checkpoint file ", file, " is missing: ", ec.message());
    if (static_cast<int64_t>(size) != info.state_bytes)
      GZ_THROW(Error, "checkpoint file ", file, " is truncated or altered: ", size, " bytes, manifest says ",
               info.state_bytes);
    if (info.sharded) {
      ShardedCheckpointMeta expect;
      expect.step = info.step;
      verify_sharded_checkpoint(info.shards_dir(), expect);
    }
  } else if (is_state_of_checkpoint(path)) {
    // The state.pt of a sharded checkpoint is half of it: open the directory, shards checked.
    return open(fs::path(path).parent_path().string(), archive);
  } else if (!fs::exists(path)) {
    GZ_THROW(Error, "checkpoint ", path, " does not exist");
  } else {
    info.dir = fs::path(path).parent_path().string();
  }
  try {
    archive.load_from(file);
  } catch (const c10::Error& e) {
    GZ_THROW(Error, "cannot read checkpoint ", file, " (corrupt or not a checkpoint): ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    GZ_THROW(Error, "cannot read checkpoint ", file, ": ", e.what());
  }
  return info;
}

std::vector<NamedTensor> module_tensors(const torch::nn::Module& module) {
  std::vector<NamedTensor> out;
  for (const auto& p : module.named_parameters(true)) out.push_back({p.key(), p.value().detach(), false});
  for (const auto& b : module.named_buffers(true)) out.push_back({b.key(), b.value().detach(), true});
  return out;
}

void save_module_state(const std::vector<NamedTensor>& tensors, torch::serialize::OutputArchive& archive) {
  for (const auto& t : tensors) archive.write(encode_key(t.name), t.tensor.cpu(), t.buffer);
}

void save_module_state(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  save_module_state(module_tensors(module), archive);
}

void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                       const std::string& file, const std::vector<std::string>& elsewhere) {
  const std::set<std::string> held(elsewhere.begin(), elsewhere.end());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  auto collect = [&](const std::string& name, const torch::Tensor& dst, bool buffer) {
    torch::Tensor src;
    bool found = false;
    try {
      found = archive.try_read(encode_key(name), src, buffer);
    } catch (const c10::Error& e) {
      GZ_THROW(Error, "checkpoint ", file, ": cannot read '", name, "': ", e.what_without_backtrace());
    }
    if (!found && held.count(name)) return;
    if (!found) GZ_THROW(Error, "checkpoint ", file, " has no ", buffer ? "buffer" : "parameter", " '", name,
                         "' (a different model?)");
    if (src.sizes() != dst.sizes())
      GZ_THROW(Error, "checkpoint ", file, ": '", name, "' has shape ", src.sizes(), ", the model has ", dst.sizes());
    copies.emplace_back(dst, src);
  };
  for (const auto& p : module.named_parameters(true)) collect(p.key(), p.value(), false);
  for (const auto& b : module.named_buffers(true)) collect(b.key(), b.value(), true);
  torch::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(src);
}

}  // namespace gz::train
