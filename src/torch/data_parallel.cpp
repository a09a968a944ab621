#include "gz/torch/data_parallel.h"

#include <exception>
#include <thread>

#include "gz/core/error.h"

namespace gz {

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, CloneFn clone, ForwardFn forward,
                           DataParallelOptions options)
    : module_(std::move(module)), forward_(std::move(forward)), options_(std::move(options)) {
  if (!module_) GZ_THROW(InvalidArgument, "DataParallel: null module");
  if (!forward_) GZ_THROW(InvalidArgument, "DataParallel: empty forward function");
  if (options_.devices.empty()) options_.devices = {torch::Device(torch::kCPU), torch::Device(torch::kCPU)};
  for (auto& d : options_.devices)
    if (d.is_cuda() && !torch::cuda::is_available())
      GZ_THROW(InvalidArgument, "DataParallel: device ", d.str(), " requested but CUDA is not available");
  replicas_.push_back(module_);
  for (size_t i = 1; i < options_.devices.size(); ++i) {
    auto r = clone ? clone(*module_, options_.devices[i]) : module_->clone(options_.devices[i]);
    if (!r) GZ_THROW(InvalidArgument, "DataParallel: clone function returned null for replica ", i);
    r->to(options_.devices[i]);
    replicas_.push_back(std::move(r));
  }
  for (auto& r : replicas_) {
    params_.push_back(r->parameters());
    buffers_.push_back(r->buffers());
    if (params_.back().size() != params_.front().size() || buffers_.back().size() != buffers_.front().size())
      GZ_THROW(InvalidArgument, "DataParallel: replica has ", params_.back().size(), " parameters and ",
               buffers_.back().size(), " buffers, the master ", params_.front().size(), " and ",
               buffers_.front().size());
  }
  sync_replicas();
}

DataParallel::~DataParallel() = default;

void DataParallel::sync_replicas() {
  torch::NoGradGuard no_grad;
  for (size_t r = 1; r < replicas_.size(); ++r) {
    for (size_t i = 0; i < params_[0].size(); ++i) params_[r][i].copy_(params_[0][i]);
    for (size_t i = 0; i < buffers_[0].size(); ++i) buffers_[r][i].copy_(buffers_[0][i]);
  }
}

torch::Tensor DataParallel::forward(const torch::Tensor& input) {
  sync_replicas();
  const size_t n = replicas_.size();
  auto chunks = input.chunk(static_cast<int64_t>(n), options_.dim);
  const size_t used = chunks.size();  // fewer chunks than replicas when the batch is small
  std::vector<torch::Tensor> outs(used);
  std::vector<std::exception_ptr> errs(used);
  const bool grad = torch::GradMode::is_enabled();
  const bool train = module_->is_training();
  auto run = [&](size_t i) {
    try {
      torch::AutoGradMode mode(grad);  // grad mode is thread-local
      replicas_[i]->train(train);
      outs[i] = forward_(*replicas_[i], chunks[i].to(options_.devices[i]));
    } catch (...) {
      errs[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < used; ++i) threads.emplace_back(run, i);
  run(0);
  for (auto& t : threads) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  for (auto& o : outs) o = o.to(options_.devices[0]);
  return torch::cat(outs, options_.dim);
}

void DataParallel::reduce_gradients() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_[0].size(); ++i) {
    auto& master = params_[0][i];
    for (size_t r = 1; r < replicas_.size(); ++r) {
      auto& g = params_[r][i].mutable_grad();
      if (!g.defined()) continue;
      auto& mg = master.mutable_grad();
      if (!mg.defined())
        mg = g.to(master.device(), /*non_blocking=*/false, /*copy=*/true);
      else
        mg.add_(g.to(master.device()));
      g.zero_();  // keep the replica's buffer for the next step
    }
  }
}

}  // namespace gz
