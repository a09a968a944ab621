// Sharded checkpoints: writing each rank's file and the manifest, and reading any world size's.
//
// A shard file (a LibTorch archive) holds, per flat group k, this rank's block of the flat
// parameters ("g<k>_param", padding included) and of each defined optimizer state tensor
// ("g<k>_state_<field>"); rank 0's also the optimizer's group options ("opt<g>"). The manifest
// says where every parameter lies in its group's flat layout (the layout rule of shard_layout.h:
// offsets do not depend on the world size, only the block size does), so a loader finds the
// slice [offset + a, offset + b) of any parameter in the blocks of the files that hold it.
#include "torch/zero/sharded_format.h"

#include <fcntl.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "gz/core/error.h"
#include "torch/zero/state_codec.h"
#include "torch/zero/stream_hash.h"

namespace gz {

std::string shard_file_name(int rank, int world) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".pt";
}

bool is_sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(dir) / kShardedManifest, ec);
}

namespace zero {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using StatePtr = std::unique_ptr<torch::optim::OptimizerParamState>;

void fsync_or_throw(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SystemError("open " + path.string() + " for fsync", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw SystemError("fsync " + path.string(), err);
}

// Written under a temp name, fsynced, then renamed: a reader sees the whole file or none.
template <typename Write>
void write_atomic(const fs::path& path, Write write) {
  const fs::path tmp =
      path.parent_path() / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  try {
    write(tmp.string());
    fsync_or_throw(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::error_code ec;
    fs::remove(tmp, ec);
    throw SystemError("rename " + tmp.string() + " -> " + path.string(), err);
  }
}

torch::optim::OptimizerParamState* find_state(torch::optim::Optimizer& opt, const torch::Tensor& key) {
  auto& map = opt.state();
  auto it = map.find(state_key(map, key));
  return it == map.end() ? nullptr : it->second.get();
}

// A tensor that saves only its own elements (a view would save its whole storage).
torch::Tensor owned_flat(const torch::Tensor& t) {
  auto d = t.detach();
  const bool exact = d.is_contiguous() && d.storage_offset() == 0 &&
                     d.storage().nbytes() == static_cast<size_t>(d.numel()) * d.element_size();
  return (exact ? d : d.clone()).reshape({-1});
}

std::string key_of(size_t k, const std::string& what) { return "g" + std::to_string(k) + "_" + what; }

// The archive's bytes into `path`, hashed on the way; returns the checksum.
uint64_t save_hashed(torch::serialize::OutputArchive& a, const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SystemError("create " + path, errno);
  StreamHash hash;
  int err = 0;
  try {
    a.save_to([&](const void* data, size_t n) -> size_t {
      hash.update(data, n);
      for (size_t done = 0; done < n && !err;) {
        const ssize_t w = ::write(fd, static_cast<const char*>(data) + done, n - done);
        if (w < 0 && errno != EINTR) err = errno;
        if (w > 0) done += static_cast<size_t>(w);
      }
      return err ? 0 : n;
    });
  } catch (...) {
    ::close(fd);  // LibTorch's writer throws when a write came up short
    throw;
  }
  if (::close(fd) != 0 && !err) err = errno;
  if (err) throw SystemError("write " + path, err);
  return hash.digest();
}

// This rank's shard file's content: its blocks and their state; the options go into rank 0's file
// (and, with `snapshot`, into every rank's: a shard snapshot is restored from its own bytes; the
// tensors are then copies, so the archive may be saved while training goes on).
torch::serialize::OutputArchive shard_archive(const ShardSet& set, const ShardedCheckpointMeta& meta,
                                              int64_t id, bool snapshot) {
  auto own = [snapshot](const torch::Tensor& t) {
    auto flat = owned_flat(t);
    return snapshot && flat.data_ptr() == t.data_ptr() ? flat.clone() : flat;  // a view: copied
  };
  torch::serialize::OutputArchive a;
  a.write("gz_meta", torch::tensor({kShardedVersion, int64_t(set.rank), int64_t(set.world), meta.step, id},
                                   torch::kInt64));
  a.write("gz_job", c10::IValue(meta.job));
  for (size_t k = 0; k < set.groups.size(); ++k) {
    const auto& g = set.groups[k];
    a.write(key_of(k, "param"), own(g.block));
    auto* st = find_state(*set.state_opt, g.key);
    if (!st) continue;
    for (auto& [name, t] : state_fields(*st).tensors)
      if (t->defined()) a.write(key_of(k, std::string("state_") + name), own(*t));
  }
  if ((set.rank == 0 || snapshot) && set.options_opt) {
    auto& groups = set.options_opt->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      torch::serialize::OutputArchive o;
      groups[g].options().serialize(o);
      a.write("opt" + std::to_string(g), o);
    }
  }
  return a;
}

uint64_t write_shard(const ShardSet& set, const ShardedCheckpointMeta& meta, int64_t id,
                     const fs::path& file) {
  auto a = shard_archive(set, meta, id, false);
  uint64_t sum = 0;
  write_atomic(file, [&](const std::string& tmp) { sum = save_hashed(a, tmp); });
  return sum;
}

json group_json(const ShardSet& set, size_t k) {
  const auto& g = set.groups[k];
  json params = json::array();
  for (size_t j = 0; j < g.params.size(); ++j)
    params.push_back({{"name", g.params[j]},
                      {"shape", g.shapes[j]},
                      {"dtype", c10::toString(g.block.scalar_type())},
                      {"offset", g.layout.offsets[j]},
                      {"numel", g.layout.numels[j]}});
  json out = {{"name", g.name},           {"numel", g.layout.numel}, {"shard", g.layout.shard},
              {"opt_group", g.opt_group}, {"params", params},        {"state", nullptr},
              {"step", nullptr}};
  if (auto* st = find_state(*set.state_opt, g.key)) {
    auto f = state_fields(*st);
    json names = json::object();  // field -> dtype (c10::ScalarType's number)
    for (auto& [name, t] : f.tensors)
      if (t->defined()) names[name] = static_cast<int>(t->scalar_type());
    out["state"] = names;
    if (f.step) out["step"] = *f.step;
  }
  return out;
}

json manifest_json(const ShardSet& set, const ShardedCheckpointMeta& meta, int64_t id,
                   const std::vector<int64_t>& written) {
  json shards = json::array();
  for (int r = 0; r < set.world; ++r)
    shards.push_back({{"file", shard_file_name(r, set.world)},
                      {"bytes", written[2 * r]},
                      {"checksum", hex64(static_cast<uint64_t>(written[2 * r + 1]))}});
  json groups = json::array();
  for (size_t k = 0; k < set.groups.size(); ++k) groups.push_back(group_json(set, k));
  const size_t opt_groups = set.options_opt ? set.options_opt->param_groups().size() : 0;
  return {{"format", kShardedFormat},
          {"world", set.world},
          {"step", meta.step},
          {"job", meta.job},
          {"save_id", id},
          {"shards", shards},
          {"groups", groups},
          {"optimizer_groups", opt_groups}};
}

void write_manifest(const ShardSet& set, const ShardedCheckpointMeta& meta, int64_t id,
                    const std::vector<int64_t>& written, const fs::path& dir) {
  const std::string text = manifest_json(set, meta, id, written).dump(1) + "\n";
  write_atomic(dir / kShardedManifest, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw SystemError("write " + tmp, errno);
  });
}

}  // namespace

void save_shards(const ShardSet& set, comm::Communicator* group, const std::string& dir,
                 const ShardedCheckpointMeta& meta) {
  // One id per save, in every file: shards of different saves never mix.
  int64_t id = 0;
  if (set.rank == 0) {
    // Saving over an older checkpoint: it stops being one (no manifest) before any of its shards
    // is replaced, so a save that fails half-way leaves an incomplete directory, never a manifest
    // over a mix of old and new shards. (To keep the last checkpoint, save into a new directory.)
    std::error_code ec;
    if (fs::remove(fs::path(dir) / kShardedManifest, ec)) {
      try {
        fsync_or_throw(dir);
      } catch (const std::exception&) {  // the others wait in the broadcast below: go on
      }
    }
    id = static_cast<int64_t>(std::random_device{}() & 0x7fffffff) << 31 | std::random_device{}();
  }
  if (group) group->broadcast(&id, 1, DType::i64, 0);
  const fs::path file = fs::path(dir) / shard_file_name(set.rank, set.world);
  int64_t mine[2] = {-1, 0};  // bytes, checksum
  std::string error;
  try {
    mine[1] = static_cast<int64_t>(write_shard(set, meta, id, file));
    mine[0] = static_cast<int64_t>(fs::file_size(file));
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::vector<int64_t> all(2 * static_cast<size_t>(set.world));
  all[0] = mine[0];
  all[1] = mine[1];
  if (group) group->allgather(mine, all.data(), 2, DType::i64);
  std::string failed;
  for (int r = 0; r < set.world; ++r)
    if (all[2 * r] < 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty())
    GZ_THROW(Error, "sharded checkpoint ", dir, ": rank(s) ", failed, " could not write their shard",
             error.empty() ? "" : " (rank " + std::to_string(set.rank) + ": " + error + ")");
  int64_t manifest_failed = 0;
  if (set.rank == 0) {
    try {
      write_manifest(set, meta, id, all, dir);
      fsync_or_throw(dir);
    } catch (const std::exception& e) {
      manifest_failed = 1;
      error = e.what();
    }
  }
  if (group) group->broadcast(&manifest_failed, 1, DType::i64, 0);
  if (manifest_failed)
    GZ_THROW(Error, "sharded checkpoint ", dir, ": rank 0 could not write the manifest",
             error.empty() ? "" : ": " + error);
}

std::function<std::string()> shard_snapshot(const ShardSet& set, const ShardedCheckpointMeta& meta) {
  // The manifest is this rank's view (its own state fields and step); the other shards' sizes and
  // checksums are unknown here and never read: a shard snapshot is restored on its own rank.
  const int64_t id = std::max<int64_t>(0, meta.step);
  auto a = std::make_shared<torch::serialize::OutputArchive>(shard_archive(set, meta, id, true));
  const std::vector<int64_t> unknown(2 * static_cast<size_t>(set.world), 0);
  a->write("gz_manifest", c10::IValue(manifest_json(set, meta, id, unknown).dump()));
  return [a] {
    std::string out;
    a->save_to([&out](const void* data, size_t n) {
      out.append(static_cast<const char*>(data), n);
      return n;
    });
    return out;
  };
}

}  // namespace zero
}  // namespace gz
