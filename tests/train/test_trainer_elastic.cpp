// The Trainer resumed on another world size: 3 ranks -> 2 -> 3 in the middle of epochs. With
// elastic_batch keep_global the resized run reads every step's samples exactly as an uninterrupted
// 3-rank run does and ends with the same weights; with scale_lr each epoch still reads every
// sample at most once and none twice.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/train/callback.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"
#include "support/tiny_net.h"

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

using NetImpl = gz::test::TinyNetImpl;

// What every rank trained on, step by step, per launch of train() (a session).
struct Record {
  std::mutex mu;
  // session -> step -> rank -> (epoch, samples)
  std::map<int64_t, std::map<int64_t, std::map<int, std::pair<int64_t, std::vector<size_t>>>>> steps;
  std::map<int64_t, int> world_of;
};

struct Recorder : Callback {
  Recorder(Record& r, int64_t session) : rec(r), session(session) {}
  void on_step_end(Trainer& t) override {
    std::lock_guard<std::mutex> lock(rec.mu);
    rec.steps[session][t.state().step][t.rank()] = {t.state().epoch, t.step_samples()};
    rec.world_of[session] = t.world_size();
  }
  Record& rec;
  int64_t session;
};

TrainConfig config(const fs::path& dir, const std::string& policy) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.train_data = "250";  // 10 steps per epoch of 24 (10 samples not read) or 25 samples
  c.test_data = "40";
  c.input_size = 4;
  c.in_channels = 1;
  c.num_classes = 4;
  c.batch_size = 8;
  c.num_epochs = 2;
  c.lr = 0.01;
  c.optimizer = "adamw";
  c.scheduler.name = "cosine";
  c.scheduler.warmup_steps = 2;
  c.save_steps = 3;
  c.save_total_limit = 3;
  c.num_workers = 1;
  c.progress = false;
  c.tensorboard = false;
  c.log_every = 1000;
  c.num_threads = 1;
  c.mode = "ddp";
  c.work_dir = dir.string();
  c.resume_from_checkpoint = "auto";
  c.elastic_batch = policy;
  c.log_samples = true;
  c.seed = 5;
  return c;
}

// One launch on `world` ranks (threads, shm); crash_at > 0: every rank stops after that step.
// Returns rank 0's final parameters (empty after a crash).
std::vector<torch::Tensor> launch(const TrainConfig& c, int world, int64_t crash_at, Record& rec,
                                  int64_t session) {
  std::vector<torch::Tensor> out;
  std::vector<ModelPtr> nets;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(99);
    nets.push_back(std::make_shared<NetImpl>());
  }
  auto body = [&](int rank, std::shared_ptr<gz::Store> store) {
    gz::comm::ShmOptions so;
    so.timeout = std::chrono::seconds(30);
    auto group = gz::comm::create_shm_communicator(rank, world, store, so);
    Trainer t(c, group);
    t.set_model(nets[static_cast<size_t>(rank)]);
    t.add_callback(std::make_shared<Recorder>(rec, session));
    if (crash_at > 0) t.set_crash_at_step(crash_at);
    t.train();
    if (rank == 0)
      for (auto& p : t.model()->parameters()) out.push_back(p.detach().clone());
  };
  if (crash_at > 0) {
    EXPECT_THROW(gz::test::run_ranks(world, body), gz::Aborted);
  } else {
    gz::test::run_ranks(world, body);
  }
  return out;
}

// For every step, the samples of the last session that ran it (all its ranks), per epoch.
std::map<int64_t, std::vector<size_t>> surviving_steps(Record& rec, std::map<int64_t, int64_t>* epoch_of) {
  std::map<int64_t, std::vector<size_t>> out;
  std::map<int64_t, int64_t> last_session;
  for (auto& [session, steps] : rec.steps)
    for (auto& [step, ranks] : steps) last_session[step] = session;
  for (auto& [step, session] : last_session) {
    auto& ranks = rec.steps[session][step];
    EXPECT_EQ(static_cast<int>(ranks.size()), rec.world_of[session]) << "step " << step << ": ranks missing";
    for (auto& [rank, rec_rank] : ranks) {
      (*epoch_of)[step] = rec_rank.first;
      out[step].insert(out[step].end(), rec_rank.second.begin(), rec_rank.second.end());
    }
  }
  return out;
}

// Each epoch reads `steps_per_epoch` x G distinct samples: no repeats, nothing skipped.
void expect_each_epoch_once(const std::map<int64_t, std::vector<size_t>>& steps,
                            const std::map<int64_t, int64_t>& epoch_of, size_t per_epoch, int epochs) {
  std::map<int64_t, std::vector<size_t>> by_epoch;
  for (auto& [step, samples] : steps) {
    auto& e = by_epoch[epoch_of.at(step)];
    e.insert(e.end(), samples.begin(), samples.end());
  }
  ASSERT_EQ(static_cast<int>(by_epoch.size()), epochs);
  for (auto& [epoch, samples] : by_epoch) {
    std::set<size_t> distinct(samples.begin(), samples.end());
    EXPECT_EQ(distinct.size(), samples.size()) << "epoch " << epoch << ": a sample was read twice";
    EXPECT_EQ(samples.size(), per_epoch) << "epoch " << epoch << ": samples skipped or extra";
  }
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("gz_elastic_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

}  // namespace

TEST(TrainerElastic, KeepGlobalBatchResizedRunMatchesUninterrupted) {
  TmpDir a("keep_a"), b("keep_b");
  Record ra, rb;
  // A global batch of 25 splits unevenly on every world: 9/8/8 on 3 ranks, 13/12 on 2 (in two
  // micro-batches each of at most 8), so the loss weights decide whether the steps match.
  auto ca = config(a.path, "keep_global"), cb = config(b.path, "keep_global");
  ca.global_batch_size = cb.global_batch_size = 25;
  auto reference = launch(ca, 3, -1, ra, 0);
  // 3 ranks crash after step 5 (checkpoint 3), 2 ranks resume and crash after 14 (checkpoint 12,
  // in epoch 1), 3 ranks finish.
  launch(cb, 3, 5, rb, 0);
  launch(cb, 2, 14, rb, 1);
  auto resized = launch(cb, 3, -1, rb, 2);
  EXPECT_EQ(rb.world_of[1], 2);
  ASSERT_EQ(reference.size(), resized.size());
  for (size_t i = 0; i < reference.size(); ++i)
    EXPECT_TRUE(torch::allclose(reference[i], resized[i], 1e-4, 1e-5))
        << "param " << i << " max diff " << (reference[i] - resized[i]).abs().max().item<float>();
  std::map<int64_t, int64_t> epoch_a, epoch_b;
  auto sa = surviving_steps(ra, &epoch_a), sb = surviving_steps(rb, &epoch_b);
  ASSERT_EQ(sa.size(), 20u);
  ASSERT_EQ(sb.size(), 20u);
  for (auto& [step, samples] : sa) {
    std::set<size_t> want(samples.begin(), samples.end()), got(sb[step].begin(), sb[step].end());
    EXPECT_EQ(got, want) << "step " << step << " read other samples than the uninterrupted run";
    EXPECT_EQ(epoch_b[step], epoch_a[step]);
  }
  expect_each_epoch_once(sb, epoch_b, 250, 2);
}

TEST(TrainerElastic, HorovodModeChangesItsAccumulationWithTheWorld) {
  // Global batch 24: one micro-batch of 8 per rank on 3 ranks, two of 6 on 2 ranks; the
  // DistributedOptimizer built for one backward pass per step must then wait for two.
  TmpDir a("hvd_a"), b("hvd_b");
  Record ra, rb;
  auto ca = config(a.path, "keep_global"), cb = config(b.path, "keep_global");
  ca.mode = cb.mode = "horovod";
  auto reference = launch(ca, 3, -1, ra, 0);
  launch(cb, 3, 5, rb, 0);
  launch(cb, 2, 14, rb, 1);
  auto resized = launch(cb, 3, -1, rb, 2);
  ASSERT_EQ(reference.size(), resized.size());
  for (size_t i = 0; i < reference.size(); ++i)
    EXPECT_TRUE(torch::allclose(reference[i], resized[i], 1e-4, 1e-5))
        << "param " << i << " max diff " << (reference[i] - resized[i]).abs().max().item<float>();
}

TEST(TrainerElastic, ScaleLrReadsEachSampleOncePerEpoch) {
  TmpDir b("scale");
  Record rb;
  // 3 ranks: G = 24, 10 steps per epoch. Crash after 5 (checkpoint 3: 72 samples of epoch 0).
  // 2 ranks: G = 16, the rest of epoch 0 is (250 - 72) / 16 = 11 steps; crash after step 16
  // (checkpoint 15: epoch 1 at 16 samples). 3 ranks: G = 24 again, finish.
  launch(config(b.path, "scale_lr"), 3, 5, rb, 0);
  launch(config(b.path, "scale_lr"), 2, 16, rb, 1);
  launch(config(b.path, "scale_lr"), 3, -1, rb, 2);
  std::map<int64_t, int64_t> epoch_of;
  auto steps = surviving_steps(rb, &epoch_of);
  // Epoch 0: 3 steps of 24 + 11 of 16 = 248; epoch 1: 1 of 16 + 9 of 24 = 232 (234 left, 9 steps).
  std::map<int64_t, std::vector<size_t>> by_epoch;
  for (auto& [step, samples] : steps)
    by_epoch[epoch_of[step]].insert(by_epoch[epoch_of[step]].end(), samples.begin(), samples.end());
  ASSERT_EQ(by_epoch.size(), 2u);
  EXPECT_EQ(by_epoch[0].size(), 248u);
  EXPECT_EQ(by_epoch[1].size(), 232u);
  for (auto& [epoch, samples] : by_epoch)
    EXPECT_EQ(std::set<size_t>(samples.begin(), samples.end()).size(), samples.size()) << "epoch " << epoch;
}
