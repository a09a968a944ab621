// Model zoo: shapes, parameter counts against closed forms, clone semantics, registry errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "gz/core/error.h"
#include "gz/train/models/model.h"

using gz::train::create_model;
using gz::train::ModelOptions;

namespace {

int64_t count_params(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

ModelOptions image_options(const std::string& net, int64_t classes, int64_t channels, int64_t size) {
  ModelOptions o;
  o.net_type = net;
  o.num_classes = classes;
  o.in_channels = channels;
  o.input_size = size;
  return o;
}

ModelOptions small_bert() {
  ModelOptions o;
  o.net_type = "bert_small";
  o.num_classes = 3;
  o.vocab_size = 100;
  o.hidden = 32;
  o.layers = 2;
  o.heads = 4;
  o.ffn = 64;
  o.input_size = 16;
  return o;
}

// Closed form of the BERT classifier's parameter count.
int64_t bert_params(const ModelOptions& o) {
  const int64_t h = o.hidden;
  const int64_t emb = o.vocab_size * h + o.input_size * h + 2 * h;
  const int64_t block = (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * o.ffn + o.ffn) + (o.ffn * h + h) + 2 * h;
  return emb + o.layers * block + (h * h + h) + (h * o.num_classes + o.num_classes);
}

// Closed form of a torchvision-style ResNet's parameter count (BN: 2 per channel, convs bias-free).
int64_t resnet_params(const std::vector<int64_t>& blocks, bool bottleneck, int64_t in_ch, int64_t classes,
                      bool big_stem) {
  auto bn = [](int64_t c) { return 2 * c; };
  int64_t n = (big_stem ? 49 : 9) * in_ch * 64 + bn(64);
  const int64_t e = bottleneck ? 4 : 1;
  int64_t in = 64;
  for (size_t s = 0; s < blocks.size(); ++s) {
    const int64_t p = int64_t{64} << s;
    for (int64_t b = 0; b < blocks[s]; ++b) {
      if (bottleneck)
        n += in * p + bn(p) + 9 * p * p + bn(p) + p * p * e + bn(p * e);
      else
        n += 9 * in * p + bn(p) + 9 * p * p + bn(p);
      if ((s > 0 && b == 0) || in != p * e) n += in * p * e + bn(p * e);
      in = p * e;
    }
  }
  return n + in * classes + classes;
}

}  // namespace

TEST(Models, ResNetParameterCounts) {
  struct Case { const char* net; std::vector<int64_t> blocks; bool bottleneck; int64_t torchvision; };
  for (const auto& c : {Case{"resnet18", {2, 2, 2, 2}, false, 11689512}, Case{"resnet34", {3, 4, 6, 3}, false, 21797672},
                        Case{"resnet50", {3, 4, 6, 3}, true, 25557032}}) {
    auto m = create_model(image_options(c.net, 1000, 3, 224));
    EXPECT_EQ(count_params(*m), resnet_params(c.blocks, c.bottleneck, 3, 1000, true)) << c.net;
    EXPECT_EQ(count_params(*m), c.torchvision) << c.net;
    // Small-input stem (3x3 conv, no max pool): a different, still closed-form count.
    auto s = create_model(image_options(c.net, 10, 1, 28));
    EXPECT_EQ(count_params(*s), resnet_params(c.blocks, c.bottleneck, 1, 10, false)) << c.net;
  }
}

TEST(Models, ImageModelShapes) {
  for (const std::string net : {"resnet18", "resnet50", "mobilenet_v2"}) {
    auto small = create_model(image_options(net, 10, 1, 28));
    small->eval();
    EXPECT_EQ(small->forward(torch::randn({2, 1, 28, 28})).sizes(), torch::IntArrayRef({2, 10})) << net;
    auto big = create_model(image_options(net, 5, 3, 64));
    big->eval();
    EXPECT_EQ(big->forward(torch::randn({1, 3, 64, 64})).sizes(), torch::IntArrayRef({1, 5})) << net;
  }
}

TEST(Models, MobileNetV2ParameterCount) {
  auto m = create_model(image_options("mobilenet_v2", 1000, 3, 224));
  // Closed form: stem, 17 inverted residuals (t, c, n, s table), 1x1 conv to 1280, classifier.
  auto bn = [](int64_t c) { return 2 * c; };
  int64_t n = 27 * 32 + bn(32);
  int64_t in = 32;
  const int64_t table[][3] = {{1, 16, 1}, {6, 24, 2}, {6, 32, 3}, {6, 64, 4}, {6, 96, 3}, {6, 160, 3}, {6, 320, 1}};
  for (const auto& row : table) {
    for (int64_t i = 0; i < row[2]; ++i) {
      const int64_t h = in * row[0], out = row[1];
      if (row[0] != 1) n += in * h + bn(h);
      n += 9 * h + bn(h) + h * out + bn(out);
      in = out;
    }
  }
  n += in * 1280 + bn(1280) + 1280 * 1000 + 1000;
  EXPECT_EQ(count_params(*m), n);
  EXPECT_EQ(count_params(*m), 3504872);
}

TEST(Models, CnnShapeAndParameterCount) {
  auto m = create_model(image_options("cnn", 10, 1, 28));
  // conv1 1*32*9+32, conv2 32*64*9+64, fc1 3136*128+128, fc2 128*10+10
  const int64_t expected = (1 * 32 * 9 + 32) + (32 * 64 * 9 + 64) + (64 * 7 * 7 * 128 + 128) + (128 * 10 + 10);
  EXPECT_EQ(count_params(*m), expected);
  EXPECT_EQ(expected, 421642);
  auto y = m->forward(torch::randn({5, 1, 28, 28}));
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({5, 10}));
  // Other shapes follow the options.
  auto m3 = create_model(image_options("cnn", 7, 3, 32));
  EXPECT_EQ(m3->forward(torch::randn({2, 3, 32, 32})).sizes(), torch::IntArrayRef({2, 7}));
}

TEST(Models, BertShapeParameterCountAndPaddingMask) {
  auto o = small_bert();
  auto m = create_model(o);
  EXPECT_EQ(count_params(*m), bert_params(o));
  m->eval();
  auto ids = torch::randint(1, o.vocab_size, {4, 10}, torch::kLong);
  ids.index_put_({0, torch::indexing::Slice(6)}, 0);  // padded tail
  auto y = m->forward(ids);
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({4, 3}));
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  // Padding must not influence the result: changing the padded length keeps row 0 the same.
  auto shorter = ids.index({torch::indexing::Slice(0, 1), torch::indexing::Slice(0, 6)});
  auto padded_more = torch::cat({shorter, torch::zeros({1, 10}, torch::kLong)}, 1);
  EXPECT_TRUE(torch::allclose(m->forward(shorter), y[0].unsqueeze(0), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(m->forward(padded_more), y[0].unsqueeze(0), 1e-4, 1e-5));
  // An all-padding row stays finite.
  EXPECT_TRUE(torch::isfinite(m->forward(torch::zeros({1, 5}, torch::kLong))).all().item<bool>());
  EXPECT_THROW(m->forward(torch::ones({1, 17}, torch::kLong)), gz::InvalidArgument);
  EXPECT_THROW(m->forward(torch::ones({1, 4}, torch::kFloat)), gz::InvalidArgument);
}

TEST(Models, BertDefaultsBackward) {
  ModelOptions o;
  o.net_type = "bert_small";
  o.input_size = 128;
  auto m = create_model(o);
  EXPECT_EQ(count_params(*m), bert_params(o));
  auto y = m->forward(torch::randint(1, 30522, {2, 128}, torch::kLong));
  y.sum().backward();
  for (const auto& p : m->parameters()) ASSERT_TRUE(p.grad().defined());
}

TEST(Models, UnknownNameListsKnown) {
  ModelOptions o;
  o.net_type = "no_such_net";
  try {
    create_model(o);
    FAIL() << "expected InvalidArgument";
  } catch (const gz::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no_such_net"), std::string::npos) << msg;
    for (const auto& name : gz::train::model_names()) EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
}

class ModelZoo : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelZoo, CloneIsEqualAndIndependent) {
  const std::string net = GetParam();
  ModelOptions o = net == "bert_small" ? small_bert() : image_options(net, 10, net == "cnn" ? 1 : 3, net == "cnn" ? 28 : 16);
  auto m = create_model(o);
  torch::Tensor x = net == "bert_small" ? torch::randint(1, o.vocab_size, {2, 8}, torch::kLong)
                                        : torch::randn({2, o.in_channels, o.input_size, o.input_size});
  // Train one step so BatchNorm running stats differ from their initial values.
  m->train();
  m->forward(x).sum().backward();
  m->eval();
  auto c = m->clone_model();
  EXPECT_FALSE(c->is_training());
  auto pa = m->named_parameters(), pc = c->named_parameters();
  ASSERT_EQ(pa.size(), pc.size());
  for (const auto& item : pa) {
    const auto& other = pc[item.key()];
    EXPECT_TRUE(torch::equal(item.value(), other)) << item.key();
    EXPECT_NE(item.value().data_ptr(), other.data_ptr()) << item.key();
  }
  auto ba = m->named_buffers(), bc = c->named_buffers();
  ASSERT_EQ(ba.size(), bc.size());
  for (const auto& item : ba) EXPECT_TRUE(torch::equal(item.value(), bc[item.key()])) << item.key();
  EXPECT_TRUE(torch::equal(m->forward(x), c->forward(x)));
  // Independence: changing the copy leaves the original alone.
  {
    torch::NoGradGuard g;
    for (auto& p : c->parameters()) p.add_(1.0);
  }
  for (const auto& item : pa) EXPECT_FALSE(torch::equal(item.value(), pc[item.key()])) << item.key();
  EXPECT_FALSE(torch::equal(m->forward(x), c->forward(x)));
}

INSTANTIATE_TEST_SUITE_P(All, ModelZoo, ::testing::ValuesIn(gz::train::model_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Timing, not a check: GZ_BENCH=1 ./test_models --gtest_filter=*Timing* prints ms per CNN step.
TEST(Models, CnnStepTiming) {
  if (std::getenv("GZ_BENCH") == nullptr) GTEST_SKIP() << "set GZ_BENCH=1 to time the CNN step";
  torch::set_num_threads(1);
  auto m = create_model(image_options("cnn", 10, 1, 28));
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto x = torch::randn({64, 1, 28, 28});
  auto y = torch::randint(0, 10, {64}, torch::kLong);
  auto step = [&] {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(m->forward(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 5; ++i) step();
  const int iters = 50;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) step();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
  std::printf("[bench] cnn batch 64, 1 thread: %.2f ms/step (forward+backward+SGD), %.0f samples/s\n", ms,
              64 * 1000.0 / ms);
}
