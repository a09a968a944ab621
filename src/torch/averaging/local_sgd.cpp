#include "gz/torch/local_sgd.h"

#include "flat_tensors.h"
#include "gz/core/error.h"
#include "gz/torch/process_group.h"

namespace gz {

PeriodicModelAverager::PeriodicModelAverager(torch::nn::Module& module, comm::CommPtr group,
                                             LocalSGDOptions options)
    : PeriodicModelAverager(module.parameters(), module.buffers(), std::move(group), std::move(options)) {}

PeriodicModelAverager::PeriodicModelAverager(std::vector<torch::Tensor> params,
                                             std::vector<torch::Tensor> buffers, comm::CommPtr group,
                                             LocalSGDOptions options)
    : group_(resolve_group(group)), options_(std::move(options)) {
  GZ_CHECK_ARG(options_.period >= 1, "local SGD period = ", options_.period);
  GZ_CHECK_ARG(options_.warmup_steps >= 0, "local SGD warmup_steps = ", options_.warmup_steps);
  flat_ = std::make_unique<averaging::FlatTensors>(
      averaging::averaged_tensors(params, buffers, options_.average_buffers), *group_);
}

PeriodicModelAverager::~PeriodicModelAverager() = default;

bool PeriodicModelAverager::step() {
  ++step_;
  if (step_ <= options_.warmup_steps || (step_ - options_.warmup_steps) % options_.period != 0) return false;
  average();
  return true;
}

void PeriodicModelAverager::average() {
  flat_->pack();
  flat_->allreduce_avg(*group_, options_.stats.get());
  flat_->unpack();
  ++averages_;
  last_average_step_ = step_;
}

CommHook post_local_sgd_hook(int64_t warmup_steps, CommHook warmup) {
  GZ_CHECK_ARG(warmup_steps >= 0, "post_local_sgd_hook: warmup_steps = ", warmup_steps);
  if (!warmup) warmup = allreduce_hook();
  auto iteration = std::make_shared<int64_t>(0);
  return [iteration, warmup_steps, warmup](comm::Communicator& group, GradBucket& bucket) {
    // Bucket 0 starts every synchronised backward pass.
    if (bucket.index == 0) ++*iteration;
    if (*iteration <= warmup_steps) warmup(group, bucket);
    // Afterwards: no communication; the bucket keeps this rank's gradient.
  };
}

}  // namespace gz
