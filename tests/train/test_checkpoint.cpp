#include <gtest/gtest.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "gz/core/error.h"
#include "gz/train/checkpoint.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_checkpoint {

namespace fs = std::filesystem;
using gz::train::CheckpointManager;

namespace {

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("gz_ckpt_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

torch::serialize::OutputArchive archive_with(double v) {
  torch::serialize::OutputArchive a;
  a.write("value", torch::tensor({v}, torch::kFloat64));
  return a;
}

double read_value(const std::string& dir) {
  torch::serialize::InputArchive in;
  CheckpointManager::open(dir, in);
  torch::Tensor t;
  in.read("value", t);
  return t.item<double>();
}

struct Net : torch::nn::Module {
  explicit Net(int64_t hidden) {
    fc1 = register_module("fc1", torch::nn::Linear(4, hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 3));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

}  // namespace

TEST(Checkpoint, RotationKeepsLimitAndBest) {
  TmpDir tmp("rot");
  CheckpointManager m(tmp.path.string(), 2, "test_accuracy", true);
  // Accuracy peaks at step 20; steps 10..60 saved with limit 2.
  std::map<int64_t, double> acc{{10, 0.5}, {20, 0.9}, {30, 0.7}, {40, 0.8}, {50, 0.6}, {60, 0.85}};
  for (auto& [step, a] : acc) {
    auto arch = archive_with(static_cast<double>(step));
    m.save(arch, step, step / 10, {{"test_accuracy", a}});
  }
  auto all = m.list();
  std::vector<int64_t> steps;
  for (auto& c : all) steps.push_back(c.step);
  // The best (20) survives rotation besides the newest; at most limit+1 when the best is old.
  EXPECT_EQ(steps, (std::vector<int64_t>{20, 60}));
  ASSERT_TRUE(m.best());
  EXPECT_EQ(m.best()->step, 20);
  EXPECT_DOUBLE_EQ(m.best()->metrics.at("test_accuracy"), 0.9);
  EXPECT_EQ(m.latest()->step, 60);
  EXPECT_DOUBLE_EQ(read_value(m.latest()->dir), 60.0);
}

TEST(Checkpoint, LowerIsBetter) {
  TmpDir tmp("low");
  CheckpointManager m(tmp.path.string(), 3, "test_loss", false);
  std::vector<double> losses{0.9, 0.4, 0.6, 0.5, 0.7};
  for (size_t i = 0; i < losses.size(); ++i) {
    auto arch = archive_with(static_cast<double>(i));
    m.save(arch, static_cast<int64_t>(i + 1), 0, {{"test_loss", losses[i]}});
  }
  EXPECT_EQ(m.best()->step, 2);
  std::vector<int64_t> steps;
  for (auto& c : m.list()) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 5}));
}

TEST(Checkpoint, InterruptedSaveDoesNotCorruptLatest) {
  TmpDir tmp("crash");
  CheckpointManager m(tmp.path.string(), 5, "", true);
  auto a = archive_with(1.0);
  m.save(a, 100, 1, {});
  // A crash in the middle of saving step 200: a temp dir with a torn state file and no manifest,
  // plus a half-renamed checkpoint dir without a manifest.
  fs::create_directories(tmp.path / ".checkpoint-00000200.tmp-999-0");
  std::ofstream(tmp.path / ".checkpoint-00000200.tmp-999-0" / "state.pt") << "PK\x03\x04 torn";
  fs::create_directories(tmp.path / "checkpoint-00000300");
  std::ofstream(tmp.path / "checkpoint-00000300" / "state.pt") << "garbage";
  ASSERT_TRUE(m.latest());
  EXPECT_EQ(m.latest()->step, 100);
  EXPECT_DOUBLE_EQ(read_value(m.latest()->dir), 1.0);
  m.remove_temp_dirs();
  EXPECT_FALSE(fs::exists(tmp.path / ".checkpoint-00000200.tmp-999-0"));
  // Saving the same step again replaces it whole.
  auto b = archive_with(2.0);
  m.save(b, 100, 1, {});
  EXPECT_DOUBLE_EQ(read_value(m.latest()->dir), 2.0);
}

TEST(Checkpoint, MetricNamesAreEscapedInTheManifest) {
  TmpDir tmp("json");
  CheckpointManager m(tmp.path.string(), 5, "", true);
  const std::map<std::string, double> metrics{
      {"quote\"d", 0.5}, {"back\\slash", 1.5}, {"new\nline", -2.25}, {"tab\tand \x01 control", 1e-300}, {"plain", 3}};
  auto with_nan = metrics;
  with_nan["not finite"] = std::numeric_limits<double>::quiet_NaN();
  auto a = archive_with(1.0);
  m.save(a, 7, 1, with_nan);
  // Before, such a manifest did not parse and the checkpoint was silently skipped.
  auto all = m.list();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].step, 7);
  EXPECT_EQ(all[0].metrics, metrics);  // exact doubles; the NaN is stored as null and dropped
}

TEST(Checkpoint, ReplacingAStepLeavesAlwaysACompleteCopy) {
  // A crash in the middle of replacing checkpoint-100 (a resumed run saving the same step) must
  // leave a complete checkpoint of step 100, before and after cleaning up temp dirs.
  for (bool refuse_exchange : {false, true}) {
    SCOPED_TRACE(refuse_exchange ? "fallback: two renames" : "renameat2(RENAME_EXCHANGE)");
    TmpDir tmp(refuse_exchange ? "repl_fb" : "repl_ex");
    CheckpointManager m(tmp.path.string(), 5, "", true);
    gz::train::CheckpointTestHooks hooks;
    hooks.refuse_rename_exchange = refuse_exchange;
    auto first = archive_with(1.0);
    m.save(first, 100, 1, {});
    hooks.mid_replace = [] { throw std::runtime_error("simulated crash"); };
    m.set_test_hooks(hooks);
    auto second = archive_with(2.0);
    EXPECT_THROW(m.save(second, 100, 1, {}), std::runtime_error);
    // The exchange is atomic: the new copy is in place. The fallback has moved the old one aside.
    const double expected = refuse_exchange ? 1.0 : 2.0;
    CheckpointManager after(tmp.path.string(), 5, "", true);
    ASSERT_TRUE(after.latest());
    EXPECT_EQ(after.latest()->step, 100);
    EXPECT_DOUBLE_EQ(read_value(after.latest()->dir), expected);
    EXPECT_EQ(after.list().size(), 1u);
    after.remove_temp_dirs();
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(tmp.path)) names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"checkpoint-00000100"});
    EXPECT_DOUBLE_EQ(read_value(after.latest()->dir), expected);
    // And saving the step once more goes through.
    hooks.mid_replace = nullptr;
    m.set_test_hooks(hooks);
    auto third = archive_with(3.0);
    m.save(third, 100, 1, {});
    EXPECT_DOUBLE_EQ(read_value(after.latest()->dir), 3.0);
    EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()), 1);
  }
}

TEST(Checkpoint, OpenLatestSkipsADamagedNewest) {
  TmpDir tmp("openlatest");
  CheckpointManager m(tmp.path.string(), 5, "", true);
  for (int64_t step : {10, 20, 30}) {
    auto a = archive_with(static_cast<double>(step));
    m.save(a, step, 0, {});
  }
  const auto s30 = m.find(30)->state_file(), s20 = m.find(20)->state_file();
  fs::resize_file(s30, fs::file_size(s30) - 1);  // truncated
  {
    std::fstream f(s20, std::ios::in | std::ios::out | std::ios::binary);  // same size, garbage
    f << "garbage!";
  }
  torch::serialize::InputArchive in;
  testing::internal::CaptureStderr();
  auto info = m.open_latest(in);
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->step, 10);
  torch::Tensor t;
  in.read("value", t);
  EXPECT_DOUBLE_EQ(t.item<double>(), 10.0);
  EXPECT_NE(log.find(m.find(30)->dir), std::string::npos) << log;
  EXPECT_NE(log.find(m.find(20)->dir), std::string::npos) << log;
}

TEST(Checkpoint, TruncatedFileIsAClearError) {
  TmpDir tmp("trunc");
  CheckpointManager m(tmp.path.string(), 5, "", true);
  auto a = archive_with(1.0);
  auto dir = m.save(a, 1, 0, {});
  auto state = dir + "/state.pt";
  fs::resize_file(state, fs::file_size(state) / 2);
  torch::serialize::InputArchive in;
  try {
    CheckpointManager::open(dir, in);
    FAIL() << "no error";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find(state), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  // The file alone (no manifest to compare with): the archive reader's failure, still named.
  try {
    CheckpointManager::open(state, in);
    FAIL() << "no error";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find(state), std::string::npos) << e.what();
  }
  try {
    CheckpointManager::open((tmp.path / "missing").string(), in);
    FAIL() << "no error";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, ModuleStateRoundTripAndShapeMismatch) {
  TmpDir tmp("mod");
  torch::manual_seed(1);
  Net a(8), b(8), wrong(6);
  a.bn->running_mean.fill_(0.25);
  torch::serialize::OutputArchive out;
  gz::train::save_module_state(a, out);
  auto file = (tmp.path / "m.pt").string();
  out.save_to(file);
  torch::serialize::InputArchive in;
  in.load_from(file);
  gz::train::load_module_state(b, in, file);
  for (size_t i = 0; i < a.parameters().size(); ++i) EXPECT_TRUE(torch::equal(a.parameters()[i], b.parameters()[i]));
  EXPECT_TRUE(torch::equal(a.bn->running_mean, b.bn->running_mean));
  auto before = wrong.parameters()[0].clone();
  try {
    gz::train::load_module_state(wrong, in, file);
    FAIL() << "no error";
  } catch (const gz::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find("fc1.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  }
  EXPECT_TRUE(torch::equal(before, wrong.parameters()[0]));  // nothing changed
}

}  // namespace test_checkpoint
