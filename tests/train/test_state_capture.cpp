// StateCapture and CaptureRing: a snapshot's copy of the state, whose archive the writer's thread
// builds while the training thread goes on, restores what the archive of the live state at that
// moment restores (today's path), bit for bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "../../src/torch/torch_compat.h"  // the optimizer's state of a parameter
#include "../../src/train/recovery/state_capture.h"
#include "gz/torch/fused_adamw.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_state_capture {

using namespace gz::train;

namespace {

// Parameters and buffers (batch norm's running statistics change with every forward).
torch::nn::Sequential make_net(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::BatchNorm1d(5), torch::nn::ReLU(),
                               torch::nn::Linear(5, 3));
}

void train_step(torch::nn::Sequential& net, torch::optim::Optimizer& opt) {
  opt.zero_grad();
  net->forward(torch::randn({4, 6})).square().mean().backward();
  opt.step();
}

TrainingState live_state(const torch::nn::Sequential& net, const torch::optim::Optimizer& opt, int64_t step) {
  TrainingState s;
  s.model = module_tensors(*net);
  s.optimizer = &opt;
  s.rng = torch::randint(0, 255, {16}, torch::kUInt8);
  s.counters = {step, 0, 0, 0, 1, 100, 4, 1, 4 * step, 4 * step, 4};
  s.best_metric = 0.5 + static_cast<double>(step);
  return s;
}

std::string archive_of(const TrainingState& state) {
  torch::serialize::OutputArchive root;
  write_training_state(state, root);
  std::string bytes;
  root.save_to([&bytes](const void* p, size_t n) {
    bytes.append(static_cast<const char*>(p), n);
    return n;
  });
  return bytes;
}

// What `bytes` restores into a fresh model and optimizer `make_opt` builds: every parameter and
// buffer, each parameter's optimizer state (tensors and step counts) in parameter order, the
// scaler, counters, best metric and RNG state.
template <typename MakeOpt>
std::vector<torch::Tensor> restored(const std::string& bytes, MakeOpt make_opt) {
  auto net = make_net(77);  // other values: all must come from the archive
  auto opt = make_opt(net->parameters());
  torch::serialize::InputArchive root, model, optimizer, scaler;
  root.load_from(bytes.data(), bytes.size());
  root.read("model", model);
  load_module_state(*net, model, "test");
  root.read("optimizer", optimizer);
  opt->load(optimizer);
  std::vector<torch::Tensor> out;
  for (const auto& t : module_tensors(*net)) out.push_back(t.tensor.clone());
  for (const auto& p : net->parameters()) {
    auto* st = gz::torch_compat::param_state(*opt, p);
    if (!st) continue;
    torch::serialize::OutputArchive a;
    st->serialize(a);
    std::string s;
    a.save_to([&s](const void* d, size_t n) {
      s.append(static_cast<const char*>(d), n);
      return n;
    });
    torch::serialize::InputArchive in;
    in.load_from(s.data(), s.size());
    for (const auto& key : in.keys()) {
      c10::IValue v;
      in.read(key, v);
      out.push_back(v.isTensor() ? v.toTensor().clone() : torch::tensor({v.toInt()}));
    }
  }
  root.read("scaler", scaler);
  for (const char* key : {"scale", "growth_tracker"}) {
    torch::Tensor t;
    scaler.read(key, t);
    out.push_back(t);
  }
  for (const char* key : {"counters", "best_metric", "rng_cpu"}) {
    torch::Tensor t;
    root.read(key, t);
    out.push_back(t);
  }
  return out;
}

void expect_equal(const std::vector<torch::Tensor>& want, const std::vector<torch::Tensor>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(want[i].sizes() == got[i].sizes() && torch::equal(want[i], got[i]))
        << "tensor " << i << " differs";
}

// Steps twice, captures, then steps on as the training thread does while the writer has not yet
// built the capture's archive: that archive must restore the state of the capture's moment, as
// the archive of the live state then did. Then captures again into the same buffers.
template <typename MakeOpt>
void check_capture(MakeOpt make_opt) {
  auto net = make_net(1);
  auto opt = make_opt(net->parameters());
  train_step(net, *opt);
  train_step(net, *opt);
  StateCapture capture;
  TrainingState live = live_state(net, *opt, 2);
  ASSERT_EQ(StateCapture::unsupported(live), "");
  const std::string today = archive_of(live);
  capture.capture(live);
  const void* first_buffer = capture.state().model.front().tensor.data_ptr();
  train_step(net, *opt);  // the live tensors change in place
  {
    SCOPED_TRACE("the capture, read after the next step");
    expect_equal(restored(today, make_opt), restored(archive_of(capture.state()), make_opt));
  }
  live = live_state(net, *opt, 3);
  const std::string today3 = archive_of(live);
  capture.capture(live);
  EXPECT_EQ(capture.state().model.front().tensor.data_ptr(), first_buffer) << "a buffer was allocated again";
  train_step(net, *opt);
  SCOPED_TRACE("the second capture into the same buffers");
  expect_equal(restored(today3, make_opt), restored(archive_of(capture.state()), make_opt));
}

}  // namespace

// Mutation check: copy_tensor() keeping a reference to the live tensor (`dst = src`, the writer
// reading live memory) fails all three on the first comparison (parameters, buffers and the
// optimizer's moments of step 3, not 2).
TEST(StateCapture, TheCaptureRestoresItsMomentAfterTheModelSteppedOnAdamW) {
  check_capture([](std::vector<torch::Tensor> params) {
    return std::make_unique<gz::FusedAdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  });
}

TEST(StateCapture, TheCaptureRestoresItsMomentAfterTheModelSteppedOnAdam) {
  check_capture([](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01).amsgrad(true));
  });
}

TEST(StateCapture, TheCaptureRestoresItsMomentAfterTheModelSteppedOnSgd) {
  check_capture([](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

TEST(StateCapture, AnOptimizerItCannotCopyIsNamed) {
  auto net = make_net(1);
  torch::optim::RMSprop opt(net->parameters(), torch::optim::RMSpropOptions(0.01));
  const std::string why = StateCapture::unsupported(live_state(net, opt, 0));
  EXPECT_NE(why.find("RMSprop"), std::string::npos) << why;
}

// Mutation check: acquire() not waiting for release() lets the second acquire return at once.
TEST(CaptureRing, ACaptureIsNotReusedBeforeTheWriterReleasesIt) {
  CaptureRing ring(1);
  StateCapture& first = ring.acquire();
  std::atomic<bool> got{false};
  std::thread next([&] {
    StateCapture& again = ring.acquire();
    got = true;
    EXPECT_EQ(&again, &first);
    ring.release(again);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got) << "a capture the writer still reads was handed out again";
  ring.release(first);
  next.join();
  EXPECT_TRUE(got);
  CaptureRing two(2);
  StateCapture& a = two.acquire();
  StateCapture& b = two.acquire();  // the second one while the first is still read
  EXPECT_NE(&a, &b);
  two.release(a);
  two.release(b);
}

}  // namespace test_state_capture
