// The trainer's phase marks (data, forward, backward, optimizer, comm, eval, checkpoint) as the
// straggler report and the flight recorder's dumps see them, in DDP and Horovod mode; and the
// report's per-window rows in history.jsonl. One process, one rank: the phase mark is process-wide,
// so ranks as threads would mix their marks (the multi-process report runs in
// tests/train/straggler_gzrun.sh and multihost_straggler.sh).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gz/comm/shm.h"
#include "gz/core/phase.h"
#include "gz/store/mem_store.h"
#include "gz/torch/ddp.h"
#include "gz/torch/distributed_optimizer.h"
#include "gz/train/config.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"
#include "train/straggler/observability_ab.h"

namespace gz::train {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> flags(const std::string& mode, const fs::path& dir) {
  return {"--dataset",     "synthetic", "--train_data", "256",       "--test_data",   "64",
          "--net_type",    "cnn",       "--input_size", "8",         "--num_classes", "4",
          "--batch_size",  "16",        "--max_steps",  "12",        "--save_steps",  "6",
          "--num_workers", "0",         "--progress",   "false",     "--tensorboard", "false",
          "--mode",        mode,        "--work_dir",   dir.string()};
}

// Steps seen by a callback: where the mark stands when a step has ended.
struct StepProbe : Callback {
  std::vector<PhaseMark> at_end;
  std::vector<int64_t> steps;
  void on_step_end(Trainer& t) override {
    at_end.push_back(current_phase());
    steps.push_back(t.state().step);
  }
};

class TrainerPhases : public ::testing::TestWithParam<std::string> {};

// Mutation check: dropping any one mark (e.g. the data mark in train_step, DDP's comm mark in
// finalize_backward or Horovod mode's in synchronize) leaves that phase at 0 and fails here.
TEST_P(TrainerPhases, EveryPhaseOfTheLoopIsMarkedWithItsStep) {
  const fs::path dir = fs::temp_directory_path() / ("gz_phases_" + GetParam() + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto store = std::make_shared<MemStore>();
  Trainer t(parse_config("", flags(GetParam(), dir)), comm::create_shm_communicator(0, 1, store));
  auto probe = std::make_shared<StepProbe>();
  t.add_callback(probe);
  const PhaseTotals before = phase_totals();
  t.train();
  const PhaseTotals after = phase_totals();
  for (Phase p : {Phase::data, Phase::forward, Phase::backward, Phase::optimizer, Phase::comm, Phase::eval,
                  Phase::checkpoint})
    EXPECT_GT(after.of(p) - before.of(p), 0) << phase_name(p) << " was never marked";
  ASSERT_EQ(probe->at_end.size(), 12u);
  for (size_t k = 0; k < probe->at_end.size(); ++k) {
    EXPECT_EQ(probe->at_end[k].step, probe->steps[k] - 1) << "the mark carries the step being trained";
    EXPECT_NE(probe->at_end[k].phase, Phase::forward) << "a step ends outside its compute phases";
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, TrainerPhases, ::testing::Values("ddp", "horovod"));

// The front ends mark their own exposed waits: DDP's wait for the gradient buckets at the end of
// backward, Horovod mode's synchronize(). Mutation check: removing the ScopedPhase in
// Reducer::finalize_backward or DistributedOptimizer::synchronize leaves comm at 0 here.
TEST(TrainerPhases, DdpAndHorovodModeMarkTheirWaitForGradientsAsComm) {
  auto store = std::make_shared<MemStore>();
  auto group = comm::create_shm_communicator(0, 1, store);
  auto model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  const auto x = torch::randn({5, 8});
  {
    DistributedDataParallel ddp(model, group);
    set_phase(Phase::backward);
    const PhaseTotals before = phase_totals();
    ddp.forward([&] { return model->forward(x); }).sum().backward();
    const PhaseTotals after = phase_totals();
    EXPECT_GT(after.of(Phase::comm) - before.of(Phase::comm), 0) << "DDP";
    EXPECT_EQ(current_phase().phase, Phase::backward) << "the mark is restored after the wait";
  }
  {
    NamedParameters named;
    for (auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    DistributedOptimizer hvd(sgd, named, DistributedOptimizerOptions{}, group);
    hvd.zero_grad();
    model->forward(x).sum().backward();
    set_phase(Phase::optimizer);
    const PhaseTotals before = phase_totals();
    hvd.synchronize();
    const PhaseTotals after = phase_totals();
    EXPECT_GT(after.of(Phase::comm) - before.of(Phase::comm), 0) << "Horovod mode";
    EXPECT_EQ(current_phase().phase, Phase::optimizer);
  }
  set_phase(Phase::idle);
}

// Two ranks (threads): the straggler report's all-gather runs every 4 steps and rank 0 writes one
// "straggler" row per window with every rank's figures; straggler.every 0 writes none. (The
// numbers themselves are meaningless here: the threads share one phase mark.)
TEST(TrainerPhases, StragglerRowsInTheHistory) {
  for (const std::string every : {"4", "0"}) {
    const fs::path dir =
        fs::temp_directory_path() / ("gz_straggler_rows_" + every + std::to_string(::getpid()));
    fs::remove_all(dir);
    test::run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
      auto f = flags("ddp", dir / std::to_string(rank));
      f.insert(f.end(),
               {"--straggler.every", every, "--straggler.min_window_ms", "0", "--tensorboard", "true"});
      Trainer t(parse_config("", f), comm::create_shm_communicator(rank, 2, store));
      t.train();
    });
    std::ifstream in(dir / "0" / "history.jsonl");
    int rows = 0;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["kind"] != "straggler") continue;
      ++rows;
      for (const char* k : {"rank0/comm_ms", "rank1/data_ms", "rank1/late_ms", "step_ms", "late_rank"})
        EXPECT_TRUE(j.contains(k)) << k << " in " << line;
    }
    // Windows after step 1: steps 5 and 9 (12 steps).
    EXPECT_EQ(rows, every == "4" ? 2 : 0) << "straggler.every " << every;
    fs::remove_all(dir);
  }
}

// GZ_OBS_AB_WINDOW's wrapper (bench/run_observability_ab.sh): off-windows pause every flight
// recorder and do not call the report; on-windows do both as usual; the control switches nothing.
// Mutation check: forwarding on_step_end in every window, or never pausing, fails here.
struct CallProbe : Callback {
  std::vector<int64_t> ended;  ///< state().step at each on_step_end the wrapper forwarded
  void on_step_end(Trainer& t) override { ended.push_back(t.state().step); }
};
struct PauseProbe : Callback {  // runs after the wrapper: sees what it set for this step
  comm::Communicator* group = nullptr;
  std::vector<bool> recorded;  ///< per step: the group's recorder answered
  void on_step_begin(Trainer&) override { recorded.push_back(group->flight_recorder() != nullptr); }
};

TEST(TrainerPhases, ObservabilityAbPausesAndSkipsOnlyOffWindows) {
  for (const bool control : {false, true}) {
    const fs::path dir = fs::temp_directory_path() / ("gz_obs_ab_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    auto group = comm::create_shm_communicator(0, 1, std::make_shared<MemStore>());
    Trainer t(parse_config("", flags("ddp", dir)), group);
    auto report = std::make_shared<CallProbe>();
    auto pause = std::make_shared<PauseProbe>();
    pause->group = group.get();
    t.add_callback(std::make_shared<ObservabilityAB>(report, 2, control));
    t.add_callback(pause);
    testing::internal::CaptureStdout();
    t.train();
    const std::string out = testing::internal::GetCapturedStdout();
    // 12 steps in windows of 2: steps 0-1, 4-5, 8-9 on; 2-3, 6-7, 10-11 off.
    const std::vector<int64_t> on_ends{1, 2, 5, 6, 9, 10};
    const std::vector<bool> on_steps{true, true, false, false, true, true, false, false, true, true, false, false};
    if (control) {
      EXPECT_EQ(report->ended.size(), 12u);
      EXPECT_EQ(pause->recorded, std::vector<bool>(12, true));
      EXPECT_NE(out.find("control: nothing switched"), std::string::npos) << out;
    } else {
      EXPECT_EQ(report->ended, on_ends);
      EXPECT_EQ(pause->recorded, on_steps);
    }
    EXPECT_NE(group->flight_recorder(), nullptr) << "recorders stay paused after training";
    // Steps 4-10 are timed (the first two windows are warm-up): 4 on (4, 5, 8, 9), 3 off.
    EXPECT_NE(out.find("obs A/B (window 2"), std::string::npos) << out;
    EXPECT_NE(out.find("on 4 steps"), std::string::npos) << out;
    EXPECT_NE(out.find("off 3 steps"), std::string::npos) << out;
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace gz::train
