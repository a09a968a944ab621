// Sharded checkpoints: reading one at any world size (resharding). Each rank reads, for each
// parameter it owns a part of, that slice from the blocks of the shard files that hold it (files
// are opened lazily: a rank reads only the files its blocks overlap, plus file 0 for the options).
// Everything is staged first and installed only when the whole read succeeded.
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "gz/comm/communicator.h"
#include "gz/core/error.h"
#include "gz/torch/sharded_checkpoint.h"
#include "torch/zero/sharded_format.h"
#include "torch/zero/sharded_manifest.h"
#include "torch/zero/state_codec.h"
#include "torch/zero/stream_hash.h"

namespace gz {

namespace zero {

namespace {

namespace fs = std::filesystem;
using StatePtr = std::unique_ptr<torch::optim::OptimizerParamState>;

void check_expected(const Manifest& m, const ShardedCheckpointMeta& expect) {
  if (!expect.job.empty() && m.job != expect.job)
    GZ_THROW(Error, "sharded checkpoint ", m.dir, " belongs to job '", m.job, "', not to '", expect.job, "'");
  if (expect.step >= 0 && m.step != expect.step)
    GZ_THROW(Error, "sharded checkpoint ", m.dir, " is of step ", m.step, ", expected ", expect.step);
}

// Shard file `s` exists with the manifest's size; returns its path.
std::string check_shard_size(const Manifest& m, int s) {
  const std::string file = (fs::path(m.dir) / shard_file_name(s, m.world)).string();
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) GZ_THROW(Error, "sharded checkpoint ", m.dir, ": shard file ", file, " is missing: ", ec.message());
  if (static_cast<int64_t>(size) != m.bytes[static_cast<size_t>(s)])
    GZ_THROW(Error, "sharded checkpoint ", m.dir, ": shard file ", file, " has ", size,
             " bytes, the manifest says ", m.bytes[static_cast<size_t>(s)],
             " (truncated, altered or from another save)");
  return file;
}

std::string file_checksum(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> buf(size_t(1) << 20);
  StreamHash hash;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    hash.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return hex64(hash.digest());
}

// The shard files of one checkpoint, opened on first use and checked against the manifest.
class ShardReader {
 public:
  explicit ShardReader(const Manifest& m) : m_(m), files_(static_cast<size_t>(m.world)) {}
  /// @brief Shard `s` is the archive `a` (a shard snapshot's bytes, already loaded), which also
  /// holds the options.
  ShardReader(const Manifest& m, int s, std::unique_ptr<torch::serialize::InputArchive> a,
              const std::string& where)
      : ShardReader(m) {
    if (s < 0 || s >= m.world)
      GZ_THROW(Error, where, ": rank ", s, " is outside the manifest's world ", m.world);
    check_meta(*a, s, where);
    files_[static_cast<size_t>(s)] = std::move(a);
    options_shard_ = s;
  }

  /// @brief Every shard from bytes (shard snapshots of a world of any size: `shards[s]` is shard
  /// s's, null where this rank was not given it), each parsed on first use; `first` (already
  /// parsed from its bytes: it holds the manifest) also holds the options.
  ShardReader(const Manifest& m, std::vector<const std::string*> shards, int first,
              std::unique_ptr<torch::serialize::InputArchive> a, const std::string& where)
      : ShardReader(m, first, std::move(a), where) {
    bytes_ = std::move(shards);
  }

  /// @brief The shard whose archive holds the optimizer's options.
  int options_shard() const { return options_shard_; }

  torch::serialize::InputArchive& archive(int s) {
    auto& slot = files_[static_cast<size_t>(s)];
    if (slot) return *slot;
    if (!bytes_.empty()) return from_bytes(s);
    const std::string file = check_shard_size(m_, s);
    if (file_checksum(file) != m_.checksums[s])
      GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": shard file ", file,
               " is corrupt or from another save (its checksum differs from the manifest's)");
    auto a = std::make_unique<torch::serialize::InputArchive>();
    try {
      a->load_from(file, torch::Device(torch::kCPU));  // a GPU save consolidates on a CPU-only host
    } catch (const c10::Error& e) {
      GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": cannot read shard file ", file,
               " (corrupt?): ", e.what_without_backtrace());
    }
    check_meta(*a, s, "shard file " + file);
    slot = std::move(a);
    return *slot;
  }

  torch::Tensor tensor(int s, const std::string& key) {
    torch::Tensor t;
    bool found = false;
    try {
      found = archive(s).try_read(key, t);
    } catch (const c10::Error& e) {
      GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": shard ", s, ": cannot read '", key,
               "': ", e.what_without_backtrace());
    }
    if (!found)
      GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": shard ", s, " has no '", key, "' (corrupt?)");
    return t;
  }

  /// @brief Elements [x, y) of old group `og`'s flat `what` ("param", "state_<field>").
  torch::Tensor range(size_t og, const std::string& what, int64_t x, int64_t y) {
    const int64_t shard = m_.groups[og].shard;  // parse_manifest(): world blocks cover the group
    const std::string key = "g" + std::to_string(og) + "_" + what;
    std::vector<torch::Tensor> pieces;
    for (int64_t s = x / shard; s * shard < y; ++s) {
      if (s >= m_.world)  // unreachable after parse_manifest()'s checks; an index, so checked anyway
        GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": '", key, "' [", x, ", ", y, ") lies past shard ",
                 m_.world - 1);
      const int64_t lo = std::max(x, s * shard), hi = std::min(y, (s + 1) * shard);
      auto t = tensor(static_cast<int>(s), key);
      if (t.numel() != shard)
        GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": shard ", s, ": '", key, "' has ", t.numel(),
                 " elements, the manifest says ", shard);
      pieces.push_back(t.narrow(0, lo - s * shard, hi - lo));
    }
    return pieces.size() == 1 ? pieces[0] : torch::cat(pieces);
  }

 private:
  torch::serialize::InputArchive& from_bytes(int s) {
    const std::string* bytes = bytes_[static_cast<size_t>(s)];
    if (!bytes || bytes->empty()) GZ_THROW(Error, m_.dir, ": the shard snapshot of rank ", s, " is not here");
    auto a = std::make_unique<torch::serialize::InputArchive>();
    try {
      a->load_from(bytes->data(), bytes->size(), torch::Device(torch::kCPU));
    } catch (const c10::Error& e) {
      GZ_THROW(Error, m_.dir, ": the shard snapshot of rank ", s,
               " cannot be read (corrupt?): ", e.what_without_backtrace());
    }
    check_meta(*a, s, "the shard snapshot of rank " + std::to_string(s));
    files_[static_cast<size_t>(s)] = std::move(a);
    return *files_[static_cast<size_t>(s)];
  }

  void check_meta(torch::serialize::InputArchive& a, int s, const std::string& what) const {
    torch::Tensor meta;
    c10::IValue job;
    try {
      a.read("gz_meta", meta);
      a.read("gz_job", job);
    } catch (const c10::Error& e) {
      GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": cannot read ", what,
               " (corrupt?): ", e.what_without_backtrace());
    }
    auto v = meta.to(torch::kInt64);
    if (v.numel() != 5 || v[0].item<int64_t>() != kShardedVersion || v[1].item<int64_t>() != s ||
        v[2].item<int64_t>() != m_.world || v[4].item<int64_t>() != m_.id || job.toStringRef() != m_.job)
      GZ_THROW(Error, "sharded checkpoint ", m_.dir, ": ", what,
               " belongs to another save (rank, world, save id or job differ from the manifest's)");
  }

  const Manifest& m_;
  std::vector<std::unique_ptr<torch::serialize::InputArchive>> files_;
  std::vector<const std::string*> bytes_;  // shard snapshots' bytes (empty: shard files)
  int options_shard_ = 0;
};

struct OldParam {
  size_t group = 0;
  int64_t offset = 0, numel = 0;
  std::vector<int64_t> shape;
  std::string dtype;
};

std::map<std::string, OldParam> index_params(const Manifest& m) {
  std::map<std::string, OldParam> out;
  for (size_t k = 0; k < m.groups.size(); ++k)
    for (const ManifestParam& p : m.groups[k].params)
      if (!out.emplace(p.name, OldParam{k, p.offset, p.numel, p.shape, p.dtype}).second)
        GZ_THROW(Error, "sharded checkpoint ", m.dir, ": parameter '", p.name,
                 "' is listed twice (corrupt manifest)");
  return out;
}

// What one new group will hold: its block and (if any old group it draws on has some) state.
struct Staged {
  torch::Tensor block;
  std::map<std::string, torch::Tensor> fields;
  bool has_state = false;
  int64_t step = -1;
};

const OldParam& find_param(const std::map<std::string, OldParam>& where, const FlatGroup& g, size_t j,
                           const Manifest& m) {
  auto it = where.find(g.params[j]);
  if (it == where.end())
    GZ_THROW(Error, "sharded checkpoint ", m.dir, " has no parameter '", g.params[j],
             "' (a different model?)");
  const OldParam& old = it->second;
  if (old.shape != g.shapes[j] || old.dtype != c10::toString(g.block.scalar_type()))
    GZ_THROW(Error, "sharded checkpoint ", m.dir, ": parameter '", g.params[j], "' is ", old.dtype, " ",
             c10::IntArrayRef(old.shape), ", the model's is ", c10::toString(g.block.scalar_type()), " ",
             c10::IntArrayRef(g.shapes[j]));
  return old;
}

// The state every rank's block of `g` gets, whatever part it owns (ranks must agree even when a
// block is all padding): the union of the fields of the old groups its parameters come from.
void stage_state_fields(const FlatGroup& g, int64_t numel, const Manifest& m,
                        const std::map<std::string, OldParam>& where, Staged& out) {
  for (size_t j = 0; j < g.params.size(); ++j) {
    const ManifestGroup& og = m.groups[find_param(where, g, j, m).group];
    if (!og.has_state) continue;
    out.has_state = true;
    // Old groups merged into one (e.g. stage 2 buckets into stage 3 units) keep one step: the
    // newest. Within one save every group steps together, so they differ only for groups that
    // were skipped while their gradients were missing.
    out.step = std::max(out.step, og.step);
    for (const auto& field : og.state) {
      auto& t = out.fields[field.first];
      if (!t.defined()) t = torch::zeros({numel}, g.block.options().dtype(field.second));
    }
  }
}

Staged stage_group(const FlatGroup& g, int rank, const Manifest& m,
                   const std::map<std::string, OldParam>& where, ShardReader& rd) {
  const auto [lo, hi] = g.layout.block(rank);
  Staged out;
  out.block = torch::zeros({hi - lo}, g.block.options().requires_grad(false));  // padding is zero
  stage_state_fields(g, hi - lo, m, where, out);
  for (size_t j = 0; j < g.params.size(); ++j) {
    const OldParam& old = find_param(where, g, j, m);
    const auto [first, last] = owned_part(g.layout, j, rank);
    if (first >= last) continue;
    const int64_t x = old.offset + first - g.layout.offsets[j], y = x + (last - first);
    out.block.narrow(0, first - lo, last - first).copy_(rd.range(old.group, "param", x, y));
    const ManifestGroup& og = m.groups[old.group];
    for (const auto& field : og.state)
      out.fields[field.first]
          .narrow(0, first - lo, last - first)
          .copy_(rd.range(old.group, "state_" + field.first, x, y));
  }
  return out;
}

StatePtr make_state(const FlatGroup& g, Staged& s, torch::optim::Optimizer& opt, const std::string& dir) {
  auto st = new_state(opt);
  auto f = state_fields(*st);
  for (auto& [field, t] : s.fields) {
    const std::string& name = field;  // clang: a lambda may not capture a structured binding
    auto it = std::find_if(f.tensors.begin(), f.tensors.end(), [&](auto& e) { return name == e.first; });
    if (it == f.tensors.end())
      GZ_THROW(Error, "sharded checkpoint ", dir, ": optimizer state '", name,
               "' is unknown to this optimizer");
    *it->second = t.narrow(0, 0, g.block.numel()).view(g.block.sizes());
  }
  if (f.step && s.step >= 0) *f.step = s.step;
  return st;
}

std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> stage_options(const ShardSet& set,
                                                                           const Manifest& m,
                                                                           ShardReader& rd) {
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> out;
  if (!set.options_opt) return out;
  auto& groups = set.options_opt->param_groups();
  if (groups.size() != m.opt_groups)
    GZ_THROW(Error, "sharded checkpoint ", m.dir, " has ", m.opt_groups,
             " optimizer parameter group(s), this optimizer ", groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::InputArchive in;
    if (!rd.archive(rd.options_shard()).try_read("opt" + std::to_string(g), in))
      GZ_THROW(Error, "sharded checkpoint ", m.dir, ": shard ", rd.options_shard(),
               " has no options of parameter group ", g);
    auto o = groups[g].options().clone();
    try {
      o->serialize(in);
    } catch (const c10::Error& e) {
      GZ_THROW(Error, "sharded checkpoint ", m.dir, ": options of parameter group ", g,
               " do not fit this optimizer: ", e.what_without_backtrace());
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace

namespace {

// Stages everything from `rd`, then (after `before_install`) installs it.
void load_from(ShardSet& set, const Manifest& m, const ShardedCheckpointMeta& expect, ShardReader& rd,
               const std::function<void()>& before_install) {
  check_expected(m, expect);
  const auto where = index_params(m);
  std::vector<Staged> staged;
  for (auto& g : set.groups) staged.push_back(stage_group(g, set.rank, m, where, rd));
  std::vector<StatePtr> states(set.groups.size());
  for (size_t k = 0; k < set.groups.size(); ++k)
    if (staged[k].has_state) states[k] = make_state(set.groups[k], staged[k], *set.state_opt, m.dir);
  auto options = stage_options(set, m, rd);
  if (before_install) before_install();
  // Everything read: install it.
  torch::NoGradGuard no_grad;
  auto& map = set.state_opt->state();
  for (size_t k = 0; k < set.groups.size(); ++k) {
    auto& g = set.groups[k];
    g.block.detach().view({-1}).copy_(staged[k].block.narrow(0, 0, g.block.numel()));
    const auto key = state_key(map, g.key);
    if (states[k])
      map[key] = std::move(states[k]);
    else
      map.erase(key);
  }
  for (size_t g = 0; g < options.size(); ++g)
    set.options_opt->param_groups()[g].set_options(std::move(options[g]));
}

// `load(before_install)` on every rank of `group`, all or nothing (load_shards_collective()).
void all_or_nothing(const ShardSet& set, comm::Communicator* group, const std::string& what,
                    const std::string& who, const std::function<void(const std::function<void()>&)>& load) {
  if (!group) return load(nullptr);
  bool agreed = false;
  // Each rank offers its own number when it failed, the world size when not: the minimum names
  // the lowest failed rank.
  auto agree = [&](bool ok) {
    int64_t lowest = ok ? set.world : set.rank;
    agreed = true;
    group->allreduce(&lowest, 1, DType::i64, comm::ReduceOp::min);
    if (ok && lowest < set.world)
      GZ_THROW(Error, who, " on rank ", set.rank, ": rank ", lowest, " could not load ", what,
               " (its error says why); nothing was loaded");
  };
  try {
    load([&] { agree(true); });
  } catch (...) {
    if (!agreed) {
      try {
        agree(false);  // tells the others; this rank's own error is the one that counts
      } catch (...) {
      }
    }
    throw;
  }
}

}  // namespace

void load_shards(ShardSet& set, const std::string& dir, const ShardedCheckpointMeta& expect,
                 const std::function<void()>& before_install) {
  const Manifest m = parse_manifest(dir);
  ShardReader rd(m);
  load_from(set, m, expect, rd, before_install);
}

void load_shards_collective(ShardSet& set, comm::Communicator* group, const std::string& dir,
                            const ShardedCheckpointMeta& expect, const std::string& who) {
  all_or_nothing(set, group, dir, who,
                 [&](const std::function<void()>& before) { load_shards(set, dir, expect, before); });
}

namespace {

// Shard `s`'s snapshot bytes parsed, and the manifest it carries.
std::pair<std::unique_ptr<torch::serialize::InputArchive>, Manifest> open_snapshot(const std::string& bytes,
                                                                                   const std::string& where) {
  auto a = std::make_unique<torch::serialize::InputArchive>();
  c10::IValue text;
  try {
    a->load_from(bytes.data(), bytes.size(), torch::Device(torch::kCPU));
    a->read("gz_manifest", text);
  } catch (const c10::Error& e) {
    GZ_THROW(Error, where, ": not a shard snapshot (corrupt?): ", e.what_without_backtrace());
  }
  Manifest m = parse_manifest_text(text.toStringRef(), where, "its manifest");
  return {std::move(a), std::move(m)};
}

}  // namespace

void load_shard_bytes_collective(ShardSet& set, comm::Communicator* group, const std::string& bytes,
                                 const std::string& where, const ShardedCheckpointMeta& expect,
                                 const std::string& who) {
  all_or_nothing(set, group, where, who, [&](const std::function<void()>& before) {
    auto [a, m] = open_snapshot(bytes, where);
    if (m.world != set.world) GZ_THROW(Error, where, " is of world ", m.world, ", this job's is ", set.world);
    ShardReader rd(m, set.rank, std::move(a), where);
    load_from(set, m, expect, rd, before);
  });
}

void load_shard_snapshots_collective(ShardSet& set, comm::Communicator* group,
                                     const std::vector<std::string>& shards, const std::string& where,
                                     const ShardedCheckpointMeta& expect, const std::string& who) {
  all_or_nothing(set, group, where, who, [&](const std::function<void()>& before) {
    // The manifest (the layout of the old world's flat groups) and the options: the first shard's.
    const auto first = std::find_if(shards.begin(), shards.end(), [](auto& b) { return !b.empty(); });
    if (first == shards.end()) GZ_THROW(Error, where, ": no shard snapshot given");
    const int s = static_cast<int>(first - shards.begin());
    auto [a, m] = open_snapshot(*first, where + ", rank " + std::to_string(s) + "'s shard");
    if (m.world != static_cast<int>(shards.size()))
      GZ_THROW(Error, where, ": rank ", s, "'s shard is of world ", m.world, ", not ", shards.size());
    std::vector<const std::string*> bytes;
    for (const auto& b : shards) bytes.push_back(b.empty() ? nullptr : &b);
    m.dir = where;  // names it in the reader's errors
    ShardReader rd(m, std::move(bytes), s, std::move(a), where);
    load_from(set, m, expect, rd, before);
  });
}

}  // namespace zero

namespace {

ShardedCheckpointInfo info_of(const zero::Manifest& m) {
  ShardedCheckpointInfo info{m.world, m.step, m.job, {}};
  for (const auto& g : m.groups)
    for (const auto& p : g.params) info.params.push_back(p.name);
  return info;
}

}  // namespace

ShardedCheckpointInfo read_sharded_manifest(const std::string& dir) {
  return info_of(zero::parse_manifest(dir));
}

ShardedCheckpointInfo verify_sharded_checkpoint(const std::string& dir, const ShardedCheckpointMeta& expect) {
  const auto m = zero::parse_manifest(dir);
  zero::check_expected(m, expect);
  for (int s = 0; s < m.world; ++s) zero::check_shard_size(m, s);
  return info_of(m);
}

void load_sharded_whole(torch::nn::Module& model, torch::optim::Optimizer& opt, const std::string& dir,
                        const ShardedCheckpointMeta& expect) {
  // Each parameter the optimizer holds is a group of its own at world 1: its block is all of it.
  std::map<const void*, size_t> group_of;
  for (size_t g = 0; g < opt.param_groups().size(); ++g)
    for (auto& p : opt.param_groups()[g].params()) group_of[p.unsafeGetTensorImpl()] = g;
  zero::ShardSet set;
  set.state_opt = set.options_opt = &opt;
  for (const auto& item : model.named_parameters()) {
    auto it = group_of.find(item.value().unsafeGetTensorImpl());
    if (it == group_of.end()) continue;
    zero::FlatGroup g;
    g.name = item.key();
    g.params = {item.key()};
    g.shapes = {item.value().sizes().vec()};
    g.layout = zero::flat_bucket({item.value().numel()}, 1);
    g.block = g.key = item.value();
    g.opt_group = it->second;
    set.groups.push_back(std::move(g));
  }
  zero::load_shards(set, dir, expect);
}

}  // namespace gz
