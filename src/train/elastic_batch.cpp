#include "gz/train/elastic_batch.h"

#include <algorithm>

#include "gz/core/error.h"

namespace gz::train {

ElasticBatchPolicy parse_elastic_batch_policy(const std::string& name) {
  if (name == "keep_global") return ElasticBatchPolicy::keep_global;
  if (name == "scale_lr") return ElasticBatchPolicy::scale_lr;
  GZ_THROW(InvalidArgument, "elastic_batch '", name, "' (known: keep_global scale_lr)");
}

const char* to_string(ElasticBatchPolicy policy) {
  return policy == ElasticBatchPolicy::keep_global ? "keep_global" : "scale_lr";
}

BatchPlan plan_batches(const BatchPlanOptions& o) {
  GZ_CHECK_ARG(o.world >= 1 && o.batch_size >= 1 && o.accumulation >= 1, "plan_batches: world ", o.world,
               " batch_size ", o.batch_size, " accumulation ", o.accumulation);
  const int64_t w = o.world;
  const int64_t own = o.batch_size * o.accumulation * w;  // what this world reads with the config
  BatchPlan p;
  p.reference_global_batch = o.reference_global_batch > 0    ? o.reference_global_batch
                             : o.configured_global_batch > 0 ? o.configured_global_batch
                                                             : own;
  if (o.policy == ElasticBatchPolicy::scale_lr) {
    p.global_batch = own;
    p.accumulation = o.accumulation;
    p.lr_scale = static_cast<double>(own) / static_cast<double>(p.reference_global_batch);
  } else {
    p.global_batch = p.reference_global_batch;
    // As few micro-batches of at most batch_size as the largest share needs.
    const int64_t largest = (p.global_batch + w - 1) / w;
    p.accumulation = (largest + o.batch_size - 1) / o.batch_size;
    if (p.global_batch / w < p.accumulation)
      GZ_THROW(InvalidArgument, "global batch ", p.global_batch, " over ", w, " ranks with batch_size ",
               o.batch_size, ": some rank would get an empty micro-batch (each needs at least ",
               p.accumulation, " samples per step); use a larger global batch or batch_size");
  }
  p.steps_per_epoch = static_cast<int64_t>(o.dataset_size / static_cast<size_t>(p.global_batch));
  if (p.steps_per_epoch < 1)
    GZ_THROW(InvalidArgument, "training set too small: ", o.dataset_size, " samples give no full step of ",
             p.global_batch, " samples (global batch over ", w, " ranks)");
  return p;
}

EpochPlan::EpochPlan(size_t epoch_size, size_t start, int64_t global_batch, int64_t accumulation, int world,
                     int rank)
    : epoch_size_(epoch_size),
      start_(start),
      global_batch_(global_batch),
      accumulation_(accumulation),
      world_(world),
      rank_(rank) {
  GZ_CHECK_ARG(world >= 1 && rank >= 0 && rank < world, "EpochPlan: rank ", rank, " of ", world);
  GZ_CHECK_ARG(global_batch >= world && accumulation >= 1, "EpochPlan: global batch ", global_batch, " over ",
               world, " ranks, accumulation ", accumulation);
  GZ_CHECK_ARG(start <= epoch_size, "EpochPlan: start ", start, " past the epoch's ", epoch_size, " samples");
  steps_ = (epoch_size - start) / static_cast<size_t>(global_batch);
}

size_t EpochPlan::share(int rank) const {
  const size_t g = static_cast<size_t>(global_batch_), w = static_cast<size_t>(world_);
  return g / w + (static_cast<size_t>(rank) < g % w ? 1 : 0);
}

std::vector<std::vector<size_t>> EpochPlan::micro_batches(size_t step) const {
  GZ_CHECK_ARG(step < steps_, "EpochPlan: step ", step, " of ", steps_);
  const size_t base = start_ + step * static_cast<size_t>(global_batch_);
  const size_t n = share(rank_), a = static_cast<size_t>(accumulation_);
  std::vector<std::vector<size_t>> out(a);
  size_t i = 0;
  for (size_t k = 0; k < a; ++k) {
    const size_t len = n / a + (k < n % a ? 1 : 0);
    out[k].reserve(len);
    for (size_t j = 0; j < len; ++j, ++i)
      out[k].push_back(base + static_cast<size_t>(rank_) + i * static_cast<size_t>(world_));
  }
  return out;
}

double EpochPlan::weight(size_t n) const {
  return static_cast<double>(n) * static_cast<double>(world_) / static_cast<double>(global_batch_);
}

}  // namespace gz::train
