#include "gz/train/checkpoint.h"

#include <yaml-cpp/yaml.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/train/atomic_file.h"

namespace gz::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kFormat = "gz-checkpoint-1";

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

std::string json_number(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  std::string s = os.str();
  if (s == "nan" || s == "-nan" || s == "inf" || s == "-inf") return "null";
  return s;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string root, int64_t keep, std::string metric, bool greater_is_better)
    : root_(std::move(root)), keep_(std::max<int64_t>(1, keep)), metric_(std::move(metric)), greater_(greater_is_better) {}

std::string CheckpointManager::save(torch::serialize::OutputArchive& archive, int64_t step, int64_t epoch,
                                    const std::map<std::string, double>& metrics) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw SystemError("create directory " + root_, ec.value());
  const std::string final_dir = (fs::path(root_) / step_dir_name(step)).string();
  const std::string tmp_dir = temp_name_for(final_dir);
  fs::create_directories(tmp_dir, ec);
  if (ec) throw SystemError("create directory " + tmp_dir, ec.value());
  const std::string state = tmp_dir + "/state.pt";
  try {
    archive.save_to(state);
  } catch (const c10::Error& e) {
    fs::remove_all(tmp_dir, ec);
    GZ_THROW(Error, "cannot write checkpoint ", state, ": ", e.what_without_backtrace());
  }
  fsync_path(state);
  const auto bytes = static_cast<int64_t>(fs::file_size(state));
  std::ostringstream m;
  m << "{\"format\": \"" << kFormat << "\", \"step\": " << step << ", \"epoch\": " << epoch
    << ", \"state_bytes\": " << bytes << ", \"metrics\": {";
  bool first = true;
  for (auto& [k, v] : metrics) {
    m << (first ? "" : ", ") << "\"" << k << "\": " << json_number(v);
    first = false;
  }
  m << "}}\n";
  write_file_atomic(tmp_dir + "/manifest.json", m.str());
  fsync_path(tmp_dir);
  // Replace an existing checkpoint of the same step (a resumed run saving again) in two renames:
  // the old one stays complete until the new one is in place.
  std::string trash;
  if (fs::exists(final_dir)) {
    trash = temp_name_for(final_dir + "-old");
    fs::rename(final_dir, trash, ec);
    if (ec) throw SystemError("rename " + final_dir, ec.value());
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) throw SystemError("rename " + tmp_dir + " -> " + final_dir, ec.value());
  fsync_path(root_);
  if (!trash.empty()) fs::remove_all(trash, ec);
  rotate();
  return final_dir;
}

CheckpointInfo CheckpointManager::read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  YAML::Node n;
  try {
    n = YAML::Load(read_file(path));  // JSON is a subset of YAML
  } catch (const YAML::Exception& e) {
    GZ_THROW(Error, "corrupt checkpoint manifest ", path, ": ", e.what());
  }
  try {
    if (!n.IsMap() || !n["format"] || n["format"].as<std::string>() != kFormat)
      GZ_THROW(Error, "not a Guozhuang checkpoint manifest: ", path);
    CheckpointInfo info;
    info.dir = dir;
    info.step = n["step"].as<int64_t>();
    info.epoch = n["epoch"].as<int64_t>();
    info.state_bytes = n["state_bytes"].as<int64_t>();
    if (n["metrics"] && n["metrics"].IsMap())
      for (auto it = n["metrics"].begin(); it != n["metrics"].end(); ++it)
        if (!it->second.IsNull()) info.metrics[it->first.as<std::string>()] = it->second.as<double>();
    return info;
  } catch (const YAML::Exception& e) {
    GZ_THROW(Error, "corrupt checkpoint manifest ", path, ": ", e.what());
  }
}

std::vector<CheckpointInfo> CheckpointManager::list() const {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  for (auto& entry : fs::directory_iterator(root_, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || !entry.is_directory()) continue;
    try {
      out.push_back(read_manifest(entry.path().string()));
    } catch (const std::exception& e) {
      GZ_LOG(warn, "skipping incomplete checkpoint ", entry.path().string(), ": ", e.what());
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointInfo> CheckpointManager::latest() const {
  auto all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
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
  for (auto& entry : fs::directory_iterator(root_, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(".", 0) == 0 && name.find(".tmp-") != std::string::npos) fs::remove_all(entry.path(), ec);
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

void save_module_state(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  for (const auto& p : module.named_parameters(true)) archive.write(encode_key(p.key()), p.value().detach().cpu());
  for (const auto& b : module.named_buffers(true)) archive.write(encode_key(b.key()), b.value().detach().cpu(), true);
}

void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& file) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  auto collect = [&](const std::string& name, const torch::Tensor& dst, bool buffer) {
    torch::Tensor src;
    bool found = false;
    try {
      found = archive.try_read(encode_key(name), src, buffer);
    } catch (const c10::Error& e) {
      GZ_THROW(Error, "checkpoint ", file, ": cannot read '", name, "': ", e.what_without_backtrace());
    }
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
