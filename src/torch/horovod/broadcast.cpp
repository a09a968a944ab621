// Horovod mode's start-of-training helpers: every rank begins from root's parameters, buffers and
// optimizer state.
#include <torch/serialize.h>

#include <sstream>

#include "gz/torch/distributed_optimizer.h"
#include "gz/torch/process_group.h"
#include "gz/torch/tensor_adapter.h"

namespace gz {

void broadcast_parameters(const NamedParameters& params, int root, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params) {
    TensorSpan s(p.detach(), *g, "broadcast_parameters");
    g->broadcast(s.data(), s.count(), s.dtype(), root);
    s.finish();
  }
}

void broadcast_parameters(torch::nn::Module& module, int root, const comm::CommPtr& group) {
  NamedParameters all;
  for (auto& item : module.named_parameters()) all.emplace_back(item.key(), item.value());
  for (auto& item : module.named_buffers()) all.emplace_back(item.key(), item.value());
  broadcast_parameters(all, root, group);
}

void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  // Serialise on root with the optimizer's own archive format (state by parameter position and the
  // groups' hyper-parameters), ship the bytes, load everywhere else.
  std::string bytes;
  if (g->rank() == root) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream os;
    archive.save_to(os);
    bytes = os.str();
  }
  int64_t len = static_cast<int64_t>(bytes.size());
  g->broadcast(&len, 1, DType::i64, root);
  bytes.resize(static_cast<size_t>(len));
  g->broadcast(bytes.data(), bytes.size(), DType::u8, root);
  if (g->rank() != root) {
    std::istringstream is(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(is);
    optimizer.load(archive);
  }
}

}  // namespace gz
