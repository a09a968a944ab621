// In-memory snapshots at zero_stage 1 and 3 (threads over shm as 4 ranks on 2 "nodes", each node
// its own snapshot folder): every rank's shard is restored bit for bit after a crash, also when
// one node's folder is wiped (the buddies on the other node send them); a shard whose owner and
// buddy both lost it sends the run to the disk checkpoint with a warning naming the rank.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "../../src/torch/torch_compat.h"  // the optimizer's state of a parameter
#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/torch/fully_shard.h"  // gz::run_unit
#include "gz/torch/zero_redundancy_optimizer.h"
#include "gz/train/callback.h"
#include "gz/train/checkpoint.h"
#include "gz/train/models/shard_units.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"

// A namespace of its own: the unity build compiles this file with the others of test_snapshot.
namespace test_shard_snapshot {

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

constexpr int kWorld = 4, kPerNode = 2;

// The job's shape: `world` ranks, `per_node` a node; `shm_chunk` > 0 shrinks the shm slots (and
// so the point-to-point ones) so that a shard's send waits for its receiver.
struct Shape {
  int world = kWorld, per_node = kPerNode;
  size_t shm_chunk = 0;
};

// Two units at stage 3 (fc1 its own), and a buffer the training changes.
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

// What a rank continues from: its optimizer's parameters (stage 1: its flat blocks, with the
// whole model's parameters; stage 3: its shards) and their state tensors, and the buffers.
struct Captured {
  int64_t step = -1, epoch_samples = -1;
  std::vector<torch::Tensor> tensors, optimizer;
};

void add_state(torch::optim::Optimizer& opt, const torch::Tensor& p, std::vector<torch::Tensor>& out) {
  auto* st = gz::torch_compat::param_state(opt, p);
  if (!st) return;
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
    if (in.try_read(key, v)) out.push_back(v.clone());
  }
}

Captured capture(Trainer& t) {
  Captured c;
  c.step = t.state().step;
  c.epoch_samples = t.state().epoch_samples;
  torch::optim::Optimizer* opt = &t.optimizer();
  if (auto* zero = dynamic_cast<gz::ZeroRedundancyOptimizer*>(opt)) {
    for (auto& p : t.model()->parameters()) c.tensors.push_back(p.detach().clone());  // whole at 1/2
    opt = &zero->local_optimizer();
  }
  for (auto& group : opt->param_groups())
    for (auto& p : group.params()) {
      c.tensors.push_back(p.detach().clone());
      add_state(*opt, p, c.optimizer);
    }
  for (auto& b : t.model()->buffers()) c.tensors.push_back(b.detach().clone());
  return c;
}

struct Probe : Callback {
  explicit Probe(int64_t at) : at(at) {}
  void on_step_end(Trainer& t) override {
    std::lock_guard<std::mutex> lock(mu);
    if (t.state().step == at) after_step[t.rank()] = capture(t);
  }
  void on_train_begin(Trainer& t) override {
    std::lock_guard<std::mutex> lock(mu);
    at_begin[t.rank()] = capture(t);
  }
  bool changes_training_state() const override { return false; }
  int64_t at;
  std::mutex mu;
  std::map<int, Captured> after_step, at_begin;
};

// 320 samples, global batch 32: 10 steps an epoch, 2 epochs; a disk checkpoint at each epoch end.
TrainConfig config(const fs::path& dir, int stage) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.train_data = "320";
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
  c.save_steps = 0;
  c.num_workers = 0;
  c.progress = false;
  c.tensorboard = false;
  c.log_every = 1000;
  c.num_threads = 1;
  c.mode = "ddp";
  c.zero_stage = stage;
  c.work_dir = (dir / "work").string();
  c.resume_from_checkpoint = "auto";
  c.snapshot_every = 1;
  c.seed = 7;
  return c;
}

struct LauncherEnv {  // gzrun's environment for round `round` of job `job`
  LauncherEnv(const std::string& job, int round) {
    ::setenv("GZ_RUN_ID", (job + "-" + std::to_string(round)).c_str(), 1);
    ::setenv("GZ_RESTART_COUNT", std::to_string(round).c_str(), 1);
  }
  ~LauncherEnv() {
    ::unsetenv("GZ_RUN_ID");
    ::unsetenv("GZ_RESTART_COUNT");
  }
};

// Node n's snapshot folder: ranks 2n and 2n + 1.
fs::path node_dir(const fs::path& base, int node) { return base / ("node" + std::to_string(node)); }

// Holds every shard snapshot's serialization up (CheckpointTestHooks::in_state_copy) and crashes
// every rank at the end of step `at`, before that step's snapshot: the newest is step at - 1's,
// serialized and sent while step `at` ran.
struct SlowSerializationThenCrash : Callback {
  explicit SlowSerializationThenCrash(int64_t at) : at(at) {}
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

// One launch of `shape`; returns rank 0's final whole parameters (empty after a crash). `crash`,
// when set, makes a callback that crashes the run (gz::Aborted expected).
std::vector<torch::Tensor> launch(const TrainConfig& c, const fs::path& nodes, int64_t crash_at, Probe& probe,
                                  const Shape& shape = {}, const std::function<CallbackPtr()>& crash = {}) {
  const int world = shape.world, per_node = shape.per_node;
  std::vector<torch::Tensor> out;
  std::vector<ModelPtr> nets;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(99);  // built here: the threads share the global generator
    nets.push_back(std::make_shared<NetImpl>());
  }
  auto body = [&](int rank, std::shared_ptr<gz::Store> store) {
    gz::comm::ShmOptions so;
    so.timeout = std::chrono::seconds(30);
    so.chunk_bytes = shape.shm_chunk;
    auto group = gz::comm::create_shm_communicator(rank, world, store, so);
    TrainConfig mine = c;
    mine.snapshot_dir = node_dir(nodes, rank / per_node).string();
    Trainer t(mine, group);
    t.set_model(nets[static_cast<size_t>(rank)]);
    t.set_snapshot_local_world(per_node);
    t.add_callback(std::shared_ptr<Probe>(&probe, [](Probe*) {}));
    if (crash) t.add_callback(crash());
    if (crash_at > 0) t.set_crash_at_step(crash_at);
    t.train();
    t.gather_model();  // stage 3: the parameters are whole until the next forward
    if (rank == 0)
      for (auto& p : t.model()->parameters()) out.push_back(p.detach().clone());
  };
  if (crash_at > 0 || crash)
    EXPECT_THROW(gz::test::run_ranks(world, body), gz::Aborted);
  else
    gz::test::run_ranks(world, body);
  return out;
}

void expect_same(const Captured& want, const Captured& got, const std::string& who) {
  EXPECT_EQ(got.step, want.step) << who;
  EXPECT_EQ(got.epoch_samples, want.epoch_samples) << who;
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << who;
  for (size_t i = 0; i < want.tensors.size(); ++i)
    EXPECT_TRUE(torch::equal(got.tensors[i], want.tensors[i])) << who << ": tensor " << i << " differs";
  ASSERT_EQ(got.optimizer.size(), want.optimizer.size()) << who << ": optimizer states missing";
  EXPECT_FALSE(want.optimizer.empty()) << who;
  for (size_t i = 0; i < want.optimizer.size(); ++i)
    EXPECT_TRUE(torch::equal(got.optimizer[i], want.optimizer[i]))
        << who << ": optimizer tensor " << i << " differs";
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("gz_shard_snap_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// This run's shard files of `rank` (its own and the buddy's copy) in `dir`.
std::vector<fs::path> shard_files(const fs::path& dir, int rank) {
  char tail[16];
  std::snprintf(tail, sizeof tail, "-r%06d.bin", rank);
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > std::strlen(tail) &&
        name.compare(name.size() - std::strlen(tail), std::string::npos, tail) == 0)
      out.push_back(e.path());
  }
  return out;
}

// Crash after step `crash_at` on every rank, run `between` on the node folders, restart; every
// rank must continue from exactly its state at the crash, and the run end where the
// uninterrupted one does.
void crash_and_resume(int stage, const std::string& tag, int64_t crash_at,
                      const std::function<void(const fs::path& nodes)>& between = {},
                      const Shape& shape = {}) {
  const int world = shape.world, per_node = shape.per_node;
  TmpDir tmp(tag);
  Probe reference(crash_at), crashed(crash_at), resumed(crash_at);
  TrainConfig c = config(tmp.path, stage), ref = c;
  ref.work_dir = (tmp.path / "ref").string();
  std::vector<torch::Tensor> uninterrupted, final_params;
  {
    LauncherEnv job("5000", 0);
    uninterrupted = launch(ref, tmp.path / "ref_nodes", -1, reference, shape);
  }
  {
    LauncherEnv job("5100", 0);
    launch(c, tmp.path / "nodes", crash_at, crashed, shape);
  }
  const int nodes = world / per_node;
  for (int r = 0; r < world; ++r)  // own copy on its node, the buddy's on the next
    ASSERT_EQ(shard_files(node_dir(tmp.path / "nodes", r / per_node), r).size() +
                  shard_files(node_dir(tmp.path / "nodes", (r / per_node + 1) % nodes), r).size(),
              4u)
        << "rank " << r << ": 2 generations, own and buddy's";
  if (between) between(tmp.path / "nodes");
  {
    LauncherEnv job("5100", 1);  // gzrun's restart of the same job
    final_params = launch(c, tmp.path / "nodes", -1, resumed, shape);
  }
  for (int r = 0; r < world; ++r)
    expect_same(crashed.after_step[r], resumed.at_begin[r], "rank " + std::to_string(r));
  ASSERT_EQ(final_params.size(), uninterrupted.size());
  for (size_t i = 0; i < final_params.size(); ++i)
    EXPECT_TRUE(torch::equal(final_params[i], uninterrupted[i])) << "final parameter " << i << " differs";
}

}  // namespace

// Mutation checks, run by hand: counting only a rank's own file as holding its shard
// (ShardTable::missing() without the buddy column) fails both wiped-node cases (no snapshot is
// complete: the run starts over); the buddy rank + 1 instead of rank + ranks per node (a copy on
// the same node) fails the four crash cases on the file count; ZeroRedundancyOptimizer::
// load_shard_bytes() without gather_loaded() (the blocks not all-gathered into the parameters)
// fails both stage 1 cases bit for bit.
TEST(ShardSnapshot, Stage1RestartRestoresEveryShardBitForBit) { crash_and_resume(1, "z1", 5); }

TEST(ShardSnapshot, Stage1ANodesWipedFolderIsRestoredFromTheBuddies) {
  crash_and_resume(1, "z1w", 5, [](const fs::path& nodes) { fs::remove_all(node_dir(nodes, 1)); });
}

TEST(ShardSnapshot, Stage3RestartRestoresEveryShardBitForBit) { crash_and_resume(3, "z3", 5); }

TEST(ShardSnapshot, Stage3ANodesWipedFolderIsRestoredFromTheBuddies) {
  crash_and_resume(3, "z3w", 5, [](const fs::path& nodes) { fs::remove_all(node_dir(nodes, 0)); });
}

// Three nodes of one rank at stage 2, point-to-point slots of 1 KiB (a shard's send waits for its
// receiver): an odd ring (node 2 sends to node 0, which sends first as well) neither deadlocks
// taking the snapshots nor restoring them, and node 1's wiped shard comes back from node 2.
// Mutation check: every rank sending first (shard_sends_first() always true) deadlocks the first
// exchange until the 30 s op timeout and fails.
TEST(ShardSnapshot, Stage2OnThreeNodesRestoresAWipedNodeFromItsBuddy) {
  crash_and_resume(
      2, "z2n3", 5, [](const fs::path& nodes) { fs::remove_all(node_dir(nodes, 1)); }, Shape{3, 1, 1024});
}

// A shard snapshot is copied on the training thread and serialized and sent on the exchange's
// thread while the next step runs (held up 150 ms here, past that step's update): the snapshot
// still holds its own step. Mutation check: no copy (shard_archive() writing the live tensors,
// `own` without its clone) restores a state that differs from step 5's, at stage 1 and 3.
TEST(ShardSnapshot, ASlowSerializationStillHoldsItsStep) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("zero_stage " + std::to_string(stage));
    TmpDir tmp("slow" + std::to_string(stage));
    Probe crashed(5), resumed(5);
    TrainConfig c = config(tmp.path, stage);
    {
      LauncherEnv job("5400", 0);
      launch(c, tmp.path / "nodes", -1, crashed, {},
             [] { return std::make_shared<SlowSerializationThenCrash>(6); });
    }
    LauncherEnv job("5400", 1);
    launch(c, tmp.path / "nodes", -1, resumed);
    for (int r = 0; r < kWorld; ++r)
      expect_same(crashed.after_step[r], resumed.at_begin[r], "rank " + std::to_string(r));
  }
}

// Rank 0's shard gone from its own node and from its buddy's (rank 2 on node 1): the restart
// resumes from the disk checkpoint of step 10, with a warning naming rank 0. Mutation check:
// ShardTable::missing() always empty (every shard taken as held) tries step 12, whose copy rank 2
// cannot read: it falls back without naming rank 0, and fails here.
TEST(ShardSnapshot, AShardLostWithItsBuddyFallsBackToTheDiskCheckpoint) {
  TmpDir tmp("lost");
  Probe crashed(12), resumed(12);
  TrainConfig c = config(tmp.path, 1);
  {
    LauncherEnv job("5200", 0);
    launch(c, tmp.path / "nodes", 12, crashed);  // a disk checkpoint at step 10 (epoch end)
  }
  for (int node = 0; node < 2; ++node)
    for (auto& f : shard_files(node_dir(tmp.path / "nodes", node), 0)) fs::remove(f);
  testing::internal::CaptureStderr();
  {
    LauncherEnv job("5200", 1);
    launch(c, tmp.path / "nodes", -1, resumed);
  }
  const std::string log = testing::internal::GetCapturedStderr();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(resumed.at_begin[r].step, 10) << "rank " << r;
  EXPECT_NE(log.find("lacks the shard of rank(s) 0 "), std::string::npos) << log;
  EXPECT_NE(log.find("using the disk checkpoint"), std::string::npos) << log;
}

// A restart on fewer ranks (4 nodes of one rank -> 3, node 3 lost): every old rank's shard of
// step 12 is on a surviving node (rank 3's as node 0's copy), so the 3 ranks restore it,
// resharded from 4 blocks to 3 (block edges that do not line up), with one line naming both
// world sizes, instead of the disk checkpoint of step 10; node 0's copies of rank 3's shard are
// removed once restored. At stage 1 every rank's whole parameters as it begins equal the crashed
// rank 0's after step 12, bit for bit (the all-gather of the resharded blocks); the optimizer
// state's resharding is checked by the in-place tests' final parameters. Mutation checks (by
// hand, see the commit): restoring with the old world's layout, holders that do not hold the
// shard, and start_shard_snapshots() removing the lost ranks' files before the restore (as it
// did) each fail here.
void restart_on_fewer_ranks(int stage) {
  SCOPED_TRACE("zero_stage " + std::to_string(stage));
  TmpDir tmp("resize" + std::to_string(stage));
  Probe crashed(12), resumed(12);
  TrainConfig c = config(tmp.path, stage);
  {
    LauncherEnv job("5300", 0);
    launch(c, tmp.path / "nodes", 12, crashed, Shape{4, 1, 0});
  }
  ASSERT_EQ(shard_files(node_dir(tmp.path / "nodes", 0), 3).size(), 2u) << "rank 3's copies on node 0";
  testing::internal::CaptureStderr();
  {
    LauncherEnv job("5300", 1);
    launch(c, tmp.path / "nodes", -1, resumed, Shape{3, 1, 0});  // node 3 lost
  }
  const std::string log = testing::internal::GetCapturedStderr();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(resumed.at_begin[r].step, 12) << "rank " << r;
  EXPECT_NE(log.find("snapshot of step 12 written by 4 ranks, resharded to 3"), std::string::npos) << log;
  EXPECT_EQ(log.find("using the disk checkpoint"), std::string::npos) << log;
  EXPECT_TRUE(shard_files(node_dir(tmp.path / "nodes", 0), 3).empty()) << "rank 3's copies stayed on node 0";
  if (stage != 1) return;
  const size_t n = NetImpl().parameters().size();  // the whole parameters come first at stage 1
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < n; ++i)
      EXPECT_TRUE(torch::equal(resumed.at_begin[r].tensors.at(i), crashed.after_step[0].tensors.at(i)))
          << "rank " << r << ": parameter " << i << " differs from the snapshot's";
}

TEST(ShardSnapshot, ARestartOnFewerRanksReshardsTheShardSnapshots) {
  restart_on_fewer_ranks(1);
  restart_on_fewer_ranks(3);
}

}  // namespace test_shard_snapshot
