// The Trainer's sharded checkpoints (config checkpoint_format): written by every rank at ZeRO
// stages 1-3, resumed at another world size, at another stage and under plain DDP, skipped when
// damaged, never left half-written, and exported to the consolidated format.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/sharded_checkpoint.h"
#include "gz/train/checkpoint.h"
#include "gz/train/models/shard_units.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"

namespace test_trainer_sharded {

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

// A tiny classifier with a buffer the training changes (samples seen): state.pt must carry it.
struct NetImpl : ModelImpl, ShardUnits {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
    seen = register_buffer("seen", torch::zeros({1}));
  }
  torch::Tensor forward(torch::Tensor x) override {
    if (is_training()) seen.add_(x.size(0));
    x = torch::relu(gz::run_unit(*fc1, [&] { return fc1->forward(x.reshape({x.size(0), -1})); }));
    return fc2->forward(x);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> shard_units() const override { return {fc1.ptr()}; }
  std::shared_ptr<ModelImpl> clone_model() const override {
    auto c = std::make_shared<NetImpl>();
    torch::NoGradGuard g;
    for (size_t i = 0; i < parameters().size(); ++i) c->parameters()[i].copy_(parameters()[i]);
    c->seen.copy_(seen);
    return c;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor seen;
};

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("gz_tshard_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// 256 samples, global batch 16: 16 steps.
TrainConfig config(const fs::path& work_dir, int zero_stage) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.train_data = "256";
  c.test_data = "64";
  c.input_size = 4;
  c.in_channels = 1;
  c.num_classes = 4;
  c.batch_size = 4;
  c.global_batch_size = 16;
  c.num_epochs = 1;
  c.lr = 0.01;
  c.optimizer = "adamw";
  c.weight_decay = 0.01;
  c.scheduler.name = "cosine";
  c.scheduler.warmup_steps = 3;
  c.max_grad_norm = 0.5;
  c.num_workers = 0;
  c.progress = false;
  c.tensorboard = false;
  c.log_every = 1000;
  c.num_threads = 1;
  c.work_dir = work_dir.string();
  c.seed = 3;
  c.save_steps = 5;
  c.save_total_limit = 3;
  c.mode = "ddp";
  c.zero_stage = zero_stage;
  return c;
}

std::string ckpt(const fs::path& work_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "checkpoint-%08lld", static_cast<long long>(step));
  return (work_dir / "checkpoints" / name).string();
}

// Rank 0's record of a run.
struct Recorder : Callback {
  int64_t start_step = -1;
  std::map<int64_t, double> losses;  // step -> loss
  std::function<void(Trainer&)> on_begin;
  void on_train_begin(Trainer& t) override {
    start_step = t.state().step;
    if (on_begin) on_begin(t);
  }
  void on_step_end(Trainer& t) override { losses[t.state().step] = t.state().loss; }
};

struct Outcome {
  std::vector<torch::Tensor> state;  // rank 0's parameters and buffers after train()
  std::map<int64_t, double> losses;
  int64_t start_step = -1;
  std::vector<std::string> errors;  // per rank, empty: train() returned
  std::vector<bool> gz_errors;
};

// `world` ranks as threads over shm (world 1: mode single), each rank's outcome recorded.
Outcome run(int world, TrainConfig c, int64_t crash_at = -1,
            std::function<void(Trainer&)> on_begin = nullptr) {
  Outcome out;
  out.errors.resize(static_cast<size_t>(world));
  out.gz_errors.resize(static_cast<size_t>(world));
  std::vector<ModelPtr> nets;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(1234);  // built here: the threads share the global RNG
    nets.push_back(std::make_shared<NetImpl>());
  }
  gz::test::run_ranks(world, [&](int rank, std::shared_ptr<gz::Store> store) {
    try {
      gz::comm::CommPtr group;
      auto cfg = c;
      if (world > 1) {
        gz::comm::ShmOptions so;
        so.timeout = std::chrono::seconds(20);
        group = gz::comm::create_shm_communicator(rank, world, store, so);
      } else {
        cfg.mode = "single";
      }
      Trainer t(cfg, group);
      t.set_model(nets[static_cast<size_t>(rank)]);
      auto rec = std::make_shared<Recorder>();
      rec->on_begin = on_begin;
      t.add_callback(rec);
      if (crash_at > 0) t.set_crash_at_step(crash_at);
      t.train();
      t.gather_model();  // zero_stage 3: train() leaves the parameters sharded
      if (rank == 0) {
        for (auto& p : t.model()->parameters()) out.state.push_back(p.detach().clone());
        for (auto& b : t.model()->buffers()) out.state.push_back(b.detach().clone());
        out.losses = rec->losses;
        out.start_step = rec->start_step;
      }
    } catch (const gz::Error& e) {
      out.errors[static_cast<size_t>(rank)] = e.what();
      out.gz_errors[static_cast<size_t>(rank)] = true;
    } catch (const std::exception& e) {
      out.errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  return out;
}

void expect_ok(const Outcome& o) {
  for (size_t r = 0; r < o.errors.size(); ++r) EXPECT_EQ(o.errors[r], "") << "rank " << r;
}

void expect_same(const Outcome& a, const Outcome& b, double rtol = 1e-6, double atol = 1e-7) {
  ASSERT_EQ(a.state.size(), b.state.size());
  ASSERT_FALSE(a.state.empty());
  for (size_t i = 0; i < a.state.size(); ++i)
    EXPECT_TRUE(torch::allclose(a.state[i], b.state[i], rtol, atol))
        << "tensor " << i << " max diff " << (a.state[i] - b.state[i]).abs().max().item<float>();
  EXPECT_EQ(a.start_step, b.start_step);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (auto& [step, loss] : a.losses)
    EXPECT_NEAR(loss, b.losses.at(step), 1e-6 + rtol * std::abs(loss)) << step;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What a checkpoint's state.pt holds: an archive ("optimizer"), a tensor ("counters") or a tensor
// of the model's archive ("model/fc1__weight").
bool state_has(const std::string& dir, const std::string& key) {
  torch::serialize::InputArchive root, sub;
  root.load_from(dir + "/state.pt");
  torch::Tensor t;
  if (key == "optimizer") return root.try_read(key, sub);
  if (key.rfind("model/", 0) != 0) return root.try_read(key, t);
  if (!root.try_read("model", sub)) return false;
  const std::string name = key.substr(6);
  return sub.try_read(name, t, name == "seen");
}

// Stage `stage` at 4 ranks: the sharded checkpoint of step 5 (no optimizer state, no trained
// parameters in state.pt; one shard per rank) resumes at 2 and 4 ranks exactly as the
// consolidated checkpoint of the same run does (which, resumed with checkpoint_format auto, is
// an old checkpoint loading at stage 2/3).
void sharded_matches_consolidated(int stage, const fs::path& root) {
  auto cs = config(root / "sharded", stage), cc = config(root / "consolidated", stage);
  cc.checkpoint_format = "consolidated";
  auto crashed = run(4, cs, 7);
  for (auto& e : crashed.errors) ASSERT_NE(e, "");  // the simulated crash
  run(4, cc, 7);
  const std::string s5 = ckpt(root / "sharded", 5), c5 = ckpt(root / "consolidated", 5);
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(fs::is_regular_file(s5 + "/shards/" + gz::shard_file_name(r, 4))) << r;
  EXPECT_TRUE(gz::is_sharded_checkpoint(s5 + "/shards"));
  EXPECT_TRUE(CheckpointManager::read_manifest(s5).sharded);
  EXPECT_FALSE(state_has(s5, "optimizer"));
  EXPECT_FALSE(state_has(s5, "model/fc1__weight"));
  EXPECT_TRUE(state_has(s5, "model/seen"));  // buffers stay in state.pt
  EXPECT_TRUE(state_has(s5, "counters"));
  EXPECT_FALSE(fs::exists(c5 + "/shards"));
  EXPECT_TRUE(state_has(c5, "optimizer"));
  EXPECT_FALSE(CheckpointManager::read_manifest(c5).sharded);
  cc.checkpoint_format = "auto";  // resumed from the old format, saving sharded from here on
  cs.resume_from_checkpoint = cc.resume_from_checkpoint = "auto";
  for (int world : {2, 4}) {
    SCOPED_TRACE("resumed on " + std::to_string(world) + " ranks");
    fs::remove_all(root / "s");
    fs::remove_all(root / "c");
    fs::copy(root / "sharded", root / "s", fs::copy_options::recursive);
    fs::copy(root / "consolidated", root / "c", fs::copy_options::recursive);
    cs.work_dir = (root / "s").string();
    cc.work_dir = (root / "c").string();
    auto from_sharded = run(world, cs), from_consolidated = run(world, cc);
    expect_ok(from_sharded);
    expect_ok(from_consolidated);
    EXPECT_EQ(from_sharded.start_step, 5);
    expect_same(from_sharded, from_consolidated);
  }
}

}  // namespace

TEST(TrainerSharded, Stage2SavesShardsAndResumesAtAnyWorldLikeConsolidated) {
  TmpDir d("z2");
  sharded_matches_consolidated(2, d.path);
}

TEST(TrainerSharded, Stage3SavesShardsAndResumesAtAnyWorldLikeConsolidated) {
  TmpDir d("z3");
  sharded_matches_consolidated(3, d.path);
}

// The newest checkpoint with a truncated shard is skipped with a warning; the older one resumes
// exactly (the uninterrupted run's result).
TEST(TrainerSharded, DamagedNewestShardFallsBackToOlderCheckpoint) {
  TmpDir a("dmg_a"), b("dmg_b");
  auto ca = config(a.path, 2), cb = config(b.path, 2);
  auto uninterrupted = run(2, ca);
  expect_ok(uninterrupted);
  run(2, cb, 12);  // checkpoints 5 and 10
  {
    // Shards of another step under checkpoint 10 (complete, but not its own): refused, and the
    // listing falls back to 5.
    fs::copy(b.path / "checkpoints", a.path / "mixed", fs::copy_options::recursive);
    const std::string m5 = (a.path / "mixed" / fs::path(ckpt(b.path, 5)).filename()).string();
    const std::string m10 = (a.path / "mixed" / fs::path(ckpt(b.path, 10)).filename()).string();
    fs::remove_all(m10 + "/shards");
    fs::copy(m5 + "/shards", m10 + "/shards", fs::copy_options::recursive);
    torch::serialize::InputArchive archive;
    try {
      CheckpointManager::open(m10, archive);
      ADD_FAILURE() << "shards of step 5 accepted in checkpoint 10";
    } catch (const gz::Error& e) {
      EXPECT_TRUE(contains(e.what(), "step 5, expected 10")) << e.what();
    }
    CheckpointManager manager((a.path / "mixed").string(), 3, "", true);
    auto opened = manager.open_latest(archive);
    ASSERT_TRUE(opened.has_value());
    EXPECT_EQ(opened->step, 5);
  }
  const std::string shard = ckpt(b.path, 10) + "/shards/" + gz::shard_file_name(1, 2);
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) / 2);
  cb.resume_from_checkpoint = "auto";
  testing::internal::CaptureStderr();
  auto resumed = run(2, cb);
  const std::string log = testing::internal::GetCapturedStderr();
  expect_ok(resumed);
  EXPECT_EQ(resumed.start_step, 5);
  EXPECT_TRUE(contains(log, ckpt(b.path, 10))) << log;
  EXPECT_TRUE(contains(log, "falling back")) << log;
  EXPECT_TRUE(contains(log, "shard-1-of-2.pt")) << log;
  uninterrupted.losses.erase(uninterrupted.losses.begin(), uninterrupted.losses.upper_bound(5));
  uninterrupted.start_step = 5;
  expect_same(uninterrupted, resumed);
}

// A stage-2 job's sharded checkpoint resumes under plain DDP (zero_stage 0) and in one process:
// the whole state loads on every rank.
TEST(TrainerSharded, Stage2CheckpointResumesWithoutZero) {
  TmpDir a("nz_a"), b("nz_b");
  auto ca = config(a.path, 2), cb = config(b.path, 2);
  auto uninterrupted = run(2, ca);
  expect_ok(uninterrupted);
  run(2, cb, 7);  // checkpoint 5
  auto cs = config(b.path / "single", 0);
  cs.resume_from_checkpoint = ckpt(b.path, 5);
  auto single = run(1, cs);
  expect_ok(single);
  EXPECT_EQ(single.start_step, 5);
  cb.zero_stage = 0;
  cb.resume_from_checkpoint = "auto";
  auto ddp = run(2, cb);
  expect_ok(ddp);
  EXPECT_EQ(ddp.start_step, 5);
  uninterrupted.losses.erase(uninterrupted.losses.begin(), uninterrupted.losses.upper_bound(5));
  uninterrupted.start_step = 5;
  expect_same(uninterrupted, ddp, 1e-5, 1e-6);  // DDP and ZeRO differ by rounding only
  EXPECT_THROW(
      {
        auto bad = config(b.path, 0);
        bad.mode = "single";
        bad.checkpoint_format = "sharded";
        Trainer t(bad, nullptr);
      },
      gz::InvalidArgument);
}

// One rank cannot write its shard of the second checkpoint: every rank throws quickly, nothing of
// that save is left (no listed checkpoint, no temp dir), the first checkpoint is intact.
TEST(TrainerSharded, OneRankShardWriteFailureFailsEveryRankAndLeavesNoCheckpoint) {
  TmpDir d("fail");
  auto c = config(d.path, 2);
  auto block_rank1 = [](Trainer& t) {
    if (t.rank() != 1) return;
    CheckpointTestHooks hooks;
    hooks.before_shards = [](const std::string& shards) {
      if (!contains(shards, "checkpoint-00000010")) return;
      // A directory where rank 1's shard file goes: its rename fails.
      fs::create_directories(fs::path(shards) / gz::shard_file_name(1, 2) / "blocker");
    };
    t.checkpoints().set_test_hooks(hooks);
  };
  const auto start = std::chrono::steady_clock::now();
  auto res = run(2, c, -1, block_rank1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res.gz_errors[r]) << "rank " << r << ": " << res.errors[r];
    EXPECT_TRUE(contains(res.errors[r], "rank(s) 1")) << res.errors[r];
  }
  CheckpointManager manager((d.path / "checkpoints").string(), 3, "", true);
  auto listed = manager.list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].step, 5);
  for (auto& e : fs::directory_iterator(d.path / "checkpoints"))
    EXPECT_FALSE(contains(e.path().filename().string(), ".tmp-")) << "left behind: " << e.path();
  torch::serialize::InputArchive archive;
  EXPECT_NO_THROW(CheckpointManager::open(listed[0].dir, archive));
}

// A work_dir per node: with checkpoint_format auto a save that finds a rank unable to see the
// shard folder writes a consolidated checkpoint (and every later one), the run goes on; with
// sharded every rank fails naming the rank.
TEST(TrainerSharded, AutoFallsBackToConsolidatedWhenARankCannotSeeTheFolder) {
  TmpDir d("unseen");
  auto hide_from_rank1 = [](Trainer& t) {
    if (t.rank() != 1) return;
    CheckpointTestHooks hooks;
    hooks.shards_visible = [](const std::string&) { return false; };
    t.checkpoints().set_test_hooks(hooks);
  };
  auto c = config(d.path / "auto", 2);
  auto res = run(2, c, -1, hide_from_rank1);
  expect_ok(res);
  CheckpointManager manager((d.path / "auto" / "checkpoints").string(), 3, "", true);
  auto listed = manager.list();
  ASSERT_FALSE(listed.empty());
  for (auto& info : listed) {
    EXPECT_FALSE(info.sharded) << info.dir;
    EXPECT_FALSE(fs::exists(fs::path(info.dir) / "shards")) << info.dir;
    torch::serialize::InputArchive root, opt;
    CheckpointManager::open(info.dir, root);
    EXPECT_TRUE(root.try_read("optimizer", opt)) << info.dir << ": not consolidated";
  }
  for (auto& e : fs::directory_iterator(d.path / "auto" / "checkpoints"))
    EXPECT_FALSE(contains(e.path().filename().string(), ".tmp-")) << "left behind: " << e.path();
  auto s = config(d.path / "sharded", 2);
  s.checkpoint_format = "sharded";
  auto failed = run(2, s, -1, hide_from_rank1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(failed.gz_errors[r]) << "rank " << r << ": " << failed.errors[r];
    EXPECT_TRUE(contains(failed.errors[r], "not visible here")) << failed.errors[r];
  }
}

// Export: a 4-rank stage-2 sharded checkpoint as one consolidated file, in one process; it holds
// the whole optimizer state and resumes exactly as the sharded checkpoint does.
TEST(TrainerSharded, ExportConsolidatesAShardedCheckpoint) {
  TmpDir d("export");
  auto c = config(d.path / "job", 2);
  run(4, c, 7);  // checkpoint 5
  const std::string out = (d.path / "exported.pt").string();
  {
    auto ce = config(d.path / "export", 0);
    ce.mode = "single";
    ce.checkpoint_format = "consolidated";
    Trainer t(ce);
    torch::manual_seed(1234);
    t.set_model(std::make_shared<NetImpl>());
    t.export_checkpoint(ckpt(d.path / "job", 5), out);
    EXPECT_EQ(t.state().step, 5);
  }
  torch::serialize::InputArchive root, opt;
  root.load_from(out);
  EXPECT_TRUE(root.try_read("optimizer", opt));
  auto from_sharded = c, from_export = c;
  from_sharded.resume_from_checkpoint = ckpt(d.path / "job", 5);
  from_sharded.work_dir = (d.path / "a").string();
  from_export.resume_from_checkpoint = out;
  from_export.work_dir = (d.path / "b").string();
  auto a = run(2, from_sharded), b = run(2, from_export);
  expect_ok(a);
  expect_ok(b);
  EXPECT_EQ(b.start_step, 5);
  expect_same(a, b);
  // finetune from the sharded checkpoint starts from the exported weights.
  auto exported = std::make_shared<NetImpl>();
  torch::serialize::InputArchive model;
  ASSERT_TRUE(root.try_read("model", model));
  load_module_state(*exported, model, out);
  auto cf = config(d.path / "finetune", 0);
  cf.finetune = ckpt(d.path / "job", 5);
  std::vector<torch::Tensor> start;
  auto fine = run(1, cf, -1, [&](Trainer& t) {
    for (auto& p : t.model()->parameters()) start.push_back(p.detach().clone());
  });
  expect_ok(fine);
  ASSERT_EQ(start.size(), exported->parameters().size());
  for (size_t i = 0; i < start.size(); ++i) EXPECT_TRUE(torch::equal(start[i], exported->parameters()[i])) << i;
}

}  // namespace test_trainer_sharded
