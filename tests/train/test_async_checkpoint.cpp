// Disk checkpoints written in the background (async_checkpoint): the same files and the same
// training as synchronous saves, a failed write reported, the last write on disk when train()
// returns. One process (mode single), a small net: each test runs in well under a second.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "../../src/torch/torch_compat.h"  // the optimizer's state of a parameter
#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/train/callback.h"
#include "gz/train/checkpoint.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"
#include "support/tiny_net.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_async_checkpoint {

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

using NetImpl = gz::test::TinyNetImpl;

struct TmpDir {
  fs::path path = fs::temp_directory_path() / ("gz_async_ckpt_" + std::to_string(::getpid()));
  TmpDir() { fs::remove_all(path); }
  ~TmpDir() { fs::remove_all(path); }
};

TrainConfig config(const fs::path& work, bool async) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.train_data = "96";  // 12 steps per epoch of 8
  c.test_data = "16";
  c.input_size = 4;
  c.in_channels = 1;
  c.num_classes = 4;
  c.batch_size = 8;
  c.max_steps = 6;
  c.lr = 0.01;
  c.optimizer = "adamw";
  c.save_steps = 2;  // saves at steps 2, 4, 6: each but the first waits for the last write
  c.save_total_limit = 10;
  c.num_workers = 0;
  c.progress = false;
  c.tensorboard = false;
  c.log_every = 1000;
  c.num_threads = 1;
  c.seed = 5;
  c.work_dir = work.string();
  c.async_checkpoint = async;
  return c;
}

// Installs the checkpoint test hooks once train() has made the CheckpointManager. Changes no
// training state: the Trainer does not wait for a background copy before its hooks, so only
// the waits of the training loop itself are tested.
struct Hooks : Callback {
  explicit Hooks(CheckpointTestHooks h) : hooks(std::move(h)) {}
  void on_train_begin(Trainer& t) override { t.checkpoints().set_test_hooks(hooks); }
  bool changes_training_state() const override { return false; }
  CheckpointTestHooks hooks;
};

// After every step (after ModelCheckpoint's save: user callbacks come last), scales the
// parameters, as a user's weight clipping or pruning would.
struct ScaleParameters : Callback {
  void on_step_end(Trainer& t) override {
    torch::NoGradGuard no_grad;
    for (auto& p : t.model()->parameters()) p.mul_(0.9);
  }
};

// Trains `c` from the same initial net every time; returns the final parameters.
std::vector<torch::Tensor> train(const TrainConfig& c, CheckpointTestHooks hooks = {},
                                 int64_t* step_at_throw = nullptr, CallbackPtr extra = nullptr) {
  torch::manual_seed(99);
  auto net = std::make_shared<NetImpl>();
  Trainer t(c);
  t.set_model(net);
  t.add_callback(std::make_shared<Hooks>(std::move(hooks)));
  if (extra) t.add_callback(extra);
  try {
    t.train();
  } catch (...) {
    if (step_at_throw) *step_at_throw = t.state().step;
    throw;
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Bit-equal values, NaN equal to NaN (best_metric before the first evaluation).
bool same(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (!a.is_floating_point()) return torch::equal(a, b);
  return torch::allclose(a, b, /*rtol=*/0, /*atol=*/0, /*equal_nan=*/true);
}

// Every tensor and value of an archive under its path, the optimizer's left out (its keys are
// the parameters' addresses: optimizer_tensors() compares it).
void flatten(torch::serialize::InputArchive& archive, const std::string& prefix,
             std::map<std::string, torch::Tensor>& tensors, std::map<std::string, std::string>& values) {
  for (const auto& key : archive.keys()) {
    const std::string path = prefix + key;
    torch::Tensor t;
    torch::serialize::InputArchive sub;
    c10::IValue v;
    if (path == "optimizer") continue;
    if (archive.try_read(key, t)) {
      tensors[path] = t;
    } else if (archive.try_read(key, sub)) {
      flatten(sub, path + "/", tensors, values);
    } else if (archive.try_read(key, v)) {
      std::ostringstream os;
      os << v;
      values[path] = os.str();
    }
  }
}

// The optimizer state of the checkpoint loaded into an AdamW over a fresh net, in parameter order.
std::vector<torch::Tensor> optimizer_tensors(torch::serialize::InputArchive& root) {
  NetImpl net;
  torch::optim::AdamW opt(net.parameters());
  torch::serialize::InputArchive archive;
  EXPECT_TRUE(root.try_read("optimizer", archive));
  opt.load(archive);
  std::vector<torch::Tensor> out;
  for (auto& p : net.parameters()) {
    auto* st = dynamic_cast<torch::optim::AdamWParamState*>(gz::torch_compat::param_state(opt, p));
    if (!st) {
      ADD_FAILURE() << "no optimizer state for a parameter";
      continue;
    }
    out.push_back(torch::tensor({static_cast<int64_t>(st->step())}));
    out.push_back(st->exp_avg());
    out.push_back(st->exp_avg_sq());
  }
  return out;
}

void expect_same_checkpoint(const std::string& want_dir, const std::string& got_dir) {
  torch::serialize::InputArchive want, got;
  const CheckpointInfo wi = CheckpointManager::open(want_dir, want);
  const CheckpointInfo gi = CheckpointManager::open(got_dir, got);
  EXPECT_EQ(gi.step, wi.step);
  EXPECT_EQ(gi.epoch, wi.epoch);
  EXPECT_EQ(gi.metrics, wi.metrics);
  std::map<std::string, torch::Tensor> wt, gt;
  std::map<std::string, std::string> wv, gv;
  flatten(want, "", wt, wv);
  flatten(got, "", gt, gv);
  EXPECT_EQ(gv, wv);
  ASSERT_EQ(gt.size(), wt.size());
  for (const char* key : {"counters", "rng_cpu", "model/fc1__weight", "scaler/scale"})
    EXPECT_TRUE(wt.count(key) || wv.count(key)) << key << " not compared";
  for (auto& [key, tensor] : wt) {
    ASSERT_TRUE(gt.count(key)) << key;
    EXPECT_TRUE(same(gt[key], tensor)) << got_dir << ": " << key << " differs";
  }
  const auto wo = optimizer_tensors(want), go = optimizer_tensors(got);
  ASSERT_EQ(go.size(), wo.size());
  EXPECT_FALSE(wo.empty());
  for (size_t i = 0; i < wo.size(); ++i)
    EXPECT_TRUE(torch::equal(go[i], wo[i])) << got_dir << ": optimizer tensor " << i << " differs";
}

bool has_temp_dirs(const fs::path& root) {
  for (auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
  return false;
}

// Slows every background write down, so the training goes on while it runs.
CheckpointTestHooks slow_writes(int ms) {
  CheckpointTestHooks h;
  h.in_background_write = [ms](const std::string&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
  return h;
}

// dir/async's checkpoints of steps 2, 4 and 6 equal dir/sync's, and no temp dir is left.
void expect_same_checkpoints(const fs::path& dir) {
  CheckpointManager want((dir / "sync" / "checkpoints").string(), 10, "", true);
  CheckpointManager got((dir / "async" / "checkpoints").string(), 10, "", true);
  ASSERT_EQ(got.list().size(), 3u);
  for (int64_t step : {2, 4, 6}) {
    SCOPED_TRACE("step " + std::to_string(step));
    expect_same_checkpoint(want.path_of(step), got.path_of(step));
  }
  EXPECT_FALSE(has_temp_dirs(got.root()));
}

// Slows every copy of the live state down (its thread sleeps before copying), so the next
// step's forward and backward end before it.
CheckpointTestHooks slow_copies(int ms) {
  CheckpointTestHooks h;
  h.in_state_copy = [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  return h;
}

// Sync and async (with `hooks`) training of `c` give the same final parameters and the same
// checkpoints at steps 2, 4 and 6.
void expect_async_equals_sync(const TrainConfig& c, const fs::path& dir, CheckpointTestHooks hooks,
                              const std::function<CallbackPtr()>& extra = {}) {
  TrainConfig sync_config = c, async_config = c;
  sync_config.work_dir = (dir / "sync").string();
  sync_config.async_checkpoint = false;
  async_config.work_dir = (dir / "async").string();
  async_config.async_checkpoint = true;
  const auto sync = train(sync_config, {}, nullptr, extra ? extra() : nullptr);
  const auto async = train(async_config, std::move(hooks), nullptr, extra ? extra() : nullptr);
  ASSERT_EQ(async.size(), sync.size());
  for (size_t i = 0; i < sync.size(); ++i)
    EXPECT_TRUE(torch::equal(async[i], sync[i])) << "final parameter " << i << " differs";
  expect_same_checkpoints(dir);
}

// The background write of `name` fails.
CheckpointTestHooks failing_write(const std::string& name) {
  CheckpointTestHooks h;
  h.in_background_write = [name](const std::string& dir) {
    if (fs::path(dir).filename() == name) GZ_THROW(gz::Error, "disk full (test)");
  };
  return h;
}

}  // namespace

// Each background write is held up while two more steps run, so a write that read the live
// state (not its copy) would write a later state. Mutation check: building the archive from the
// live state in CheckpointWriter::write() fails every file's comparison; not copying the
// optimizer state (capture_optimizer() skipped) fails the optimizer's.
TEST(AsyncCheckpoint, FilesAndTrainingEqualSynchronousSaves) {
  TmpDir tmp;
  expect_async_equals_sync(config(tmp.path, true), tmp.path, slow_writes(40));
}

// The copy of the parameters and optimizer state runs alongside the next step's forward and
// backward; held up past them, the optimizer step must wait for it, or the checkpoint would
// hold the next step's values. Mutation check: no finish_state_copies() in train_step() fails
// the comparison of every checkpoint (parameters and optimizer state).
TEST(AsyncCheckpoint, TheNextUpdateWaitsForASlowCopy) {
  TmpDir tmp;
  // And the copy does run on another thread: a save that copied on the training thread would pass
  // the comparison too.
  const auto training_thread = std::this_thread::get_id();
  std::atomic<int> copies{0}, on_training_thread{0};
  CheckpointTestHooks hooks = slow_copies(150);
  hooks.in_state_copy = [&, slow = hooks.in_state_copy] {
    ++copies;
    if (std::this_thread::get_id() == training_thread) ++on_training_thread;
    slow();
  };
  expect_async_equals_sync(config(tmp.path, true), tmp.path, hooks);
  EXPECT_EQ(copies.load(), 3) << "not every save's copy was deferred";
  EXPECT_EQ(on_training_thread.load(), 0);
}

// With local SGD, train()'s last evaluation averages the replicas into the parameters, right
// after the last step's save: it waits for that save's copy. Two ranks (ddp, threads over shm),
// averaging every 4 steps, so the replicas differ at step 6. Mutation check: no
// finish_state_copies() in evaluate() fails the comparison of step 6's checkpoint.
TEST(AsyncCheckpoint, TheLastEvaluationsAveragingWaitsForTheCopy) {
  TmpDir tmp;
  auto run = [&](const std::string& name, bool async, CheckpointTestHooks hooks) {
    TrainConfig c = config(tmp.path / name, async);
    c.mode = "ddp";
    c.batch_size = 4;  // the same global batch of 8
    c.averaging.method = "local_sgd";
    c.averaging.period = 4;
    std::vector<ModelPtr> nets;  // built here: the global generator is shared by the threads
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(99);
      nets.push_back(std::make_shared<NetImpl>());
    }
    gz::test::run_ranks(2, [&](int rank, std::shared_ptr<gz::Store> store) {
      gz::comm::ShmOptions so;
      so.timeout = std::chrono::seconds(30);
      Trainer t(c, gz::comm::create_shm_communicator(rank, 2, store, so));
      t.set_model(nets[static_cast<size_t>(rank)]);
      t.add_callback(std::make_shared<Hooks>(hooks));
      t.train();
    });
  };
  run("sync", false, {});
  run("async", true, slow_copies(150));
  expect_same_checkpoints(tmp.path);
}

// A user callback that changes the parameters right after the save runs only once the copy is
// done. Mutation check: for_each_callback() not waiting before such a callback fails the
// comparison of the parameters.
TEST(AsyncCheckpoint, ACallbackChangingTheModelWaitsForTheCopy) {
  TmpDir tmp;
  expect_async_equals_sync(config(tmp.path, true), tmp.path, slow_copies(150),
                           [] { return std::make_shared<ScaleParameters>(); });
}

// The failure tests' parts (one ctest: each ctest is a process that loads LibTorch, ~1 s).
namespace failures {

// A failed background write throws, on the next save, an error naming its checkpoint.
void reported_at_the_next_save(const fs::path& dir) {
  int64_t step = -1;
  try {
    train(config(dir, true), failing_write("checkpoint-00000002"), &step);
    FAIL() << "the failed write was not reported";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint-00000002 in the background failed: disk full (test)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(step, 4) << "not reported by the next save";
}

// The last checkpoint's write fails after the last step: train() throws.
void reported_when_training_ends(const fs::path& dir) {
  TrainConfig c = config(dir, true);
  c.save_steps = 0;  // one save, at the end (the epoch is not over after 6 steps)
  try {
    train(c, failing_write("checkpoint-00000006"));
    FAIL() << "the failed last write was not reported";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint-00000006"), std::string::npos) << e.what();
  }
}

// Two ranks (ddp, threads over shm): rank 0's failed write makes both ranks throw at the next
// save, rank 1 quoting rank 0's error; neither waits for a collective the other skips.
void every_rank_stops(const fs::path& dir) {
  TrainConfig c = config(dir, true);
  c.mode = "ddp";
  c.batch_size = 4;            // the same global batch of 8
  std::vector<ModelPtr> nets;  // built here: the global generator is shared by the threads
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(99);
    nets.push_back(std::make_shared<NetImpl>());
  }
  std::vector<std::string> errors(2);
  gz::test::run_ranks(2, [&](int rank, std::shared_ptr<gz::Store> store) {
    gz::comm::ShmOptions so;
    so.timeout = std::chrono::seconds(30);
    Trainer t(c, gz::comm::create_shm_communicator(rank, 2, store, so));
    t.set_model(nets[static_cast<size_t>(rank)]);
    t.add_callback(std::make_shared<Hooks>(failing_write("checkpoint-00000002")));
    try {
      t.train();
    } catch (const gz::Error& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[static_cast<size_t>(r)].find("checkpoint-00000002 in the background failed"),
              std::string::npos)
        << "rank " << r << ": '" << errors[static_cast<size_t>(r)] << "'";
}

}  // namespace failures

// A failed background write is reported: at the next save, or when training ends for the last
// one, on every rank. Mutation checks: CheckpointWriter::wait() not rethrowing the failure fails
// all three parts; finish_checkpoint_writes() dropping the writer's error fails the second.
TEST(AsyncCheckpoint, AFailedWriteIsReportedAtTheNextSaveOrTheEnd) {
  TmpDir tmp;
  {
    SCOPED_TRACE("at the next save");
    failures::reported_at_the_next_save(tmp.path / "next");
  }
  {
    SCOPED_TRACE("when training ends");
    failures::reported_when_training_ends(tmp.path / "end");
  }
  SCOPED_TRACE("2 ranks");
  failures::every_rank_stops(tmp.path / "ranks");
}

// train() returns once the last checkpoint is on disk, although its write takes longer than the
// final evaluation. Mutation check: leaving out finish_checkpoint_writes() in train() fails it
// (the checkpoint appears only when the Trainer is destroyed).
TEST(AsyncCheckpoint, TheLastWriteIsOnDiskWhenTrainReturns) {
  TmpDir tmp;
  TrainConfig c = config(tmp.path, true);
  c.save_steps = 0;
  torch::manual_seed(99);
  Trainer t(c);
  t.set_model(std::make_shared<NetImpl>());
  t.add_callback(std::make_shared<Hooks>(slow_writes(200)));
  t.train();
  const std::string dir = t.checkpoints().path_of(6);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "manifest.json")) << dir << " not written when train() returned";
  ASSERT_TRUE(t.checkpoints().latest().has_value());
  EXPECT_EQ(t.checkpoints().latest()->step, 6);
  EXPECT_FALSE(has_temp_dirs(t.checkpoints().root()));
}

// A caller's save_checkpoint() outside train() is on disk when it returns: nothing after it would
// wait for a background write or report its failure. Mutation check: writing in the background
// outside train() too (the in_train test in why_not_async() left out) fails it.
TEST(AsyncCheckpoint, ASaveOutsideTrainIsOnDiskWhenItReturns) {
  TmpDir tmp;
  TrainConfig c = config(tmp.path, true);
  c.save_checkpoints = false;
  torch::manual_seed(99);
  Trainer t(c);
  t.set_model(std::make_shared<NetImpl>());
  t.add_callback(std::make_shared<Hooks>(slow_writes(200)));
  t.train();
  const std::string dir = t.save_checkpoint();
  EXPECT_TRUE(fs::exists(fs::path(dir) / "manifest.json"))
      << dir << " not written when save_checkpoint() returned";
}

}  // namespace test_async_checkpoint
