#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "gz/core/error.h"
#include "gz/train/config.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_config {

using gz::train::parse_config;
using gz::train::TrainConfig;

namespace {

// Expect an InvalidArgument whose message contains every fragment.
template <typename Fn>
void expect_error(Fn fn, std::vector<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const gz::InvalidArgument& e) {
    std::string msg = e.what();
    for (auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

}  // namespace

TEST(Config, DefaultsAndYaml) {
  TrainConfig d;
  auto c = parse_config(
      "lr: 0.01\n"
      "batch_size: 32\n"
      "optimizer: sgd\n"
      "augment: true\n"
      "mode: ddp\n"
      "scheduler:\n"
      "  name: multi_step\n"
      "  milestones: [3, 6]\n"
      "  gamma: 0.2\n"
      "  warmup_steps: 10\n",
      {});
  EXPECT_DOUBLE_EQ(c.lr, 0.01);
  EXPECT_EQ(c.batch_size, 32);
  EXPECT_EQ(c.optimizer, "sgd");
  EXPECT_TRUE(c.augment);
  EXPECT_EQ(c.mode, "ddp");
  EXPECT_EQ(c.scheduler.name, "multi_step");
  EXPECT_EQ(c.scheduler.milestones, (std::vector<int64_t>{3, 6}));
  EXPECT_DOUBLE_EQ(c.scheduler.gamma, 0.2);
  EXPECT_EQ(c.scheduler.warmup_steps, 10);
  EXPECT_EQ(c.num_epochs, d.num_epochs);  // untouched keys keep defaults
}

TEST(Config, FlagsOverrideYaml) {
  auto c = parse_config("lr: 0.01\nscheduler:\n  warmup_steps: 10\n",
                        {"--lr", "0.5", "--scheduler.warmup_steps=7", "--augment", "--batch-size", "16",
                         "--scheduler.milestones", "1,2,5", "--progress=false"});
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_EQ(c.scheduler.warmup_steps, 7);
  EXPECT_TRUE(c.augment);
  EXPECT_EQ(c.batch_size, 16);
  EXPECT_EQ(c.scheduler.milestones, (std::vector<int64_t>{1, 2, 5}));
  EXPECT_FALSE(c.progress);
}

TEST(Config, RoundTripThroughYaml) {
  auto c = parse_config("lr: 0.00123\nnet_type: resnet18\nscheduler:\n  milestones: [4, 9]\n", {"--seed", "7"});
  auto back = parse_config(gz::train::config_to_yaml(c), {});
  EXPECT_EQ(gz::train::config_to_yaml(back), gz::train::config_to_yaml(c));
  EXPECT_DOUBLE_EQ(back.lr, 0.00123);
  EXPECT_EQ(back.net_type, "resnet18");
  EXPECT_EQ(back.seed, 7);
  EXPECT_EQ(back.scheduler.milestones, (std::vector<int64_t>{4, 9}));
}

TEST(Config, SaveAndLoadFile) {
  auto dir = std::filesystem::temp_directory_path() / ("gz_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto c = parse_config("lr: 0.02\n", {});
  gz::train::save_config(c, (dir / "config.yaml").string());
  auto back = gz::train::load_config((dir / "config.yaml").string(), {"--batch_size", "8"});
  EXPECT_DOUBLE_EQ(back.lr, 0.02);
  EXPECT_EQ(back.batch_size, 8);
  std::filesystem::remove_all(dir);
}

TEST(Config, ErrorsNameTheKeyAndSource) {
  expect_error([] { parse_config("lrr: 0.1\n", {}, "a.yaml"); }, {"lrr", "a.yaml", "line 1", "unknown"});
  expect_error([] { parse_config("lr: fast\n", {}, "a.yaml"); }, {"'lr'", "a.yaml", "number", "fast"});
  expect_error([] { parse_config("batch_size: 3.5\n", {}, "a.yaml"); }, {"'batch_size'", "integer"});
  expect_error([] { parse_config("batch_size: 0\n", {}, "a.yaml"); }, {"'batch_size'", ">= 1"});
  expect_error([] { parse_config("lr: -1\n", {}, "a.yaml"); }, {"'lr'", "> 0"});
  expect_error([] { parse_config("optimizer: lamb\n", {}, "a.yaml"); }, {"'optimizer'", "sgd", "lamb"});
  expect_error([] { parse_config("augment: maybe\n", {}, "a.yaml"); }, {"'augment'", "boolean"});
  expect_error([] { parse_config("mode: mpi\n", {}, "a.yaml"); }, {"'mode'", "ddp"});
  expect_error([] { parse_config("scheduler:\n  nme: cosine\n", {}, "a.yaml"); }, {"scheduler.nme", "unknown"});
  expect_error([] { parse_config("scheduler:\n  milestones: [5, 2]\n", {}, "a.yaml"); }, {"milestones", "increasing"});
  expect_error([] { parse_config("scheduler:\n  milestones: [a]\n", {}, "a.yaml"); }, {"milestones"});
  expect_error([] { parse_config("lr: [1, 2]\n", {}, "a.yaml"); }, {"'lr'", "list"});
  expect_error([] { parse_config("model:\n  x: 1\n", {}, "a.yaml"); }, {"model", "unknown"});
  expect_error([] { parse_config("- 1\n- 2\n", {}, "a.yaml"); }, {"a.yaml", "mapping"});
  expect_error([] { parse_config("lr: [1\n", {}, "a.yaml"); }, {"a.yaml"});
  expect_error([] { parse_config("", {"--nope", "1"}); }, {"nope", "flag"});
  expect_error([] { parse_config("", {"--lr"}); }, {"'lr'", "flag --lr", "missing value"});
  expect_error([] { parse_config("", {"--lr", "x"}); }, {"'lr'", "flag --lr"});
  expect_error([] { parse_config("", {"lr", "0.1"}); }, {"unexpected argument"});
  expect_error([] { parse_config("", {"--dropout", "1.5"}); }, {"'dropout'", "[0, 1]"});
  expect_error([] { parse_config("", {"--mixed_precision", "fp16"}); }, {"mixed_precision", "cuda"});
  expect_error([] { parse_config("", {"--mixed_precision", "fp8"}); }, {"mixed_precision", "fp8"});
  expect_error([] { gz::train::load_config("/nonexistent/x.yaml", {}); }, {"/nonexistent/x.yaml"});
}

TEST(Config, KeysCoverTheSpec) {
  auto keys = gz::train::config_keys();
  for (const char* k : {"train_data", "test_data", "work_dir", "net_type", "input_size", "num_classes", "batch_size",
                        "lr", "optimizer", "momentum", "weight_decay", "loss", "scheduler.name",
                        "scheduler.warmup_steps", "scheduler.warmup_epochs", "num_epochs", "max_steps",
                        "gradient_accumulation_steps", "eval_steps", "save_steps", "save_total_limit",
                        "metric_for_best_model", "greater_is_better", "log_every", "seed", "num_workers", "mode",
                        "mixed_precision", "finetune", "resume_from_checkpoint", "progress",
                        "early_stopping_patience", "augment"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
}

TEST(Config, NonScalarKeyIsAnErrorNamingTheLine) {
  // yaml-cpp's as<std::string>() on these keys throws YAML::BadConversion; it used to escape
  // parse_config and terminate gz-train.
  expect_error([] { parse_config("lr: 0.1\n? [a, b]\n: 1\n", {}, "a.yaml"); }, {"a.yaml", "line 2", "list", "key"});
  expect_error([] { parse_config("lr: 0.1\nbatch_size: 4\n{x: 1}: 2\n", {}, "a.yaml"); },
               {"a.yaml", "line 3", "mapping", "key"});
  expect_error([] { parse_config("scheduler:\n  name: cosine\n  [1]: 2\n", {}, "a.yaml"); },
               {"a.yaml", "line 3", "key"});
}

TEST(Config, ZeroStageNeedsDdp) {
  EXPECT_EQ(parse_config("mode: ddp\nzero_stage: 2\n", {}, "a.yaml").zero_stage, 2);
  EXPECT_EQ(parse_config("mode: ddp\n", {"--zero_stage", "1"}).zero_stage, 1);
  EXPECT_EQ(parse_config("", {}).zero_stage, 0);
  EXPECT_EQ(parse_config("mode: ddp\nzero_stage: 3\n", {}, "a.yaml").zero_stage, 3);
  expect_error([] { parse_config("mode: ddp\nzero_stage: 4\n", {}, "a.yaml"); }, {"'zero_stage'", "0, 1, 2 or 3"});
  // Stage 3 releases the parameters' memory between steps; pruning masks them in place after one.
  expect_error([] { parse_config("mode: ddp\nzero_stage: 3\nprune_sparsity: 0.5\n", {}, "a.yaml"); },
               {"'prune_sparsity'", "zero_stage 3"});
  EXPECT_EQ(parse_config("mode: ddp\nzero_stage: 2\nprune_sparsity: 0.5\n", {}, "a.yaml").zero_stage, 2);
  // Stage 3 applies compression fp16/bf16 (its reduce dtype) from step 0; nothing else, nor stages 1-2.
  EXPECT_EQ(parse_config("mode: ddp\nzero_stage: 3\ncompression:\n  method: bf16\n", {}, "a.yaml").zero_stage,
            3);
  expect_error(
      [] { parse_config("mode: ddp\nzero_stage: 3\ncompression:\n  method: powersgd\n", {}, "a.yaml"); },
      {"'zero_stage'", "powersgd", "fp16 or bf16"});
  expect_error(
      [] {
        parse_config("mode: ddp\nzero_stage: 2\n", {"--compression.method", "fp16"});
      },
      {"'zero_stage'", "fp16"});
  expect_error(
      [] {
        parse_config("mode: ddp\nzero_stage: 3\n",
                     {"--compression.method", "bf16", "--compression.start_step", "5"});
      },
      {"'zero_stage'", "from step 5"});
  expect_error([] { parse_config("zero_stage: 1\n", {}, "a.yaml"); }, {"'zero_stage'", "mode: ddp", "single"});
  expect_error([] { parse_config("mode: horovod\n", {"--zero_stage", "2"}); }, {"'zero_stage'", "horovod"});
}

TEST(Config, FsdpPrefetch) {
  EXPECT_TRUE(parse_config("", {}).fsdp_prefetch);
  EXPECT_FALSE(parse_config("mode: ddp\nzero_stage: 3\nfsdp_prefetch: false\n", {}, "a.yaml").fsdp_prefetch);
  EXPECT_FALSE(parse_config("mode: ddp\n", {"--fsdp_prefetch", "false"}).fsdp_prefetch);
  expect_error([] { parse_config("fsdp_prefetch: maybe\n", {}, "a.yaml"); }, {"'fsdp_prefetch'", "boolean"});
  // The key round-trips through the config file a run writes.
  auto c = parse_config("", {"--fsdp_prefetch", "off"});
  EXPECT_FALSE(parse_config(gz::train::config_to_yaml(c), {}).fsdp_prefetch);
}

TEST(Config, CheckpointFormatAutoIsShardedWithZero) {
  EXPECT_FALSE(sharded_checkpoints(parse_config("", {})));
  EXPECT_TRUE(sharded_checkpoints(parse_config("mode: ddp\nzero_stage: 1\n", {})));
  EXPECT_TRUE(
      sharded_checkpoints(parse_config("mode: ddp\nzero_stage: 3\n", {"--checkpoint_format", "sharded"})));
  EXPECT_FALSE(
      sharded_checkpoints(parse_config("mode: ddp\nzero_stage: 2\ncheckpoint_format: consolidated\n", {})));
  expect_error([] { parse_config("checkpoint_format: sharded\n", {}, "a.yaml"); },
               {"'checkpoint_format'", "a.yaml", "zero_stage 1, 2 or 3"});
  expect_error([] { parse_config("", {"--checkpoint_format", "zip"}); }, {"'checkpoint_format'", "zip"});
  TrainConfig c;  // built in code, not parsed: the Trainer's check is the same rule
  c.checkpoint_format = "sharded";
  expect_error([&] { sharded_checkpoints(c); }, {"'checkpoint_format'", "zero_stage 1, 2 or 3"});
}

}  // namespace test_config
