// The Trainer's in-memory snapshots (threads over shm): a crashed run restarts from the snapshot
// of its last step, bit for bit, whether a rank's node still holds it or a peer sends it; a
// snapshot of another config is refused and the disk checkpoint used.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "../../src/torch/torch_compat.h"  // the optimizer's state of a parameter
#include "gz/comm/shm.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/train/callback.h"
#include "gz/train/checkpoint.h"
#include "gz/train/recovery/snapshot_store.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"
#include "support/tiny_net.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_trainer_snapshot {

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

using NetImpl = gz::test::TinyNetImpl;

// Everything a rank continues from, copied.
struct Captured {
  int64_t step = -1, epoch_samples = -1;
  std::vector<torch::Tensor> tensors;    // parameters, then buffers
  std::vector<torch::Tensor> optimizer;  // every parameter's optimizer state tensors
  std::vector<double> lrs;
};

Captured capture(Trainer& t) {
  Captured c;
  c.step = t.state().step;
  c.epoch_samples = t.state().epoch_samples;
  for (auto& p : t.model()->parameters()) c.tensors.push_back(p.detach().clone());
  for (auto& b : t.model()->buffers()) c.tensors.push_back(b.detach().clone());
  // Each parameter's optimizer state tensors in parameter order (the optimizer's own archive
  // names the states by tensor addresses, which differ between two Trainers), and each lr.
  auto& opt = t.optimizer();
  for (auto& group : opt.param_groups()) {
    c.lrs.push_back(group.options().get_lr());
    for (auto& p : group.params()) {
      auto* st = gz::torch_compat::param_state(opt, p);
      if (!st) continue;
      std::string bytes;
      torch::serialize::OutputArchive a;
      st->serialize(a);
      a.save_to([&bytes](const void* data, size_t n) {
        bytes.append(static_cast<const char*>(data), n);
        return n;
      });
      torch::serialize::InputArchive in;
      in.load_from(bytes.data(), bytes.size());
      for (auto& key : in.keys()) {
        torch::Tensor v;
        if (in.try_read(key, v)) c.optimizer.push_back(v.clone());
      }
    }
  }
  return c;
}

// Captures every rank's state after step `at` and when train() begins; records each step's samples.
struct Probe : Callback {
  explicit Probe(int64_t at) : at(at) {}
  void on_step_end(Trainer& t) override {
    std::lock_guard<std::mutex> lock(mu);
    if (t.state().step == at) after_step[t.rank()] = capture(t);
    samples[t.state().step][t.rank()] = t.step_samples();
  }
  void on_train_begin(Trainer& t) override {
    std::lock_guard<std::mutex> lock(mu);
    at_begin[t.rank()] = capture(t);
  }
  // Only reads: the Trainer does not wait for a snapshot's background copy before its hooks.
  bool changes_training_state() const override { return false; }
  int64_t at;
  std::mutex mu;
  std::map<int, Captured> after_step, at_begin;
  std::map<int64_t, std::map<int, std::vector<size_t>>> samples;
};

TrainConfig config(const fs::path& dir) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.train_data = "160";  // 10 steps per epoch of 16
  c.test_data = "32";
  c.input_size = 4;
  c.in_channels = 1;
  c.num_classes = 4;
  c.batch_size = 8;
  c.num_epochs = 2;
  c.lr = 0.01;
  c.optimizer = "adamw";
  c.scheduler.name = "cosine";
  c.scheduler.warmup_steps = 2;
  c.save_steps = 0;  // disk checkpoints at epoch ends only: a crash at step 5 has none
  c.num_workers = 1;
  c.progress = false;
  c.tensorboard = false;
  c.log_every = 1000;
  c.num_threads = 1;
  c.mode = "ddp";
  c.work_dir = (dir / "work").string();
  c.resume_from_checkpoint = "auto";
  c.snapshot_every = 1;
  c.seed = 5;
  return c;
}

// One launch on 2 ranks; `dirs` gives each rank its snapshot folder (its "node"). Returns rank
// 0's final parameters (empty after a crash). `crash`, when set, makes a callback that crashes
// the run (gz::Aborted expected, as with crash_at).
std::vector<torch::Tensor> launch(TrainConfig c, const std::vector<fs::path>& dirs, int64_t crash_at,
                                  Probe& probe, const std::function<CallbackPtr()>& crash = {}) {
  std::vector<torch::Tensor> out;
  std::vector<ModelPtr> nets;  // built here: the global generator is shared by the threads
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(99);
    nets.push_back(std::make_shared<NetImpl>());
  }
  auto body = [&](int rank, std::shared_ptr<gz::Store> store) {
    gz::comm::ShmOptions so;
    so.timeout = std::chrono::seconds(30);
    auto group = gz::comm::create_shm_communicator(rank, 2, store, so);
    TrainConfig mine = c;
    mine.snapshot_dir = dirs[static_cast<size_t>(rank)].string();
    Trainer t(mine, group);
    t.set_model(nets[static_cast<size_t>(rank)]);
    t.add_callback(std::shared_ptr<Probe>(&probe, [](Probe*) {}));
    if (crash) t.add_callback(crash());
    if (crash_at > 0) t.set_crash_at_step(crash_at);
    t.train();
    if (rank == 0)
      for (auto& p : t.model()->parameters()) out.push_back(p.detach().clone());
  };
  if (crash_at > 0 || crash) {
    EXPECT_THROW(gz::test::run_ranks(2, body), gz::Aborted);
  } else {
    gz::test::run_ranks(2, body);
  }
  return out;
}

void expect_same(const Captured& want, const Captured& got, const std::string& who) {
  EXPECT_EQ(got.step, want.step) << who;
  EXPECT_EQ(got.epoch_samples, want.epoch_samples) << who;
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << who;
  for (size_t i = 0; i < want.tensors.size(); ++i)
    EXPECT_TRUE(torch::equal(got.tensors[i], want.tensors[i])) << who << ": tensor " << i << " differs";
  // Not the groups' lr: LibTorch's optimizer load keeps the constructor's; the lr callback sets
  // it from the step before every step.
  ASSERT_EQ(got.optimizer.size(), want.optimizer.size()) << who << ": optimizer states missing";
  EXPECT_FALSE(want.optimizer.empty());
  for (size_t i = 0; i < want.optimizer.size(); ++i)
    EXPECT_TRUE(torch::equal(got.optimizer[i], want.optimizer[i]))
        << who << ": optimizer tensor " << i << " differs";
}

// The environment gzrun gives the workers of round `round` of job `job` (GZ_RUN_ID
// "<job>-<round>", GZ_RESTART_COUNT); set before the rank threads start, removed after.
struct LauncherEnv {
  LauncherEnv(const std::string& job, int round) {
    ::setenv("GZ_RUN_ID", (job + "-" + std::to_string(round)).c_str(), 1);
    ::setenv("GZ_RESTART_COUNT", std::to_string(round).c_str(), 1);
  }
  ~LauncherEnv() {
    ::unsetenv("GZ_RUN_ID");
    ::unsetenv("GZ_RESTART_COUNT");
  }
};

// The steps of job `job`'s snapshots in `dir`.
std::vector<int64_t> snapshot_steps(const fs::path& dir, const std::string& job) {
  const gz::Env env({{"GZ_RUN_ID", job + "-0"}, {"GZ_RESTART_COUNT", "0"}});
  return SnapshotStore(dir.string(), 2, stable_hash(snapshot_run_id(env))).steps();
}

struct TmpDir {
  fs::path path = fs::temp_directory_path() / ("gz_snapshot_" + std::to_string(::getpid()));
  TmpDir() { fs::remove_all(path); }
  ~TmpDir() { fs::remove_all(path); }
};

// Crash after step 5 on both ranks, run `between`, relaunch; checks the relaunch continues exactly.
void crash_and_resume(const std::vector<fs::path>& first_dirs, const std::vector<fs::path>& second_dirs,
                      const std::function<void()>& between = {}) {
  TmpDir tmp;
  Probe reference(5), crashed(5), resumed(5);
  TrainConfig c = config(tmp.path);
  TrainConfig ref = c;
  ref.work_dir = (tmp.path / "ref").string();
  std::vector<torch::Tensor> uninterrupted, final_params;
  {
    LauncherEnv job("4000", 0);
    uninterrupted = launch(ref, {tmp.path / "ref0", tmp.path / "ref1"}, -1, reference);
  }
  {
    LauncherEnv job("4100", 0);
    launch(c, first_dirs, 5, crashed);
  }
  if (between) between();
  {
    LauncherEnv job("4100", 1);  // gzrun's restart of the same job
    final_params = launch(c, second_dirs, -1, resumed);
  }
  // Both ranks continue from exactly the state they had after step 5: no step redone.
  for (int r = 0; r < 2; ++r)
    expect_same(crashed.after_step[r], resumed.at_begin[r], "rank " + std::to_string(r));
  EXPECT_EQ(resumed.samples.begin()->first, 6) << "the resumed run redid steps";
  for (auto& [step, ranks] : resumed.samples)
    EXPECT_EQ(ranks, reference.samples[step]) << "step " << step << " read other samples";
  ASSERT_EQ(final_params.size(), uninterrupted.size());
  for (size_t i = 0; i < final_params.size(); ++i)
    EXPECT_TRUE(torch::equal(final_params[i], uninterrupted[i])) << "final parameter " << i << " differs";
}

}  // namespace

TEST(TrainerSnapshot, RestartRestoresTheLastStepBitForBit) {
  // Both ranks see the folder rank 0 wrote (one node).
  const fs::path node = fs::temp_directory_path() / ("gz_snapshot_node_" + std::to_string(::getpid()));
  crash_and_resume({node, node}, {node, node});
  EXPECT_FALSE(fs::exists(node)) << "a finished run leaves its snapshots behind";
}

// Ranks 0 and 1 on nodes a and b, each holding the snapshots its node's writer took; after the
// restart one of them runs on a replaced node c with an empty folder and gets the snapshot from
// the other, rank 1 sending when rank 0's node was lost. Threads have one writer (rank 0), so b's
// copy is made by hand: in ddp every node's writer writes the same state. Before, only rank 0
// ever held a snapshot, so no test had a sender other than rank 0. Mutation check: sending from
// rank 0 instead of `source` in read_snapshot() fails the second case (rank 0 has nothing).
TEST(TrainerSnapshot, ARankWhoseNodeLostItsSnapshotGetsItFromAPeer) {
  const auto base = fs::temp_directory_path() / ("gz_snapshot_nodes_" + std::to_string(::getpid()));
  auto copy_a_to_b = [&] {
    fs::remove_all(base / "b");
    fs::copy(base / "a", base / "b");
    fs::permissions(base / "b", fs::perms::owner_all);
    ASSERT_EQ(snapshot_steps(base / "b", "4100"), (std::vector<int64_t>{5, 4}));
    ASSERT_FALSE(fs::exists(base / "c"));
  };
  SCOPED_TRACE("rank 1's node lost its snapshot");
  crash_and_resume({base / "a", base / "b"}, {base / "a", base / "c"}, copy_a_to_b);
  fs::remove_all(base);
  SCOPED_TRACE("rank 0's node lost its snapshot");
  crash_and_resume({base / "a", base / "b"}, {base / "c", base / "b"}, copy_a_to_b);
  fs::remove_all(base);
}

TEST(TrainerSnapshot, ASnapshotOfAnotherConfigIsRefusedForTheDiskCheckpoint) {
  TmpDir tmp;
  const fs::path node = tmp.path / "node";
  Probe crashed(12), resumed(12);
  TrainConfig c = config(tmp.path);
  {
    LauncherEnv job("4200", 0);
    launch(c, {node, node}, 12, crashed);  // a disk checkpoint at step 10 (epoch end), snapshot at 12
  }
  ASSERT_TRUE(fs::exists(node));
  c.dropout = 0.5;  // another config (same shapes): its snapshot must not be restored
  LauncherEnv job("4200", 1);
  launch(c, {node, node}, -1, resumed);
  EXPECT_EQ(resumed.at_begin[0].step, 10) << "not resumed from the disk checkpoint of step 10";
}

// Slows every snapshot's copy down (CheckpointTestHooks::in_state_copy) and crashes every rank
// at the end of step `at`, before that step's snapshot: the newest is step at - 1's, whose copy
// ran alongside step `at`.
struct SlowCopyThenCrash : Callback {
  explicit SlowCopyThenCrash(int64_t at) : at(at) {}
  void on_train_begin(Trainer& t) override {
    CheckpointTestHooks h;
    h.in_state_copy = [] { std::this_thread::sleep_for(std::chrono::milliseconds(150)); };
    t.checkpoints().set_test_hooks(h);
  }
  void on_step_end(Trainer& t) override {
    if (t.state().step == at) GZ_THROW(gz::Aborted, "rank ", t.rank(), ": crash at the end of step ", at);
  }
  bool changes_training_state() const override { return false; }
  int64_t at;
};

// A snapshot's copy of the parameters and optimizer state runs alongside the next step's forward
// and backward; held up past them, the next update waits for it, so the snapshot still holds its
// own step. Mutation check: not recording the copy in submit_capture() (impl_->snapshot_copying
// left null, so nothing waits for it) restores a state that differs from step 5's.
TEST(TrainerSnapshot, ASlowCopyStillHoldsItsStep) {
  TmpDir tmp;
  const fs::path node = tmp.path / "node";
  Probe crashed(5), resumed(5);
  TrainConfig c = config(tmp.path);
  {
    LauncherEnv job("4400", 0);
    launch(c, {node, node}, -1, crashed, [] { return std::make_shared<SlowCopyThenCrash>(6); });
  }
  ASSERT_EQ(snapshot_steps(node, "4400"), (std::vector<int64_t>{5, 4}));
  LauncherEnv job("4400", 1);
  launch(c, {node, node}, -1, resumed);
  for (int r = 0; r < 2; ++r)
    expect_same(crashed.after_step[r], resumed.at_begin[r], "rank " + std::to_string(r));
}

// A user who starts training again in the same work_dir (a new gzrun, not its restart) starts
// from scratch, not from the last run's snapshot, and the old snapshots are removed. Mutation
// check: snapshot_run_id() returning "gzrun:" for every gzrun job (the job left out) makes the
// new run begin at step 5.
TEST(TrainerSnapshot, ANewRunInTheSameWorkDirDoesNotRestoreTheLastRunsSnapshot) {
  TmpDir tmp;
  const fs::path node = tmp.path / "node";
  Probe crashed(5), fresh(3);
  TrainConfig c = config(tmp.path);
  {
    LauncherEnv job("4300", 0);
    launch(c, {node, node}, 5, crashed);  // no disk checkpoint before step 10
  }
  ASSERT_EQ(snapshot_steps(node, "4300"), (std::vector<int64_t>{5, 4}));
  {
    LauncherEnv job("4301", 0);
    launch(c, {node, node}, 3, fresh);
  }
  EXPECT_EQ(fresh.at_begin[0].step, 0) << "a new run restored the last run's snapshot";
  EXPECT_TRUE(snapshot_steps(node, "4300").empty()) << "the last run's snapshots were left";
  EXPECT_EQ(snapshot_steps(node, "4301"), (std::vector<int64_t>{3, 2}));
}

}  // namespace test_trainer_snapshot
