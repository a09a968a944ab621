// The Trainer's compression: and averaging: blocks: parsing, validation, and 2-rank runs (threads,
// shm) with each algorithm that must learn, end with equal replicas and count their bytes.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/train/config.h"
#include "gz/train/trainer.h"
#include "support/run_ranks.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_trainer_comm {

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

TEST(TrainerComm, ConfigBlocksParseFromYamlAndFlagsAndRoundTrip) {
  auto c = parse_config("mode: ddp\ncompression:\n  method: powersgd\n  rank: 2\n  start_step: 10\n",
                        {"--compression.topk_ratio", "0.05", "--compression.error_feedback=false"});
  EXPECT_EQ(c.compression.method, "powersgd");
  EXPECT_EQ(c.compression.rank, 2);
  EXPECT_EQ(c.compression.start_step, 10);
  EXPECT_DOUBLE_EQ(c.compression.topk_ratio, 0.05);
  EXPECT_FALSE(c.compression.error_feedback);
  auto again = parse_config(config_to_yaml(c), {});
  EXPECT_EQ(again.compression.method, "powersgd");
  EXPECT_EQ(again.compression.rank, 2);
  EXPECT_FALSE(again.compression.error_feedback);
  EXPECT_EQ(again.scheduler.name, c.scheduler.name);

  auto a = parse_config("mode: ddp\naveraging:\n  method: local_sgd\n  period: 16\n",
                        {"--averaging.warmup_steps", "100", "--averaging.buffers", "false"});
  EXPECT_EQ(a.averaging.method, "local_sgd");
  EXPECT_EQ(a.averaging.period, 16);
  EXPECT_EQ(a.averaging.warmup_steps, 100);
  EXPECT_FALSE(a.averaging.buffers);
  auto b = parse_config(config_to_yaml(a), {"--averaging.method", "async", "--averaging.max_staleness", "3"});
  EXPECT_EQ(b.averaging.method, "async");
  EXPECT_EQ(b.averaging.max_staleness, 3);
  EXPECT_EQ(b.averaging.period, 16);
}

TEST(TrainerComm, ConfigRefusesWhatCannotWork) {
  auto bad = [](const std::string& yaml, std::vector<std::string> flags = {}) {
    EXPECT_THROW(parse_config(yaml, flags), gz::InvalidArgument) << yaml;
  };
  bad("mode: single\ncompression:\n  method: topk\n");                            // nothing to compress
  bad("mode: horovod\naveraging:\n  method: local_sgd\n");                        // averaging is DDP's
  bad("mode: ddp\ncompression:\n  method: int8\naveraging:\n  method: async\n");  // one or the other
  bad("mode: ddp\ncompression:\n  method: onebit\n");
  bad("mode: ddp\ncompression:\n  topk_ratio: 0\n");
  bad("mode: ddp\naveraging:\n  period: 0\n");
  bad("mode: ddp\ncompressio:\n  method: int8\n");  // a typo'd block
  bad("mode: ddp", {"--averaging.max_staleness", "-1"});
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("gz_trainer_comm_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

struct Outcome {
  std::map<std::string, double> metrics;
  std::vector<std::vector<torch::Tensor>> params;  // per rank
};

// Two ranks train the built-in CNN on separable synthetic blobs (4 classes, chance 0.25).
Outcome run_two_ranks(const std::string& mode, const std::vector<std::string>& flags, const fs::path& dir) {
  const int world = 2;
  Outcome out;
  out.params.resize(world);
  gz::test::run_ranks(world, [&](int rank, std::shared_ptr<gz::Store> store) {
    std::vector<std::string> all{
        "--dataset",     "synthetic", "--train_data",  "512",
        "--test_data",   "128",       "--net_type",    "cnn",
        "--input_size",  "8",         "--in_channels", "1",
        "--num_classes", "4",         "--batch_size",  "16",
        "--num_epochs",  "3",         "--lr",          "0.01",
        "--optimizer",   "adamw",     "--num_workers", "0",
        "--progress",    "false",     "--tensorboard", "false",
        "--mode",        mode,        "--work_dir",    (dir / std::to_string(rank)).string()};
    all.insert(all.end(), flags.begin(), flags.end());
    auto cfg = parse_config("", all);
    gz::comm::ShmOptions so;
    so.timeout = std::chrono::seconds(60);
    Trainer t(cfg, gz::comm::create_shm_communicator(rank, world, store, so));
    auto m = t.train();
    if (rank == 0) out.metrics = m;
    for (auto& p : t.model()->parameters())
      out.params[static_cast<size_t>(rank)].push_back(p.detach().clone());
  });
  return out;
}

struct Case {
  std::string name, mode;
  std::vector<std::string> flags;
  bool fewer_bytes;  // than the plain all-reduce
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
};

class TrainerCommRun : public ::testing::TestWithParam<Case> {};

TEST_P(TrainerCommRun, LearnsWithEqualReplicasAndCountsBytes) {
  TmpDir tmp(GetParam().name);
  auto plain = run_two_ranks("ddp", {}, tmp.path / "plain");
  auto res = run_two_ranks(GetParam().mode, GetParam().flags, tmp.path / "run");
  EXPECT_GT(res.metrics.at("test_accuracy"), 0.8);
  for (size_t i = 0; i < res.params[0].size(); ++i)
    EXPECT_TRUE(torch::equal(res.params[0][i], res.params[1][i]))
        << "param " << i << " differs between the ranks";
  const double bytes = res.metrics.at("comm_bytes_per_step"),
               plain_bytes = plain.metrics.at("comm_bytes_per_step");
  EXPECT_GT(bytes, 0);
  if (GetParam().fewer_bytes) EXPECT_LT(bytes, 0.5 * plain_bytes) << "plain DDP: " << plain_bytes;
  EXPECT_GE(res.metrics.at("eval_seconds"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, TrainerCommRun,
    ::testing::Values(
        Case{"powersgd", "ddp", {"--compression.method", "powersgd", "--compression.rank", "2"}, true},
        Case{"int8_horovod", "horovod", {"--compression.method", "int8"}, true},
        Case{"topk", "ddp", {"--compression.method", "topk", "--compression.topk_ratio", "0.1"}, true},
        // 48 steps: with H = 5 the last step is no average; the final evaluation must average first.
        Case{"local_sgd", "ddp", {"--averaging.method", "local_sgd", "--averaging.period", "5"}, true},
        Case{"async", "ddp", {"--averaging.method", "async", "--averaging.max_staleness", "2"}, false}),
    [](const auto& info) { return info.param.name; });

// With ZeRO the reduce-scatters and all-gathers are the gradient traffic: comm_bytes_per_step counts
// them (it read 0). At two ranks the two blocks of a bucket add up to the padded bucket, what plain
// DDP's all-reduce counts.
TEST(TrainerComm, ZeroCountsItsReduceScattersAndAllGathers) {
  TmpDir tmp("zero_bytes");
  auto plain = run_two_ranks("ddp", {"--num_epochs", "1"}, tmp.path / "plain");
  const double plain_bytes = plain.metrics.at("comm_bytes_per_step");
  ASSERT_GT(plain_bytes, 0);
  for (std::string stage : {"1", "2"}) {
    auto z = run_two_ranks("ddp", {"--num_epochs", "1", "--zero_stage", stage}, tmp.path / ("zero" + stage));
    const double bytes = z.metrics.at("comm_bytes_per_step");
    EXPECT_GE(bytes, plain_bytes) << "stage " << stage;
    EXPECT_LE(bytes, 1.1 * plain_bytes) << "stage " << stage;
  }
}

}  // namespace

}  // namespace test_trainer_comm
