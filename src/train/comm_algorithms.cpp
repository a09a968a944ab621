#include "comm_algorithms.h"

namespace gz::train {

namespace {
CompressionOptions compression_options(const TrainConfig& c) {
  CompressionOptions o;
  o.method = parse_compression(c.compression.method);
  o.start_step = c.compression.start_step;
  o.error_feedback = c.compression.error_feedback;
  o.powersgd_rank = c.compression.rank;
  o.int8_chunk = c.compression.int8_chunk;
  o.topk_ratio = c.compression.topk_ratio;
  o.seed = static_cast<uint64_t>(c.seed);
  return o;
}
}  // namespace

CommHook CommAlgorithms::ddp_hook(const TrainConfig& c) {
  if (c.averaging.method != "none")
    return post_local_sgd_hook(c.averaging.warmup_steps, allreduce_hook(stats_));
  return make_comm_hook(compression_options(c), stats_);
}

DistributedOptimizerOptions CommAlgorithms::horovod_options(const TrainConfig& c) {
  DistributedOptimizerOptions o;
  o.compression_options = compression_options(c);
  o.compression = o.compression_options.method;
  o.stats = stats_;
  return o;
}

void CommAlgorithms::build_averager(const TrainConfig& c, torch::nn::Module& model,
                                    const comm::CommPtr& group) {
  if (c.averaging.method == "local_sgd") {
    LocalSGDOptions o;
    o.period = c.averaging.period;
    o.warmup_steps = c.averaging.warmup_steps;
    o.average_buffers = c.averaging.buffers;
    o.stats = stats_;
    local_sgd_ = std::make_unique<PeriodicModelAverager>(model, group, o);
  } else if (c.averaging.method == "async") {
    AsyncAveragingOptions o;
    o.max_staleness = c.averaging.max_staleness;
    o.warmup_steps = c.averaging.warmup_steps;
    o.average_buffers = c.averaging.buffers;
    o.stats = stats_;
    async_ = std::make_unique<AsyncModelAverager>(model, group, o);
  }
}

void CommAlgorithms::after_step() {
  if (local_sgd_) local_sgd_->step();
  if (async_) async_->step();
}

void CommAlgorithms::sync_replicas() {
  // Local SGD: nothing to do right after an average, or while DDP still reduces gradients.
  if (local_sgd_ && local_sgd_->steps() > local_sgd_->last_average_step() &&
      local_sgd_->steps() > local_sgd_->options().warmup_steps)
    local_sgd_->average();
  if (async_) async_->synchronize();
}

}  // namespace gz::train
