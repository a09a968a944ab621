// Helpers shared by the torch front-end tests: communicators for rank threads, tiny models, checks.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>

#include "support/run_ranks.h"
#include "gz/comm/factory.h"

namespace gz::test {

/// @brief Communicator of one rank thread: the real shm backend through the factory.
inline comm::CommPtr make_comm(int rank, int world, std::shared_ptr<Store> store,
                               Duration timeout = std::chrono::seconds(30)) {
  comm::CommOptions o;
  o.backend = "shm";
  o.rank = rank;
  o.size = world;
  o.store = std::move(store);
  o.timeout = timeout;
  return comm::create_communicator(o);
}

/// @brief A tiny MLP; `extra` adds a parameter the forward never uses.
struct MlpImpl : torch::nn::Cloneable<MlpImpl> {
  explicit MlpImpl(bool extra = false) : extra_(extra) { reset(); }
  void reset() override {
    l1 = register_module("l1", torch::nn::Linear(8, 16));
    l2 = register_module("l2", torch::nn::Linear(16, 4));
    if (extra_) unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return l2->forward(torch::tanh(l1->forward(x))); }
  bool extra_;
  torch::nn::Linear l1{nullptr}, l2{nullptr}, unused{nullptr};
};
TORCH_MODULE(Mlp);

/// @brief An MLP whose `side` layer joins the forward only when asked (a parameter used in some
/// micro-steps only). Same initial weights every time.
struct SideImpl : torch::nn::Module {
  SideImpl() {
    torch::manual_seed(21);
    l1 = register_module("l1", torch::nn::Linear(8, 16));
    l2 = register_module("l2", torch::nn::Linear(16, 4));
    side = register_module("side", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool with_side) {
    auto y = l2->forward(torch::tanh(l1->forward(x)));
    return with_side ? y + side->forward(y) : y;
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, side{nullptr};
};
TORCH_MODULE(Side);

/// @brief `n` identical MLPs (same seed), made on the calling thread (the RNG is global).
inline std::vector<Mlp> make_mlps(int n, bool extra = false) {
  std::vector<Mlp> out;
  for (int i = 0; i < n; ++i) {
    torch::manual_seed(1234);
    out.emplace_back(Mlp(extra));
  }
  return out;
}

/// @brief Max |a-b| / max |b| over all parameters.
inline double max_rel_diff(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    double scale = std::max(pb[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

/// @brief Deterministic data: steps x [rows, 8] inputs and [rows, 4] targets.
struct Data {
  std::vector<torch::Tensor> x, y;
};
inline Data make_data(int steps, int64_t rows, uint64_t seed = 7) {
  torch::manual_seed(seed);
  Data d;
  for (int s = 0; s < steps; ++s) {
    d.x.push_back(torch::randn({rows, 8}));
    d.y.push_back(torch::randn({rows, 4}));
  }
  return d;
}

/// @brief Rows [r*b, (r+1)*b) of t.
inline torch::Tensor shard(const torch::Tensor& t, int r, int64_t b) { return t.narrow(0, r * b, b); }

/// @brief The single-process reference: `steps` SGD(0.1) steps on the whole batch, each summing the
/// MSE gradients of `micro` consecutive batches of d; `forward(x)` runs the model.
template <typename Forward>
void train_reference(torch::nn::Module& m, const Data& d, int steps, Forward forward, int micro = 1) {
  torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    for (int k = 0; k < micro; ++k)
      torch::mse_loss(forward(d.x[s * micro + k]), d.y[s * micro + k]).backward();
    opt.step();
  }
}

}  // namespace gz::test
