// gz-train under `gzrun --max-restarts 1`: one rank dies mid-epoch, gzrun restarts the group,
// resume_from_checkpoint: auto continues, and the result equals an uninterrupted run. With
// snapshots (snapshot_every: 1) a SIGKILLed worker costs at most the step it was in.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "gz/train/checkpoint.h"

namespace fs = std::filesystem;

namespace {

std::string find_gzrun() {
  if (const char* env = std::getenv("GZRUN")) return fs::exists(env) ? env : "";
  for (std::string p : {std::string(GZ_BUILD_DIR) + "/tools/gzrun/gzrun",
                        std::string(GZ_SOURCE_DIR) + "/build/tools/gzrun/gzrun"})
    if (fs::exists(p)) return p;
  return "";
}

std::string gz_train() { return std::string(GZ_BUILD_DIR) + "/apps/gz-train/gz-train"; }

void write_config(const fs::path& file, const fs::path& work_dir) {
  std::ofstream(file) << "dataset: synthetic\ntrain_data: \"256\"\ntest_data: \"64\"\ninput_size: 4\n"
                         "net_type: cnn\nnum_classes: 4\nbatch_size: 16\nnum_epochs: 2\nlr: 0.005\n"
                         "save_steps: 3\nprogress: false\nnum_workers: 1\nmode: ddp\nbackend: shm\n"
                         "resume_from_checkpoint: auto\ndropout: 0\nwork_dir: \""
                      << work_dir.string() << "\"\n";
}

std::vector<torch::Tensor> final_model(const fs::path& work_dir) {
  gz::train::CheckpointManager m((work_dir / "checkpoints").string(), 10, "", true);
  auto latest = m.latest();
  EXPECT_TRUE(latest);
  if (!latest) return {};
  torch::serialize::InputArchive root, model;
  gz::train::CheckpointManager::open(latest->dir, root);
  root.read("model", model);
  std::vector<torch::Tensor> out;
  for (auto& k : model.keys()) {
    torch::Tensor t;
    model.read(k, t);
    out.push_back(t);
  }
  return out;
}

std::string slurp(const fs::path& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

double final_accuracy(const std::string& log) {
  const std::string key = "final: test_accuracy=";
  const auto at = log.rfind(key);
  return at == std::string::npos ? -1 : std::stod(log.substr(at + key.size()));
}

int run(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// a.yaml and b.yaml in `root`: the synthetic cnn, `samples` training samples, snapshots every
// step, samples logged, disk checkpoints only at epoch ends (work dirs root/a and root/b).
void write_snapshot_configs(const fs::path& root, int samples) {
  for (const char* name : {"a", "b"})
    std::ofstream(root / (std::string(name) + ".yaml"))
        << "dataset: synthetic\ntrain_data: \"" << samples << "\"\ntest_data: \"128\"\ninput_size: 4\n"
        << "net_type: cnn\nnum_classes: 4\nbatch_size: 16\nnum_epochs: 2\nlr: 0.005\nsave_steps: 0\n"
           "progress: false\nnum_workers: 1\nmode: ddp\nbackend: shm\nresume_from_checkpoint: auto\n"
           "dropout: 0\nsnapshot_every: 1\nlog_samples: true\nwork_dir: \""
        << (root / name).string() << "\"\n";
}

// `launch` + a.yaml (uninterrupted), then `faulty` + b.yaml; both must exit 0. Logs in a.log, b.log.
void run_pair(const fs::path& root, const std::string& launch, const std::string& faulty) {
  ASSERT_EQ(run(launch + gz_train() + " --config " + (root / "a.yaml").string() + " > " +
                (root / "a.log").string() + " 2>&1"),
            0)
      << "uninterrupted run failed, see " << (root / "a.log");
  ASSERT_EQ(run(faulty + gz_train() + " --config " + (root / "b.yaml").string() + " > " +
                (root / "b.log").string() + " 2>&1"),
            0)
      << "interrupted run failed, see " << (root / "b.log");
}

// The sample audit of run b against run a (every epoch read once, the same samples per step) must
// pass with at most one step redone, and b's accuracy be within 0.5 points of a's.
void expect_audit_and_accuracy(const fs::path& root, int samples) {
  const std::string audit = (root / "audit.txt").string();
  ASSERT_EQ(run("python3 " + std::string(GZ_SOURCE_DIR) + "/tests/train/check_sample_log.py " +
                (root / "b").string() + " --dataset-size " + std::to_string(samples) +
                " --epochs 2 --reference " + (root / "a").string() + " > " + audit + " 2>&1"),
            0)
      << slurp(audit);
  const std::string text = slurp(audit);
  const auto at = text.find(" step(s) run twice");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_LE(std::stoi(text.substr(text.rfind(' ', at - 1) + 1)), 1) << text;
  const double acc_a = final_accuracy(slurp(root / "a.log")), acc_b = final_accuracy(slurp(root / "b.log"));
  ASSERT_GE(acc_a, 0) << slurp(root / "a.log");
  EXPECT_NEAR(acc_b, acc_a, 0.005) << "accuracy of the interrupted run is more than 0.5 points off";
}

}  // namespace

TEST(TrainRestart, GzrunMaxRestartsResumesToTheSameResult) {
  auto gzrun = find_gzrun();
  if (gzrun.empty()) GTEST_SKIP() << "gzrun not built (tools/gzrun/gzrun)";
  if (!fs::exists(gz_train())) GTEST_SKIP() << "gz-train not built at " << gz_train();
  auto root = fs::temp_directory_path() / ("gz_restart_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  write_config(root / "a.yaml", root / "a");
  write_config(root / "b.yaml", root / "b");
  std::string common = " GZ_TIMEOUT_S=20 " + gzrun + " --nproc-per-node 2 ";
  ASSERT_EQ(run(common + gz_train() + " --config " + (root / "a.yaml").string() + " > " +
                (root / "a.log").string() + " 2>&1"),
            0)
      << "uninterrupted run failed, see " << (root / "a.log");
  // Rank 1 dies after step 5 on the first attempt (checkpoint at 3); gzrun restarts both ranks.
  ASSERT_EQ(run("GZ_TRAIN_CRASH_AT_STEP=5 GZ_TRAIN_CRASH_RANK=1" + common + "--max-restarts 1 " + gz_train() +
                " --config " + (root / "b.yaml").string() + " > " + (root / "b.log").string() + " 2>&1"),
            0)
      << "restarted run failed, see " << (root / "b.log");
  std::ifstream log(root / "b.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("simulated crash"), std::string::npos) << text;
  EXPECT_NE(text.find("final: test_accuracy="), std::string::npos) << text;
  auto a = final_model(root / "a"), b = final_model(root / "b");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << i;
  fs::remove_all(root);
}

TEST(TrainRestart, SigkilledWorkerResumesFromTheSnapshotRedoingAtMostOneStep) {
  auto gzrun = find_gzrun();
  if (gzrun.empty()) GTEST_SKIP() << "gzrun not built (tools/gzrun/gzrun)";
  if (!fs::exists(gz_train())) GTEST_SKIP() << "gz-train not built at " << gz_train();
  auto root = fs::temp_directory_path() / ("gz_snaprestart_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  // 8 steps per epoch (global batch 32); disk checkpoints only at epoch ends, so without the
  // snapshot the restart would redo every step of the epoch so far.
  write_snapshot_configs(root, 256);
  // Info level: the restore's log line says which snapshot it was and where it came from.
  std::string common = " GZ_TIMEOUT_S=20 GZ_LOG_LEVEL=info " + gzrun + " --nproc-per-node 2 ";
  // Rank 1 is SIGKILLed as step 6 begins (rank 0 is then inside step 6's collectives).
  run_pair(root, common, "GZ_TRAIN_KILL_AT_STEP=5 GZ_TRAIN_CRASH_RANK=1" + common + "--max-restarts 1 ");
  if (HasFatalFailure()) return;
  EXPECT_NE(slurp(root / "b.log").find("restored the snapshot of step "), std::string::npos)
      << slurp(root / "b.log");
  expect_audit_and_accuracy(root, 256);
  fs::remove_all(root);
}

// gzrun --recovery in-place: rank 1 is SIGKILLed as step 6 begins; gzrun starts a replacement for
// it alone, ranks 0 and 2 keep their processes (they log their recovery; a restarted process would
// not), all three meet in the group's next generation and restore the newest snapshot. Mutation
// check (run): recover_in_place() refusing every error fails the exit code and the recovery lines.
TEST(TrainRestart, InPlaceRecoveryKeepsTheSurvivorsAndRedoesAtMostOneStep) {
  auto gzrun = find_gzrun();
  if (gzrun.empty()) GTEST_SKIP() << "gzrun not built (tools/gzrun/gzrun)";
  if (!fs::exists(gz_train())) GTEST_SKIP() << "gz-train not built at " << gz_train();
  auto root = fs::temp_directory_path() / ("gz_inplace_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  write_snapshot_configs(root, 384);
  std::string common = " GZ_TIMEOUT_S=20 GZ_LOG_LEVEL=info " + gzrun + " --nproc-per-node 3 ";
  run_pair(
      root, common,
      "GZ_TRAIN_KILL_AT_STEP=5 GZ_TRAIN_CRASH_RANK=1" + common + "--recovery in-place --max-restarts 1 ");
  if (HasFatalFailure()) return;
  const std::string b_log = slurp(root / "b.log");
  EXPECT_NE(b_log.find("replacing it in place"), std::string::npos) << b_log;
  EXPECT_EQ(b_log.find("restarting all"), std::string::npos) << b_log;
  // Each survivor says it recovers in place (a restarted process would not), the victim does not.
  std::map<int, int> recovering;
  std::istringstream lines(b_log);
  for (std::string line; std::getline(lines, line);)
    for (int r = 0; r < 3; ++r)
      if (line.find("r" + std::to_string(r) + "] rank " + std::to_string(r) + ": ") != std::string::npos &&
          line.find("recovering in place (recovery 1)") != std::string::npos)
        ++recovering[r];
  EXPECT_EQ(recovering[0], 1) << b_log;
  EXPECT_EQ(recovering[2], 1) << b_log;
  EXPECT_EQ(recovering[1], 0) << b_log;
  EXPECT_EQ(b_log.find("replacing it in place (replacement 2"), std::string::npos) << b_log;
  EXPECT_NE(b_log.find("recovered in place at step "), std::string::npos) << b_log;
  expect_audit_and_accuracy(root, 384);
  fs::remove_all(root);
}

// A job that failed for good (no restarts left) leaves its snapshots in /dev/shm; the user's next
// gzrun in the same work_dir is a new run (another GZ_RUN_ID job): it does not restore them but
// removes them and starts at step 0. (gzrun's own restart restoring them: the test above.)
// Mutation check: one run id for every job (SnapshotStore(dir, 2, 0) in setup_snapshots) makes the
// second gzrun restore the snapshot of step 5.
TEST(TrainRestart, ANewGzrunInTheWorkDirOfAFailedJobDoesNotRestoreItsSnapshot) {
  auto gzrun = find_gzrun();
  if (gzrun.empty()) GTEST_SKIP() << "gzrun not built (tools/gzrun/gzrun)";
  if (!fs::exists(gz_train())) GTEST_SKIP() << "gz-train not built at " << gz_train();
  auto root = fs::temp_directory_path() / ("gz_snapnewrun_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  std::ofstream(root / "c.yaml")
      << "dataset: synthetic\ntrain_data: \"256\"\ntest_data: \"64\"\ninput_size: 4\n"
         "net_type: cnn\nnum_classes: 4\nbatch_size: 16\nnum_epochs: 1\nlr: 0.005\n"
         "save_steps: 0\nprogress: false\nnum_workers: 1\nmode: ddp\nbackend: shm\n"
         "resume_from_checkpoint: auto\nsnapshot_every: 1\nwork_dir: \""
      << (root / "c").string() << "\"\n";
  const std::string common = " GZ_TIMEOUT_S=20 GZ_LOG_LEVEL=info " + gzrun + " --nproc-per-node 2 ";
  const std::string train = gz_train() + " --config " + (root / "c.yaml").string();
  EXPECT_NE(run("GZ_TRAIN_KILL_AT_STEP=5 GZ_TRAIN_CRASH_RANK=1" + common + "--max-restarts 0 " + train +
                " > " + (root / "c1.log").string() + " 2>&1"),
            0)
      << "the first job did not fail, see " << (root / "c1.log");
  ASSERT_EQ(run(common + train + " > " + (root / "c2.log").string() + " 2>&1"), 0)
      << "the second job failed, see " << (root / "c2.log");
  const std::string log = slurp(root / "c2.log");
  EXPECT_EQ(log.find("restored the snapshot"), std::string::npos) << log;
  EXPECT_NE(log.find("snapshot file(s) of another run"), std::string::npos) << log;
  fs::remove_all(root);
}
