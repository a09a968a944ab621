// Sharded checkpoints (gz/torch/sharded_checkpoint.h): ZeRO stage 2 and stage 3 save at 4 ranks,
// load at 1, 2, 3 and 8 (and at stage 1) with bitwise the same parameters and optimizer state as the
// unsharded (consolidated) format gives, and train on exactly as a resume from that format does; a stage-3
// checkpoint loads into stage 2 and whole (consolidation); a missing, corrupt or foreign shard or
// manifest is refused with a message saying which.
#include <fcntl.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gz/core/error.h"
#include "gz/torch/ddp.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/sharded_checkpoint.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "torch/support/torch_test_util.h"
#include "torch/torch_compat.h"

namespace {
using namespace gz;
using namespace gz::test;
namespace fs = std::filesystem;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

constexpr int64_t kGlobal = 24;  // rows per step, all ranks together (divides by 1, 2, 3, 4, 8)
constexpr int kFirst = 3, kMore = 2;

// in (root) -> two blocks (units, run through gz::run_unit) -> head (root). Widths that make
// blocks cut parameters at every world size tried.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    torch::manual_seed(5);
    inp = register_module("inp", torch::nn::Linear(8, 13));
    b1 = register_module("b1", torch::nn::Linear(13, 13));
    b2 = register_module("b2", torch::nn::Linear(13, 13));
    head = register_module("head", torch::nn::Linear(13, 4));
  }
  torch::Tensor forward(const torch::Tensor& input) {
    auto x = torch::tanh(inp->forward(input));
    x = run_unit(*b1, [&] { return torch::tanh(b1->forward(x)); });
    x = run_unit(*b2, [&] { return torch::tanh(b2->forward(x)); });
    return head->forward(x);
  }
  torch::nn::Linear inp{nullptr}, b1{nullptr}, b2{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

std::vector<Net> make_nets(int n) {
  std::vector<Net> out;
  for (int i = 0; i < n; ++i) out.emplace_back();
  return out;
}
torch::optim::AdamWOptions adamw() { return torch::optim::AdamWOptions(1e-2).weight_decay(0.1); }
ZeroOptions zero2(int stage = 2) {
  ZeroOptions z;
  z.stage = stage;
  z.first_bucket_bytes = 64;  // several buckets, cut by the blocks
  z.bucket_bytes = 400;
  return z;
}

std::string to_bytes(const std::function<void(torch::serialize::OutputArchive&)>& save) {
  torch::serialize::OutputArchive a;
  save(a);
  std::ostringstream os;
  a.save_to(os);
  return os.str();
}
void from_bytes(const std::string& bytes, const std::function<void(torch::serialize::InputArchive&)>& load) {
  torch::serialize::InputArchive a;
  std::istringstream is(bytes);
  a.load_from(is);
  load(a);
}

// Per parameter of a whole model: its value, exp_avg, exp_avg_sq, step: what an AdamW over a
// fresh Net holds after loading the unsharded optimizer bytes.
std::vector<torch::Tensor> whole_state(const std::vector<torch::Tensor>& params,
                                       const std::string& opt_bytes) {
  Net fresh;
  torch::optim::AdamW opt(fresh->parameters(), adamw());
  from_bytes(opt_bytes, [&](auto& a) { opt.load(a); });
  std::vector<torch::Tensor> out = params;
  for (auto& p : fresh->parameters()) {
    auto& s =
        static_cast<torch::optim::AdamWParamState&>(*opt.state().at(torch_compat::state_key(opt.state(), p)));
    out.push_back(s.exp_avg());
    out.push_back(s.exp_avg_sq());
    out.push_back(torch::tensor({s.step()}));
  }
  return out;
}

void expect_bitwise(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ": tensor " << i;
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

void train_steps(int from, int to, int r, int world, const Data& d,
                 const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                 torch::optim::Optimizer& opt) {
  const int64_t rows = kGlobal / world;
  for (int s = from; s < to; ++s) {
    opt.zero_grad();
    torch::mse_loss(forward(shard(d.x[s], r, rows)), shard(d.y[s], r, rows)).backward();
    opt.step();
  }
}

// What a run hands back: the whole state after loading, the parameters after training on.
struct Outcome {
  std::vector<torch::Tensor> loaded, trained;
};

enum class From { none, sharded, single };

// Stage 2 at `world` ranks: start fresh (steps [0, to)) or from a checkpoint (steps [kFirst, to));
// optionally save both formats after the last step.
Outcome run_zero(int world, From from, const std::string& dir, const std::string& model_in,
                 const std::string& opt_in, const Data& d, int to, const std::string& save_dir = "",
                 std::string* model_out = nullptr, std::string* opt_out = nullptr, int stage = 2) {
  auto nets = make_nets(world);
  Outcome out;
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = nets[r];
    {
      torch::NoGradGuard ng;
      for (auto& p : m->parameters()) p.add_(1.0);  // loading must overwrite every element
    }
    if (from == From::single) from_bytes(model_in, [&](auto& a) { m->load(a); });
    DistributedDataParallel ddp(m.ptr(), g);
    ZeroRedundancyOptimizer opt(ddp, std::make_shared<torch::optim::AdamW>(m->parameters(), adamw()),
                                zero2(stage));
    if (from == From::sharded) opt.load_sharded(dir, {"job-a", kFirst});
    if (from == From::single) from_bytes(opt_in, [&](auto& a) { opt.load(a); });
    auto consolidated = [&] {
      opt.consolidate_state_dict(0);
      return r == 0 ? to_bytes([&](auto& a) { opt.save(a); }) : std::string();
    };
    if (from != From::none) {
      auto bytes = consolidated();
      if (r == 0) out.loaded = whole_state(clones(m->parameters()), bytes);
    }
    auto fwd = [&](const torch::Tensor& x) { return ddp.forward([&] { return m->forward(x); }); };
    train_steps(from == From::none ? 0 : kFirst, to, r, world, d, fwd, opt);
    opt.synchronize();
    if (!save_dir.empty()) opt.save_sharded(save_dir, {"job-a", to});
    auto bytes = consolidated();
    if (r != 0) return;
    out.trained = clones(m->parameters());
    if (model_out) *model_out = to_bytes([&](auto& a) { m->save(a); });
    if (opt_out) *opt_out = bytes;
  });
  return out;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A checkpoint saved at 4 ranks (`dir`; `model_bytes`/`opt_bytes`: the same state unsharded),
// loaded by `run` at 1, 2, 3 and 8 ranks: bitwise the unsharded state, and training on from it
// bitwise like a resume from the unsharded files. Returns that state (parameters, then state).
template <class Run>
std::vector<torch::Tensor> expect_reshards(Run run, const fs::path& dir, const std::string& model_bytes,
                                           const std::string& opt_bytes, const Data& d) {
  Net saved;
  from_bytes(model_bytes, [&](auto& a) { saved->load(a); });
  auto reference = whole_state(clones(saved->parameters()), opt_bytes);
  for (int world : {1, 2, 3, 8}) {
    const auto w = "world " + std::to_string(world);
    auto sharded = run(world, From::sharded, dir.string(), "", "", d, kFirst + kMore);
    expect_bitwise(sharded.loaded, reference, w + ": loaded state");
    auto single = run(world, From::single, "", model_bytes, opt_bytes, d, kFirst + kMore);
    expect_bitwise(sharded.trained, single.trained, w + ": trained on");
  }
  return reference;
}

TEST(ShardedCheckpoint, Stage2SavedAtFourLoadsAtAnyWorldSize) {
  auto d = make_data(kFirst + kMore, kGlobal);
  TempDir dir("gz-sharded-z2");
  std::string model_bytes, opt_bytes;
  run_zero(4, From::none, "", "", "", d, kFirst, dir.path, &model_bytes, &opt_bytes);
  ASSERT_TRUE(is_sharded_checkpoint(dir.path));
  EXPECT_TRUE(fs::exists(dir.path / shard_file_name(3, 4)));
  const auto info = read_sharded_manifest(dir.path);
  EXPECT_EQ(info.world, 4);
  EXPECT_EQ(info.step, kFirst);
  const auto reference =
      expect_reshards([](auto... a) { return run_zero(a...); }, dir.path, model_bytes, opt_bytes, d);
  // Stage 1 reads the same format.
  expect_bitwise(run_zero(3, From::sharded, dir.path, "", "", d, kFirst, "", nullptr, nullptr, 1).loaded,
                 reference, "at stage 1");
  // Consolidation for export: a plain model and AdamW load the whole of it.
  Net plain;
  torch::optim::AdamW opt(plain->parameters(), adamw());
  load_sharded_whole(*plain, opt, dir.path, {"job-a", kFirst});
  expect_bitwise(whole_state(clones(plain->parameters()), to_bytes([&](auto& a) { opt.save(a); })), reference,
                 "consolidated");
}

// Stage 3, as run_zero.
Outcome run_fsdp(int world, From from, const std::string& dir, const std::string& model_in,
                 const std::string& opt_in, const Data& d, int to, const std::string& save_dir = "",
                 std::string* model_out = nullptr, std::string* opt_out = nullptr) {
  auto nets = make_nets(world);
  Outcome out;
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = nets[r];
    {
      torch::NoGradGuard ng;
      for (auto& p : m->parameters()) p.add_(1.0);
    }
    if (from == From::single) from_bytes(model_in, [&](auto& a) { m->load(a); });
    auto fsdp = fully_shard(m.ptr(), {m->b1.ptr(), m->b2.ptr()}, g);
    torch::optim::AdamW opt(fsdp->parameters(), adamw());
    if (from == From::sharded) fsdp->load_sharded(opt, dir, {"job-a", kFirst});
    if (from == From::single) {
      fsdp->unshard_optimizer(opt, -1);
      from_bytes(opt_in, [&](auto& a) { opt.load(a); });
      fsdp->shard_optimizer(opt);
    }
    // The whole parameters and the unsharded optimizer state (rank 0), as the trainer saves today.
    auto consolidated = [&](std::vector<torch::Tensor>* params) {
      fsdp->unshard();
      if (params) *params = clones(m->parameters());
      fsdp->unshard_optimizer(opt, 0);
      auto bytes = r == 0 ? to_bytes([&](auto& a) { opt.save(a); }) : std::string();
      fsdp->restore_optimizer(opt);
      return bytes;
    };
    if (from != From::none) {
      std::vector<torch::Tensor> params;
      auto bytes = consolidated(&params);
      if (r == 0) out.loaded = whole_state(params, bytes);
    }
    auto fwd = [&](const torch::Tensor& x) { return fsdp->forward([&] { return m->forward(x); }); };
    train_steps(from == From::none ? 0 : kFirst, to, r, world, d, fwd, opt);
    if (!save_dir.empty()) fsdp->save_sharded(opt, save_dir, {"job-a", to});
    std::vector<torch::Tensor> params;
    auto bytes = consolidated(&params);
    if (r != 0) return;
    out.trained = params;
    if (model_out) *model_out = to_bytes([&](auto& a) { m->save(a); });
    if (opt_out) *opt_out = bytes;
  });
  return out;
}

TEST(ShardedCheckpoint, Stage3SavedAtFourLoadsAtAnyWorldSizeAndStage) {
  auto d = make_data(kFirst + kMore, kGlobal);
  TempDir dir("gz-sharded-z3");
  std::string model_bytes, opt_bytes;
  run_fsdp(4, From::none, "", "", "", d, kFirst, dir.path, &model_bytes, &opt_bytes);
  const auto reference =
      expect_reshards([](auto... a) { return run_fsdp(a...); }, dir.path, model_bytes, opt_bytes, d);
  // Stage 3's checkpoint at stage 2 (buckets instead of units).
  expect_bitwise(run_zero(2, From::sharded, dir.path, "", "", d, kFirst).loaded, reference, "at stage 2");
}

void expect_refused(const std::function<void()>& fn, const std::string& says) {
  try {
    fn();
    ADD_FAILURE() << "not refused; expected an error saying '" << says << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(ShardedCheckpoint, BadCheckpointsAreRefused) {
  auto d = make_data(kFirst, kGlobal);
  TempDir good("gz-sharded-good"), other("gz-sharded-other"), bad("gz-sharded-bad");
  run_zero(2, From::none, "", "", "", d, kFirst, good.path);
  run_zero(2, From::none, "", "", "", d, kFirst, other.path);  // the same state, another save
  auto load = [&](ShardedCheckpointMeta expect) {
    Net plain;
    torch::optim::AdamW opt(plain->parameters(), adamw());
    load_sharded_whole(*plain, opt, bad.path, expect);
  };
  auto fresh = [&] {
    fs::remove_all(bad.path);
    fs::copy(good.path, bad.path);
  };
  const auto shard1 = bad.path / shard_file_name(1, 2);
  fresh();
  load({"job-a", kFirst});  // the copy itself loads
  expect_refused([&] { load({"job-b", -1}); }, "belongs to job 'job-a'");
  expect_refused([&] { load({"", kFirst + 1}); }, "is of step 3");
  fs::remove(shard1);
  expect_refused([&] { load({}); }, "shard-1-of-2.pt is missing");
  fresh();
  fs::copy_file(other.path / shard_file_name(1, 2), shard1, fs::copy_options::overwrite_existing);
  expect_refused([&] { load({}); }, "shard-1-of-2.pt is corrupt or from another save");
  fresh();
  {
    // Same size, some bytes of tensor data changed.
    std::fstream f(shard1, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(shard1));
    f.seekp(size / 2);
    f.write("\x55\xaa\x55\xaa\x55\xaa\x55\xaa", 8);
  }
  expect_refused([&] { load({}); }, "shard-1-of-2.pt is corrupt");
  fresh();
  fs::resize_file(bad.path / kShardedManifest, 100);
  expect_refused([&] { load({}); }, "corrupt manifest");
  fs::remove(bad.path / kShardedManifest);
  expect_refused([&] { load({}); }, "no manifest");
  // Collective load with one rank's shard missing: both ranks refuse (rank 0 has all it needs,
  // it learns from the agreement), none waits for the other's all-gather.
  // A rank that waited for a live peer until its 30 s deadline would also throw gz::Error (a
  // TimeoutError): the bound tells those apart. (A peer whose thread ended fails the other's
  // pending op at once, so the stage-3 case below checks rank 0's message instead.)
  fresh();
  fs::remove(shard1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(run_zero(2, From::sharded, bad.path, "", "", d, kFirst), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
      << "a rank waited for its peer's failed load until the op deadline";
  // Stage 3, from a stage-3 save at 2 ranks (rank 0 then needs only its own file): rank 0 must
  // learn of rank 1's failure before it installs anything, not later from a failed gather.
  TempDir z3("gz-sharded-bad-z3");
  run_fsdp(2, From::none, "", "", "", d, kFirst, z3.path);
  fs::remove(fs::path(z3.path) / shard_file_name(1, 2));
  std::string msg[2];
  auto nets = make_nets(2);
  run_ranks(2, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, 2, store);
    auto fsdp = fully_shard(nets[r].ptr(), {nets[r]->b1.ptr(), nets[r]->b2.ptr()}, g);
    torch::optim::AdamW opt(fsdp->parameters(), adamw());
    try {
      fsdp->load_sharded(opt, z3.path, {"job-a", kFirst});
    } catch (const Error& e) {
      msg[r] = e.what();
    }
  });
  EXPECT_NE(msg[1].find("shard-1-of-2.pt"), std::string::npos) << msg[1];
  EXPECT_NE(msg[0].find("rank 1 could not load"), std::string::npos) << "rank 0: '" << msg[0] << "'";
}

// Every number a loader indexes or slices with is checked when the manifest is read: edited
// values become a gz::Error naming the field, never an out-of-range read (or a json exception).
TEST(ShardedCheckpoint, ManifestValuesOutOfRangeAreRefused) {
  auto d = make_data(kFirst, kGlobal);
  TempDir good("gz-sharded-range-good"), bad("gz-sharded-range-bad");
  run_zero(2, From::none, "", "", "", d, kFirst, good.path);
  nlohmann::json original;
  std::ifstream(good.path / kShardedManifest) >> original;
  auto refused_when = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& says) {
    fs::remove_all(bad.path);
    fs::copy(good.path, bad.path);
    auto j = original;
    edit(j);
    std::ofstream(bad.path / kShardedManifest, std::ios::trunc) << j.dump();
    Net plain;
    torch::optim::AdamW opt(plain->parameters(), adamw());
    const auto before = clones(plain->parameters());
    expect_refused([&] { load_sharded_whole(*plain, opt, bad.path, {}); }, says);
    expect_bitwise(clones(plain->parameters()), before, "after refusing (" + says + ")");
  };
  auto& p0 = original["groups"][0]["params"][0];
  const int64_t group_numel = original["groups"][0]["numel"].get<int64_t>();
  refused_when([](auto& j) { j["groups"][0]["shard"] = 1; }, "\"groups[0].shard\" is 1, outside");
  refused_when([](auto& j) { j["groups"][0]["shard"] = -4; }, "\"groups[0].shard\"");
  refused_when([&](auto& j) { j["groups"][0]["params"][0]["offset"] = group_numel; },
               "\"groups[0].params[0].offset\"");
  refused_when([&](auto& j) { j["groups"][0]["params"][0]["numel"] = p0["numel"].get<int64_t>() + 1; },
               "\"groups[0].params[0].numel\"");
  refused_when([](auto& j) { j["groups"][0]["params"][0]["shape"] = "x"; },
               "\"groups[0].params[0].shape\" is not an array");
  refused_when([](auto& j) { j["groups"][0]["params"][0]["shape"][0] = -2; }, "holds a bad size");
  refused_when([](auto& j) { j["groups"][0]["state"]["exp_avg"] = 999; }, "\"groups[0].state.exp_avg\"");
  refused_when([](auto& j) { j["world"] = 3; }, "\"shards\" lists 2 files for world 3");
  refused_when([](auto& j) { j["world"] = 0; }, "\"world\" is 0");
  refused_when([](auto& j) { j["shards"][1]["bytes"] = -5; }, "\"shards[1].bytes\"");
  refused_when([](auto& j) { j["shards"][1].erase("checksum"); }, "\"shards[1].checksum\" is missing");
  refused_when([](auto& j) { j["step"] = 1.5; }, "\"step\" is not an integer");
  refused_when([](auto& j) { j["optimizer_groups"] = 18446744073709551615ull; }, "\"optimizer_groups\"");
  refused_when([&](auto& j) { j["groups"][0]["params"].push_back(p0); }, "is listed twice");
}

// Not a test: the benchmark of bench/run_sharded_ckpt_bench.sh (disabled; run with
// --gtest_also_run_disabled_tests). ZeRO stage 2 + AdamW at 4 ranks over a model of
// GZ_BENCH_WIDTH (default 1024): per round, today's consolidated save (consolidate_state_dict,
// then rank 0 writes model and optimizer to one file, fsynced) and the sharded save, in
// alternating order, each ended by a barrier (the trainer waits for the write as well).
TEST(ShardedCheckpoint, DISABLED_BenchSaveFourRanks) {
  const int world = 4;
  const char* w_env = std::getenv("GZ_BENCH_WIDTH");
  const char* r_env = std::getenv("GZ_BENCH_ROUNDS");
  const char* d_env = std::getenv("GZ_BENCH_DIR");
  const int64_t width = w_env ? std::atoll(w_env) : 1024;
  const int rounds = r_env ? std::atoi(r_env) : 5;
  const fs::path root = fs::path(d_env ? d_env : fs::temp_directory_path().string()) /
                        ("gz-sharded-bench-" + std::to_string(::getpid()));
  fs::create_directories(root);
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(3);
    models.emplace_back(torch::nn::Linear(width, 2 * width), torch::nn::Tanh(),
                        torch::nn::Linear(2 * width, width));
  }
  std::vector<std::vector<double>> secs(2);  // [consolidated, sharded] per round
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store, std::chrono::seconds(300));
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g);
    ZeroRedundancyOptimizer opt(ddp, std::make_shared<torch::optim::AdamW>(m->parameters(), adamw()),
                                zero2());
    opt.zero_grad();
    ddp.forward([&] { return m->forward(torch::randn({4, width})); }).sum().backward();
    opt.step();
    opt.synchronize();
    auto consolidated = [&](const fs::path& file) {
      opt.consolidate_state_dict(0);
      if (r == 0) {
        torch::serialize::OutputArchive a, model, optim;
        m->save(model);
        opt.save(optim);
        a.write("model", model);
        a.write("optimizer", optim);
        a.save_to(file.string());
        const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);  // fsynced, as CheckpointManager does
        ASSERT_GE(fd, 0);
        ::fsync(fd);
        ::close(fd);
      }
    };
    for (int round = 0; round < rounds; ++round)
      for (int i = 0; i < 2; ++i) {
        const int which = (round % 2 == 0) ? i : 1 - i;
        const fs::path dir = root / (std::to_string(round) + (which ? "-sharded" : "-single"));
        if (r == 0) fs::create_directories(dir);
        g->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        if (which)
          opt.save_sharded(dir.string(), {"bench", round});
        else
          consolidated(dir / "state.pt");
        g->barrier();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r == 0) secs[which].push_back(s);
      }
  });
  std::printf("sharded checkpoint save, ZeRO stage 2 + AdamW, 4 ranks, width %lld (%.1f MB of parameters)\n",
              static_cast<long long>(width), 4.0 * (4 * width * width + 3 * width) / 1e6);
  for (int round = 0; round < rounds; ++round)
    std::printf("round %d  consolidated %.3f s  sharded %.3f s  ratio %.2fx\n", round, secs[0][round],
                secs[1][round], secs[0][round] / secs[1][round]);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("median   consolidated %.3f s  sharded %.3f s  ratio %.2fx\n", median(secs[0]), median(secs[1]),
              median(secs[0]) / median(secs[1]));
  fs::remove_all(root);
}

}  // namespace
