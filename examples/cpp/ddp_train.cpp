// A small data-parallel training program against an installed Guozhuang: each rank trains an MLP on
// its shard of a synthetic regression task (y = sin(x . w*)), gradients averaged by
// gz::DistributedDataParallel while backward runs. Run it with `gzrun --nproc-per-node 2 ./ddp_train`
// (or torchrun, mpirun, srun; one process alone is a world of one).
//
// It checks what data parallelism promises and exits non-zero otherwise: the loss falls, and every
// rank ends with the same parameters.
#include <torch/torch.h>

#include <cstdio>

#include "gz/torch/collectives.h"
#include "gz/torch/ddp.h"
#include "gz/torch/distributed_sampler.h"
#include "gz/torch/process_group.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// The whole data set, the same on every rank (fixed seed); each rank reads its sampler's share.
std::pair<torch::Tensor, torch::Tensor> make_data(int64_t n) {
  torch::manual_seed(1234);
  auto x = torch::randn({n, 16});
  auto w = torch::randn({16, 1}) / 4;
  return {x, torch::sin(x.matmul(w))};
}

}  // namespace

int main() {
  gz::init();  // env:// from gzrun (or torchrun, mpirun, srun)
  const int rank = gz::rank(), world = gz::size();
  auto [x, y] = make_data(4096);

  torch::manual_seed(rank + 1);  // different initial weights: DDP's broadcast must make them equal
  Net net;
  gz::DistributedDataParallel ddp(net.ptr());
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  gz::DistributedSampler sampler(static_cast<size_t>(x.size(0)), world, rank);

  double first = 0, last = 0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    sampler.set_epoch(epoch);
    double sum = 0;
    int64_t batches = 0;
    for (auto idx = sampler.next_batch(32); !idx.empty(); idx = sampler.next_batch(32)) {
      auto i = torch::tensor(std::vector<int64_t>(idx.begin(), idx.end()));
      opt.zero_grad();
      auto out = ddp.forward([&] { return net->forward(x.index_select(0, i)); });
      auto loss = torch::mse_loss(out, y.index_select(0, i));
      loss.backward();  // buckets are all-reduced while backward runs
      opt.step();
      sum += loss.item<double>();
      ++batches;
    }
    auto mean = torch::tensor(sum / batches, torch::kFloat64);
    gz::allreduce(mean);  // the loss over all ranks' batches
    last = mean.item<double>() / world;
    if (epoch == 0) first = last;
    if (rank == 0) std::printf("epoch %d: loss %.5f\n", epoch + 1, last);
  }

  // Every rank must hold rank 0's parameters.
  auto flat = torch::cat({net->fc1->weight.flatten(), net->fc1->bias, net->fc2->weight.flatten(), net->fc2->bias});
  auto root = flat.clone();
  gz::broadcast(root, 0);
  const bool same = torch::equal(flat, root);
  const bool learned = last < 0.5 * first;
  if (rank == 0 || !same) {
    std::printf("rank %d/%d: loss %.5f -> %.5f (%s), parameters %s rank 0's\n", rank, world, first, last,
                learned ? "learned" : "did NOT learn", same ? "equal to" : "DIFFER from");
  }
  gz::shutdown();
  return same && learned ? 0 : 1;
}
