// Which samples each rank reads at each optimizer step, on any world size: the accounting that
// lets a run resume on a different number of ranks without repeating or skipping a sample.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gz::train {

/// @brief What a run resumed on a different world size keeps (config key `elastic_batch`).
enum class ElasticBatchPolicy {
  /// @brief keep_global: the global batch G (samples per optimizer step over all ranks) stays
  /// what it was at the first launch. Each rank reads G / W samples per step, in as few
  /// micro-batches of at most batch_size as it takes (the gradient accumulation changes with the
  /// world); steps per epoch, the lr schedule and the optimizer's trajectory stay the same.
  keep_global,
  /// @brief scale_lr: each rank keeps batch_size x gradient_accumulation_steps per step, so G
  /// follows the world, and the lr is scaled linearly by G / G_first_launch. Steps per epoch
  /// change; the schedule runs on samples seen (schedule step = samples seen / G_first_launch).
  scale_lr,
};

/// @brief "keep_global" or "scale_lr"; throws gz::InvalidArgument otherwise.
ElasticBatchPolicy parse_elastic_batch_policy(const std::string& name);
const char* to_string(ElasticBatchPolicy policy);

/// @brief Inputs of plan_batches().
struct BatchPlanOptions {
  size_t dataset_size = 0;
  int world = 1;
  int64_t batch_size = 1;    ///< per rank, per micro-batch (the most a micro-batch holds)
  int64_t accumulation = 1;  ///< gradient_accumulation_steps of the config
  ElasticBatchPolicy policy = ElasticBatchPolicy::keep_global;
  /// @brief G of the first launch (from the checkpoint); 0 = this is the first launch:
  /// configured_global_batch, or batch_size x accumulation x world when that is 0 too.
  int64_t reference_global_batch = 0;
  int64_t configured_global_batch = 0;  ///< config key global_batch_size (0 = derived)
};

/// @brief Global batch, accumulation and epoch length on one world.
struct BatchPlan {
  int64_t global_batch = 1;            ///< G: samples per optimizer step, all ranks together
  int64_t reference_global_batch = 1;  ///< G of the first launch (what the lr was set for)
  int64_t accumulation = 1;            ///< micro-batches per step, the same on every rank
  int64_t steps_per_epoch = 0;         ///< floor(N / G): the tail shorter than G is not read
  double lr_scale = 1;                 ///< G / reference (scale_lr), 1 (keep_global)
};

/// @brief Resolve the plan; throws gz::InvalidArgument (naming the numbers) when the dataset gives
/// no full step or some rank would get an empty micro-batch (G smaller than the world, or
/// batch_size 1 with an uneven split).
BatchPlan plan_batches(const BatchPlanOptions& options);

/// @brief The rest of one epoch on one world: which positions of the epoch's order (a permutation
/// of the dataset) each rank reads at each optimizer step.
///
/// Step s reads positions [start + s G, start + (s + 1) G); rank r takes those at offsets r, r + W,
/// r + 2W, ... within the step (G / W each; the first G mod W ranks one more), and splits them
/// into `accumulation` consecutive micro-batches whose sizes differ by at most one. So a run that
/// resumes at `start` = the samples the epoch already consumed, on any world, reads every
/// remaining position of the epoch exactly once; with W dividing G the split is the one an
/// uninterrupted run on that world makes.
class EpochPlan {
 public:
  /// @throws gz::InvalidArgument when start > epoch_size or the arguments are out of range.
  EpochPlan(size_t epoch_size, size_t start, int64_t global_batch, int64_t accumulation, int world, int rank);
  /// @brief Full steps left in the epoch: floor((epoch_size - start) / G).
  size_t steps() const { return steps_; }
  size_t start() const { return start_; }
  /// @brief Position after the last step (start + steps x G): where the epoch ends.
  size_t end() const { return start_ + steps_ * static_cast<size_t>(global_batch_); }
  /// @brief This rank's micro-batches of step s (positions in the epoch's order).
  std::vector<std::vector<size_t>> micro_batches(size_t step) const;
  /// @brief Samples rank `rank` reads per step (its share of G).
  size_t share(int rank) const;
  /// @brief Loss weight of a micro-batch of n samples: n W / G. With gradients averaged over the
  /// W ranks, the step's gradient is then the mean over the G samples however they are split.
  double weight(size_t n) const;

 private:
  size_t epoch_size_, start_, steps_;
  int64_t global_batch_, accumulation_;
  int world_, rank_;
};

}  // namespace gz::train
