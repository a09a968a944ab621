// Index sampler that gives each rank a disjoint share of a map-style dataset (plain C++).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gz {

/// @brief Options of DistributedSampler.
struct DistributedSamplerOptions {
  /// @brief Permute the indices every epoch (same permutation on every rank for one (seed, epoch)).
  bool shuffle = true;
  uint64_t seed = 0;
  /// @brief Drop the tail so that every rank gets floor(N / R) samples, instead of padding by
  /// wrapping around to ceil(N / R) (padding repeats a few samples; dropping loses a few).
  bool drop_last = false;
};

/// @brief Resumable position of a DistributedSampler: epoch and samples already handed out.
struct DistributedSamplerState {
  int64_t epoch = 0;
  size_t position = 0;  ///< this rank's samples handed out since `offset`
  /// @brief Positions of the epoch's order all ranks had consumed when this shard began (see
  /// DistributedSampler::load_global_state); 0 for a shard that covers the whole epoch.
  size_t offset = 0;
};

/// @brief Splits indices [0, dataset_size) among num_replicas ranks.
///
/// Each epoch, all ranks build the same order (identity, or a Fisher-Yates permutation from a
/// SplitMix64 seeded with (seed, epoch)), pad it by wrapping around (or cut it, with drop_last) to
/// a multiple of num_replicas, and rank r takes positions r, r + R, r + 2R, ... The result depends
/// only on (dataset_size, num_replicas, rank, options, epoch): not on the platform or the
/// standard library.
///
/// Iteration: set_epoch(e), then next_batch(n) until it returns an empty vector. state() /
/// load_state() save and restore (epoch, position) for an exact mid-epoch resume; set_epoch() with
/// the epoch already current keeps the position, so the usual loop
/// `for (e = state.epoch; ...) { sampler.set_epoch(e); while (next_batch) ... }` resumes in place.
///
/// On another number of replicas: global_position() (samples all ranks consumed this epoch, the
/// ranks moving in lock step) saved on the old world and load_global_state(epoch, consumed) on the
/// new one re-shard the rest of the epoch's order, positions consumed, consumed + 1, ...: rank r
/// takes consumed + r, consumed + r + R, ... So across any number of resizes no sample of the
/// epoch is repeated or skipped (padding and drop_last apply to the rest, as to a whole epoch).
class DistributedSampler {
 public:
  /// @throws gz::InvalidArgument when num_replicas < 1 or rank is outside [0, num_replicas).
  DistributedSampler(size_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {});

  /// @brief Select the epoch's order; a different epoch restarts at position 0, the current one is kept.
  void set_epoch(int64_t epoch);
  /// @brief Restart the current epoch from its beginning (also after load_global_state).
  void reset();
  int64_t epoch() const { return epoch_; }

  /// @brief Up to n next indices of this rank (fewer at the end of the epoch, empty when done).
  std::vector<size_t> next_batch(size_t n);
  /// @brief All indices of this rank for the current epoch, in order (num_samples() of them).
  const std::vector<size_t>& indices() const { return indices_; }

  /// @brief Samples per rank and epoch: ceil(N / R), or floor(N / R) with drop_last (of the rest
  /// after the offset, N - offset, when resumed with load_global_state).
  size_t num_samples() const { return num_samples_; }
  /// @brief num_samples() * num_replicas.
  size_t total_size() const { return num_samples_ * static_cast<size_t>(num_replicas_); }
  size_t position() const { return position_; }
  size_t remaining() const { return num_samples_ - position_; }
  size_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

  DistributedSamplerState state() const { return {epoch_, position_, offset_}; }
  /// @throws gz::InvalidArgument when position > num_samples() (state from another configuration);
  /// nothing is changed then.
  void load_state(const DistributedSamplerState& state);
  /// @brief Positions of the epoch's order consumed by all ranks so far (offset + position x R,
  /// at most the dataset size): what load_global_state() takes on any world.
  size_t global_position() const;
  /// @brief Resume `epoch` after `consumed` positions of its order (all ranks together), sharding
  /// the rest over this sampler's replicas. @throws gz::InvalidArgument when consumed > dataset size.
  void load_global_state(int64_t epoch, size_t consumed);

 private:
  void build_indices();

  size_t dataset_size_;
  int num_replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  size_t num_samples_ = 0;
  int64_t epoch_ = 0;
  size_t position_ = 0;
  size_t offset_ = 0;
  std::vector<size_t> indices_;
};

}  // namespace gz
