#include <gtest/gtest.h>
#include <unistd.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "gz/train/checkpoint.h"
#include "gz/train/data_loader.h"
#include "gz/train/models/shard_units.h"
#include "gz/train/synthetic_dataset.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_trainer {

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

// A tiny classifier on [1, 4, 4] inputs; dropout makes a resume depend on the RNG state.
struct TinyNetImpl : ModelImpl, ShardUnits {
  explicit TinyNetImpl(double dropout = 0.2) : p(dropout) {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) override {
    // fc1 is a unit of its own at zero_stage 3 (fc2 stays with the root).
    x = torch::relu(gz::run_unit(*fc1, [&] { return fc1->forward(x.reshape({x.size(0), -1})); }));
    if (p > 0) x = torch::dropout(x, p, is_training());
    return fc2->forward(x);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> shard_units() const override { return {fc1.ptr()}; }
  std::shared_ptr<ModelImpl> clone_model() const override {
    auto c = std::make_shared<TinyNetImpl>(p);
    torch::NoGradGuard g;
    for (size_t i = 0; i < parameters().size(); ++i) c->parameters()[i].copy_(parameters()[i]);
    return c;
  }
  double p;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("gz_trainer_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

TrainConfig base_config(const fs::path& work_dir) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.train_data = "256";
  c.test_data = "129";
  c.input_size = 4;
  c.in_channels = 1;
  c.num_classes = 4;
  c.batch_size = 16;
  c.gradient_accumulation_steps = 2;
  c.num_epochs = 3;
  c.lr = 0.01;
  c.optimizer = "adamw";
  c.weight_decay = 0.01;
  c.scheduler.name = "cosine";
  c.scheduler.warmup_steps = 3;
  c.augment = false;  // 2-pixel shifts would wipe out 4x4 inputs; the resume test turns it on
  c.num_workers = 2;
  c.progress = false;
  c.log_every = 1000;
  c.num_threads = 1;
  c.work_dir = work_dir.string();
  c.seed = 3;
  return c;
}

std::vector<torch::Tensor> params_of(const ModelPtr& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << "param " << i << " max diff "
                                                         << (a[i] - b[i]).abs().max().item<float>();
}

// The same initial weights for every run of a test (the Trainer seeds the RNG only after).
std::shared_ptr<TinyNetImpl> make_net(double dropout = 0.2) {
  torch::manual_seed(1234);
  return std::make_shared<TinyNetImpl>(dropout);
}

std::vector<torch::Tensor> run_single(TrainConfig c, int64_t crash_at = -1, double dropout = 0.2) {
  Trainer t(c);
  t.set_model(make_net(dropout));
  if (crash_at > 0) t.set_crash_at_step(crash_at);
  t.train();
  return params_of(t.model());
}

}  // namespace

TEST(DataLoader, WorkersKeepOrder) {
  auto ds = std::make_shared<SyntheticDataset>(100, 3, std::vector<int64_t>{2, 3}, 5);
  std::vector<std::vector<size_t>> batches;
  for (size_t i = 0; i < 100; i += 7) {
    std::vector<size_t> b;
    for (size_t j = i; j < std::min<size_t>(i + 7, 100); ++j) b.push_back((j * 37) % 100);
    batches.push_back(b);
  }
  DataLoader inline_loader(ds, batches, 0), threaded(ds, batches, 3, nullptr, 2);
  size_t n = 0;
  while (auto a = inline_loader.next()) {
    auto b = threaded.next();
    ASSERT_TRUE(b);
    EXPECT_TRUE(torch::equal(a->input, b->input));
    EXPECT_TRUE(torch::equal(a->label, b->label));
    ++n;
  }
  EXPECT_EQ(n, batches.size());
  EXPECT_FALSE(threaded.next());
}

TEST(Trainer, SingleModeLearnsAndWritesOutputs) {
  TmpDir tmp("learn");
  auto c = base_config(tmp.path);
  Trainer t(c);
  t.set_model(make_net());
  auto m = t.train();
  EXPECT_EQ(t.state().step, 3 * 8);  // 256 samples / (16 x 2) per step, 3 epochs
  ASSERT_TRUE(m.count("test_accuracy"));
  EXPECT_GT(m.at("test_accuracy"), 0.8);  // separable blobs; chance is 0.25
  EXPECT_DOUBLE_EQ(m.at("test_samples"), 129);
  EXPECT_TRUE(fs::exists(tmp.path / "config.yaml"));
  EXPECT_TRUE(fs::exists(tmp.path / "history.jsonl"));
  EXPECT_FALSE(t.checkpoints().list().empty());
  EXPECT_EQ(t.checkpoints().latest()->step, 24);
  EXPECT_LE(t.checkpoints().list().size(), 3u);  // limit 2 (+ the best)
  EXPECT_NE(t.summary_line().find("final: test_accuracy="), std::string::npos);
  bool has_tb = false;
  for (auto& e : fs::directory_iterator(tmp.path / "tb"))
    has_tb |= e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_TRUE(has_tb);
}

TEST(Trainer, ResumeMidEpochMatchesUninterruptedRun) {
  TmpDir a("resume_a"), b("resume_b");
  auto ca = base_config(a.path), cb = base_config(b.path);
  ca.save_steps = cb.save_steps = 5;  // checkpoints at 5, 10, ... (mid-epoch: 8 steps per epoch)
  ca.augment = cb.augment = true;     // augmentation must be reproducible after a resume too
  auto uninterrupted = run_single(ca);
  EXPECT_THROW(run_single(cb, 13), gz::Aborted);  // dies after step 13; latest checkpoint: 10
  cb.resume_from_checkpoint = "auto";
  auto resumed = run_single(cb);
  expect_same(uninterrupted, resumed);
  // And resuming from an explicit directory. The same configuration as the uninterrupted run
  // (augmentation included), only another work_dir: a run that differs in anything else trains
  // on other data and cannot match it.
  TmpDir c("resume_c");
  auto cc = ca;
  cc.work_dir = c.path.string();
  EXPECT_THROW(run_single(cc, 7), gz::Aborted);
  cc.resume_from_checkpoint = (c.path / "checkpoints" / "checkpoint-00000005").string();
  expect_same(uninterrupted, run_single(cc));
}

TEST(Trainer, ResumeAutoWithoutCheckpointStartsFresh) {
  TmpDir a("fresh_a"), b("fresh_b");
  auto ca = base_config(a.path), cb = base_config(b.path);
  ca.num_epochs = cb.num_epochs = 1;
  cb.resume_from_checkpoint = "auto";
  expect_same(run_single(ca), run_single(cb));
}

TEST(Trainer, CorruptOrMismatchedCheckpointIsAClearError) {
  TmpDir a("corrupt");
  auto c = base_config(a.path);
  c.num_epochs = 1;
  run_single(c);
  auto dir = (a.path / "checkpoints" / "checkpoint-00000008").string();
  ASSERT_TRUE(fs::exists(dir));
  // A different model shape.
  {
    auto c2 = c;
    c2.resume_from_checkpoint = dir;
    Trainer t(c2);
    auto m = std::make_shared<TinyNetImpl>();
    m->fc2 = m->replace_module("fc2", torch::nn::Linear(32, 5));
    t.set_model(m);
    try {
      t.train();
      FAIL() << "no error";
    } catch (const gz::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(dir), std::string::npos) << msg;
      EXPECT_NE(msg.find("fc2.weight"), std::string::npos) << msg;
    }
  }
  // A truncated state file.
  fs::resize_file(dir + "/state.pt", fs::file_size(dir + "/state.pt") - 100);
  auto c3 = c;
  c3.resume_from_checkpoint = dir;
  try {
    run_single(c3);
    FAIL() << "no error";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/state.pt"), std::string::npos) << e.what();
  }
}

TEST(Trainer, EarlyStoppingStopsAfterPatience) {
  TmpDir a("early");
  auto c = base_config(a.path);
  c.eval_steps = 1;
  c.early_stopping_patience = 2;
  c.early_stopping_threshold = 10.0;  // no improvement can count: stop after 1 + 2 evaluations
  Trainer t(c);
  t.set_model(std::make_shared<TinyNetImpl>());
  t.train();
  EXPECT_EQ(t.state().step, 3);
  EXPECT_TRUE(t.state().should_stop);
  EXPECT_EQ(t.state().best_step, 1);
}

TEST(Trainer, Bf16LossCloseToFp32) {
  TmpDir a("fp32"), b("bf16");
  auto ca = base_config(a.path), cb = base_config(b.path);
  ca.num_epochs = cb.num_epochs = 1;
  cb.mixed_precision = "bf16";
  Trainer ta(ca), tb(cb);
  ta.set_model(make_net(0.0));
  tb.set_model(make_net(0.0));
  auto ma = ta.train(), mb = tb.train();
  EXPECT_NEAR(mb.at("test_loss"), ma.at("test_loss"), 0.05 * ma.at("test_loss") + 0.02);
  EXPECT_NEAR(tb.state().loss, ta.state().loss, 0.05 * ta.state().loss + 0.02);
  EXPECT_GT(mb.at("test_accuracy"), 0.7);
}

TEST(Trainer, Fp16OnCpuIsRefused) {
  TmpDir a("fp16");
  auto c = base_config(a.path);
  c.mixed_precision = "fp16";
  EXPECT_THROW(Trainer{c}, gz::InvalidArgument);
}

TEST(Trainer, DataParallelMatchesSingleProcess) {
  TmpDir a("dp_single"), b("dp");
  auto ca = base_config(a.path), cb = base_config(b.path);
  ca.num_epochs = cb.num_epochs = 1;
  cb.mode = "dp";
  cb.dp_replicas = 2;
  auto single = run_single(ca, -1, 0.0);
  auto dp = run_single(cb, -1, 0.0);
  ASSERT_EQ(single.size(), dp.size());
  for (size_t i = 0; i < single.size(); ++i) EXPECT_TRUE(torch::allclose(single[i], dp[i], 1e-4, 1e-5)) << i;
}

namespace {

// Two ranks as threads over the shm backend; returns rank 0's final parameters.
std::vector<torch::Tensor> run_two_ranks(const std::string& mode, TrainConfig c, int64_t crash_at,
                                         std::map<std::string, double>* metrics = nullptr) {
  std::vector<torch::Tensor> out;
  // Built here: the threads share the global RNG. No dropout for the same reason.
  std::vector<ModelPtr> nets{make_net(0.0), make_net(0.0)};
  gz::test::run_ranks(2, [&](int rank, std::shared_ptr<gz::Store> store) {
    gz::comm::ShmOptions so;
    so.timeout = std::chrono::seconds(20);
    auto group = gz::comm::create_shm_communicator(rank, 2, store, so);
    auto cfg = c;
    cfg.mode = mode;
    Trainer t(cfg, group);
    t.set_model(nets[rank]);
    if (crash_at > 0) t.set_crash_at_step(crash_at);
    auto m = t.train();
    t.gather_model();  // zero_stage 3: train() leaves the parameters sharded
    EXPECT_EQ(t.world_size(), 2);
    if (rank == 0) out = params_of(t.model());
    if (rank == 0 && metrics) *metrics = m;
  });
  return out;
}

}  // namespace

TEST(Trainer, DdpTwoRanksResumeMatchesUninterrupted) {
  TmpDir a("ddp_a"), b("ddp_b");
  auto ca = base_config(a.path), cb = base_config(b.path);
  ca.num_epochs = cb.num_epochs = 2;  // 4 steps per epoch with 2 ranks
  ca.save_steps = cb.save_steps = 3;
  auto uninterrupted = run_two_ranks("ddp", ca, -1);
  EXPECT_THROW(run_two_ranks("ddp", cb, 5), gz::Aborted);
  cb.resume_from_checkpoint = "auto";
  expect_same(uninterrupted, run_two_ranks("ddp", cb, -1));
}

TEST(Trainer, HorovodModeMatchesDdp) {
  TmpDir a("hvd_a"), b("hvd_b");
  auto ca = base_config(a.path), cb = base_config(b.path);
  ca.num_epochs = cb.num_epochs = 1;
  auto ddp = run_two_ranks("ddp", ca, -1);
  auto hvd = run_two_ranks("horovod", cb, -1);
  ASSERT_EQ(ddp.size(), hvd.size());
  for (size_t i = 0; i < ddp.size(); ++i) EXPECT_TRUE(torch::allclose(ddp[i], hvd[i], 1e-5, 1e-6)) << i;
}

namespace {

// Records the step training starts from (after any resume).
struct StartStep : Callback {
  int64_t step = -1;
  void on_train_begin(Trainer& t) override { step = t.state().step; }
};

// What one rank of run_ranks_catching saw.
struct RankResult {
  std::vector<torch::Tensor> params;
  int64_t start_step = -1;
  std::string error;  // empty: train() returned
  bool gz_error = false;
  double seconds = 0;
};

// Two ranks (threads, shm backend, `timeout` per op) with a config each (e.g. a work_dir per rank,
// like local disks per node); every rank's outcome is recorded instead of rethrown.
std::vector<RankResult> run_ranks_catching(const std::string& mode, std::vector<TrainConfig> configs,
                                           std::chrono::seconds timeout, int64_t crash_at = -1) {
  const int world = static_cast<int>(configs.size());
  std::vector<RankResult> out(static_cast<size_t>(world));
  std::vector<ModelPtr> nets;
  for (int r = 0; r < world; ++r) nets.push_back(make_net(0.0));
  gz::test::run_ranks(world, [&](int rank, std::shared_ptr<gz::Store> store) {
    auto& res = out[static_cast<size_t>(rank)];
    auto start = std::chrono::steady_clock::now();
    try {
      gz::comm::ShmOptions so;
      so.timeout = timeout;
      auto group = gz::comm::create_shm_communicator(rank, world, store, so);
      auto cfg = configs[static_cast<size_t>(rank)];
      cfg.mode = mode;
      Trainer t(cfg, group);
      t.set_model(nets[static_cast<size_t>(rank)]);
      auto rec = std::make_shared<StartStep>();
      t.add_callback(rec);
      if (crash_at > 0) t.set_crash_at_step(crash_at);
      try {
        t.train();
      } catch (...) {
        res.start_step = rec->step;
        throw;
      }
      res.start_step = rec->step;
      res.params = params_of(t.model());
    } catch (const gz::Error& e) {
      res.error = e.what();
      res.gz_error = true;
    } catch (const std::exception& e) {
      res.error = e.what();
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  return out;
}

void copy_checkpoints(const fs::path& from_work_dir, const fs::path& to_work_dir) {
  fs::create_directories(to_work_dir);
  fs::copy(from_work_dir / "checkpoints", to_work_dir / "checkpoints", fs::copy_options::recursive);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Trainer, AutoResumeUsesRankZerosStepWhateverOtherRanksList) {
  // Rank 0's folder (a crashed run) ends at step 6; rank 1's node has a stale folder of a finished
  // run that also holds step 8. Both must resume at 6: rank 1 resuming at 8 would leave rank 0
  // alone in the next all-reduce.
  TmpDir a("list_a"), w0("list_r0"), w1("list_r1");
  auto c = base_config(a.path);
  c.num_epochs = 2;  // 4 steps per epoch with 2 ranks
  c.save_steps = 3;
  c.save_total_limit = 5;
  const auto timeout = std::chrono::seconds(10);
  auto uninterrupted = run_ranks_catching("ddp", {c, c}, timeout);
  ASSERT_EQ(uninterrupted[0].error, "");
  auto c0 = c, c1 = c;
  c0.work_dir = w0.path.string();
  EXPECT_NE(run_ranks_catching("ddp", {c0, c0}, timeout, 7)[0].error, "");  // crash after step 7
  ASSERT_TRUE(fs::exists(w0.path / "checkpoints" / "checkpoint-00000006"));
  ASSERT_FALSE(fs::exists(w0.path / "checkpoints" / "checkpoint-00000008"));
  fs::remove_all(w1.path);
  copy_checkpoints(a.path, w1.path);  // steps 3, 6, 8
  c0.resume_from_checkpoint = c1.resume_from_checkpoint = "auto";
  c1.work_dir = w1.path.string();
  auto resumed = run_ranks_catching("ddp", {c0, c1}, timeout);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(resumed[r].error, "") << "rank " << r;
    EXPECT_EQ(resumed[r].start_step, 6) << "rank " << r;
  }
  expect_same(uninterrupted[0].params, resumed[0].params);
  expect_same(uninterrupted[0].params, resumed[1].params);
}

TEST(Trainer, AutoResumeStepMissingOnARankFailsOnEveryRank) {
  TmpDir w0("miss_r0"), w1("miss_r1");
  auto c0 = base_config(w0.path);
  c0.num_epochs = 2;
  c0.save_steps = 3;
  const auto timeout = std::chrono::seconds(10);
  run_ranks_catching("ddp", {c0, c0}, timeout, 7);  // crash after 7: checkpoints 3 and 6
  fs::remove_all(w1.path);
  copy_checkpoints(w0.path, w1.path);
  fs::remove_all(w1.path / "checkpoints" / "checkpoint-00000006");  // rank 1's node lags behind
  auto c1 = c0;
  c1.work_dir = w1.path.string();
  c0.resume_from_checkpoint = c1.resume_from_checkpoint = "auto";
  auto res = run_ranks_catching("ddp", {c0, c1}, timeout);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res[r].gz_error) << "rank " << r << ": " << res[r].error;
    EXPECT_TRUE(contains(res[r].error, "step 6")) << res[r].error;
    EXPECT_TRUE(contains(res[r].error, "not in")) << res[r].error;  // rank 1's reason, on both
    EXPECT_LT(res[r].seconds, 5.0) << "rank " << r << " waited for a timeout";
  }
  EXPECT_TRUE(contains(res[0].error, "rank(s) 1")) << res[0].error;
}

TEST(Trainer, RankZeroSaveFailureIsAClearErrorOnEveryRank) {
  TmpDir w("savefail");
  auto c = base_config(w.path);
  c.save_steps = 2;
  c.async_checkpoint = false;  // the save on the training thread (AsyncCheckpoint.*: in the background)
  // checkpoints/ is a file: rank 0 cannot create the checkpoint folder.
  std::ofstream(w.path / "checkpoints") << "not a folder";
  auto res = run_ranks_catching("ddp", {c, c}, std::chrono::seconds(10));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res[r].gz_error) << "rank " << r << ": " << res[r].error;
    EXPECT_TRUE(contains(res[r].error, (w.path / "checkpoints").string())) << res[r].error;  // rank 0's reason
    EXPECT_LT(res[r].seconds, 5.0) << "rank " << r << " waited for a timeout";
  }
  EXPECT_TRUE(contains(res[1].error, "rank(s) 0")) << res[1].error;
  EXPECT_TRUE(contains(res[1].error, "saving the checkpoint of step 2")) << res[1].error;
}

TEST(Trainer, AutoResumeFallsBackFromATruncatedNewestCheckpoint) {
  TmpDir a("trunc_a"), b("trunc_b");
  auto ca = base_config(a.path), cb = base_config(b.path);
  ca.save_steps = cb.save_steps = 5;
  auto uninterrupted = run_single(ca);
  EXPECT_THROW(run_single(cb, 13), gz::Aborted);  // checkpoints at 5 and 10
  const auto newest = (b.path / "checkpoints" / "checkpoint-00000010").string();
  fs::resize_file(newest + "/state.pt", fs::file_size(newest + "/state.pt") / 2);
  cb.resume_from_checkpoint = "auto";
  Trainer t(cb);
  t.set_model(make_net());
  auto rec = std::make_shared<StartStep>();
  t.add_callback(rec);
  testing::internal::CaptureStderr();
  try {
    t.train();
  } catch (...) {
    testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rec->step, 5);
  EXPECT_TRUE(contains(log, newest)) << log;
  EXPECT_TRUE(contains(log, "truncated")) << log;
  EXPECT_TRUE(contains(log, "falling back")) << log;
  expect_same(uninterrupted, params_of(t.model()));  // resuming from 5 is exact too
}

// zero_stage 1 and 2 train like plain DDP (with clipping), resume exactly from their own
// checkpoints (saved unsharded, reloaded at another stage), and a single process resumes from them.
TEST(Trainer, ZeroStagesMatchDdpAndResumeAnywhere) {
  TmpDir a("zero_a"), b("zero_b"), c("zero_c");
  auto ca = base_config(a.path), cb = base_config(b.path), cc = base_config(c.path);
  for (auto* x : {&ca, &cb, &cc}) {
    x->num_epochs = 2;  // 4 steps per epoch with 2 ranks
    x->save_steps = 3;
    x->max_grad_norm = 0.5;
  }
  auto ddp = run_two_ranks("ddp", ca, -1);
  cb.zero_stage = 2;
  auto zero = run_two_ranks("ddp", cb, -1);
  ASSERT_EQ(ddp.size(), zero.size());
  for (size_t i = 0; i < ddp.size(); ++i) EXPECT_TRUE(torch::allclose(ddp[i], zero[i], 1e-5, 1e-6)) << i;
  cc.zero_stage = 1;
  EXPECT_THROW(run_two_ranks("ddp", cc, 5), gz::Aborted);  // checkpoint at step 3
  cc.zero_stage = 2;
  cc.resume_from_checkpoint = "auto";
  expect_same(zero, run_two_ranks("ddp", cc, -1));
  // A checkpoint of the ZeRO run in a single process with plain AdamW: the optimizer state loads.
  auto cd = base_config(c.path);
  cd.resume_from_checkpoint = (c.path / "checkpoints" / "checkpoint-00000006").string();
  cd.work_dir = (c.path / "single").string();
  Trainer t(cd);
  t.set_model(make_net(0.0));
  auto rec = std::make_shared<StartStep>();
  t.add_callback(rec);
  t.train();
  EXPECT_EQ(rec->step, 6);
  EXPECT_GT(t.state().step, 6);
}

// Stage 3 (fully sharded, fc1 a unit of its own) trains as DDP does, with accumulation and
// clipping; its checkpoints (whole model, unsharded optimizer state) resume it after a crash and
// load at stage 2.
TEST(Trainer, ZeroStage3MatchesDdpAndResumes) {
  TmpDir a("z3_a"), b("z3_b"), c("z3_c");
  auto ca = base_config(a.path), cb = base_config(b.path), cc = base_config(c.path);
  for (auto* x : {&ca, &cb, &cc}) {
    x->num_epochs = 2;  // 4 steps per epoch with 2 ranks
    x->save_steps = 3;
    x->max_grad_norm = 0.5;
  }
  std::map<std::string, double> ddp_metrics, z3_metrics;
  auto ddp = run_two_ranks("ddp", ca, -1, &ddp_metrics);
  cb.zero_stage = 3;
  cb.eval_batch_size = 16;  // 65 and 64 test samples: rank 0 evaluates one batch more (collective)
  auto z3 = run_two_ranks("ddp", cb, -1, &z3_metrics);
  // The padding batch (rank 1's extra forward) counts nowhere: the final evaluation equals DDP's.
  EXPECT_EQ(z3_metrics.at("test_samples"), ddp_metrics.at("test_samples"));
  EXPECT_NEAR(z3_metrics.at("test_loss"), ddp_metrics.at("test_loss"), 1e-5);
  EXPECT_EQ(z3_metrics.at("test_accuracy"), ddp_metrics.at("test_accuracy"));
  ASSERT_EQ(ddp.size(), z3.size());
  for (size_t i = 0; i < ddp.size(); ++i) EXPECT_TRUE(torch::allclose(ddp[i], z3[i], 1e-5, 1e-6)) << i;
  cc.zero_stage = 3;
  EXPECT_THROW(run_two_ranks("ddp", cc, 5), gz::Aborted);  // checkpoint at step 3
  cc.resume_from_checkpoint = "auto";
  expect_same(z3, run_two_ranks("ddp", cc, -1));
  cc.zero_stage = 2;  // the stage-3 checkpoint of step 6 at stage 2: the same state
  cc.resume_from_checkpoint = (c.path / "checkpoints" / "checkpoint-00000006").string();
  auto z2 = run_two_ranks("ddp", cc, -1);
  ASSERT_EQ(z2.size(), z3.size());
  for (size_t i = 0; i < z3.size(); ++i) EXPECT_TRUE(torch::allclose(z2[i], z3[i], 1e-5, 1e-6)) << i;
}

// zero_stage 3 takes compression fp16/bf16 as its reduce dtype: the gradients are reduce-scattered
// in bf16 as DDP's bf16 hook all-reduces them (at two ranks one addition per element: the same
// values); the other methods are refused with the config (Config.ZeroStageNeedsDdp).
TEST(Trainer, ZeroStage3ReducesInBf16AsDdpsHook) {
  TmpDir a("z3bf_a"), b("z3bf_b"), c("z3bf_c");
  auto ca = base_config(a.path), cb = base_config(b.path), cc = base_config(c.path);
  for (auto* x : {&ca, &cb}) x->compression.method = "bf16";
  cb.zero_stage = cc.zero_stage = 3;
  const auto ddp = run_two_ranks("ddp", ca, -1), z3 = run_two_ranks("ddp", cb, -1),
             fp32 = run_two_ranks("ddp", cc, -1);
  ASSERT_EQ(ddp.size(), z3.size());
  double from_ddp = 0, from_fp32 = 0;
  for (size_t i = 0; i < ddp.size(); ++i) {
    from_ddp = std::max(from_ddp, (z3[i] - ddp[i]).abs().max().item<double>());
    from_fp32 = std::max(from_fp32, (z3[i] - fp32[i]).abs().max().item<double>());
  }
  EXPECT_LE(from_ddp, 1e-6) << "stage 3 with bf16 reduce-scatters vs DDP with the bf16 hook";
  EXPECT_GT(from_fp32, 1e-5) << "stage 3 with compression bf16 trained as with fp32 reduce-scatters";
}

namespace {
// Counts the step ends at which ZeRO's parameter all-gathers were still unwaited.
struct ZeroGatherProbe : Callback {
  int unwaited = 0;
  void on_step_end(Trainer& t) override {
    auto* z = dynamic_cast<gz::ZeroRedundancyOptimizer*>(&t.optimizer());
    if (z && z->gathers_pending()) ++unwaited;
  }
};
}  // namespace

// ZeRO all-gathers the stepped parameters asynchronously. The trainer waits for them before
// anything reads the parameters: the callbacks (pruning takes its masks from them, so ranks that
// read half-gathered weights prune differently), evaluate() (with or without a test set) and the
// caller of train(). No test set here: train() ends with an evaluate() that has nothing to test.
// (Before, the step's loss all-reduce happened to wait for the all-gathers, so the masks agreed;
// nothing guaranteed it, and callbacks and the caller of train() still found them unwaited.)
TEST(Trainer, ZeroParametersAreWholeForCallbacksAndAfterTrain) {
  TmpDir dir("zero_whole");
  auto c = base_config(dir.path);
  c.num_epochs = 1;  // 4 steps with 2 ranks
  c.zero_stage = 2;
  std::vector<ModelPtr> nets{make_net(0.0), make_net(0.0)};
  std::vector<std::vector<torch::Tensor>> params(2);
  std::vector<int> unwaited(2, -1), pending_after(2, -1);
  gz::test::run_ranks(2, [&](int rank, std::shared_ptr<gz::Store> store) {
    gz::comm::ShmOptions so;
    so.timeout = std::chrono::seconds(20);
    auto cfg = c;
    cfg.mode = "ddp";
    Trainer t(cfg, gz::comm::create_shm_communicator(rank, 2, store, so));
    t.set_model(nets[rank]);
    t.set_datasets(std::make_shared<SyntheticDataset>(256, 4, std::vector<int64_t>{1, 4, 4}, 3), nullptr);
    // Pruning and the probe only: the built-in checkpoint callback's final save would wait for the
    // all-gathers itself.
    t.set_default_callbacks(false);
    t.add_callback(std::make_shared<PruningCallback>(0.5));
    auto probe = std::make_shared<ZeroGatherProbe>();
    t.add_callback(probe);
    t.train();
    unwaited[rank] = probe->unwaited;
    pending_after[rank] = dynamic_cast<gz::ZeroRedundancyOptimizer&>(t.optimizer()).gathers_pending();
    params[rank] = params_of(t.model());
  });
  EXPECT_EQ(unwaited, (std::vector<int>{0, 0}))
      << "callbacks ran while all-gathers still wrote the parameters";
  EXPECT_EQ(pending_after, (std::vector<int>{0, 0})) << "train() returned with all-gathers unwaited";
  // Same masks everywhere: the same zeros, the same parameters.
  int64_t zeros = 0;
  for (size_t i = 0; i < params[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(params[0][i], params[1][i])) << "param " << i << " differs between the ranks";
    if (params[0][i].dim() >= 2) zeros += params[0][i].eq(0).sum().item<int64_t>();
  }
  EXPECT_GT(zeros, 0) << "nothing was pruned";
}

}  // namespace test_trainer
