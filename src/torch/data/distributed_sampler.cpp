#include "gz/torch/distributed_sampler.h"

#include <algorithm>
#include <numeric>

#include "gz/core/error.h"
#include "gz/torch/data/splitmix.h"

namespace gz {

DistributedSampler::DistributedSampler(size_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    GZ_THROW(InvalidArgument, "DistributedSampler: rank ", rank, " of num_replicas ", num_replicas,
             " (need 0 <= rank < num_replicas)");
  build_indices();
}

void DistributedSampler::build_indices() {
  indices_.clear();
  const size_t r = static_cast<size_t>(num_replicas_);
  const size_t rest = dataset_size_ - offset_;
  num_samples_ = options_.drop_last ? rest / r : (rest + r - 1) / r;
  if (num_samples_ == 0) return;
  std::vector<size_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), size_t{0});
  if (options_.shuffle) {
    detail::SplitMix64 rng({options_.seed, static_cast<uint64_t>(epoch_)});
    detail::fisher_yates(order.begin(), order.size(), rng);
  }
  // Rank r takes global positions offset+r, offset+r+R, ... of the (padded or cut) order; a
  // position p >= N wraps.
  indices_.reserve(num_samples_);
  for (size_t i = 0; i < num_samples_; ++i) {
    const size_t p = offset_ + i * static_cast<size_t>(num_replicas_) + static_cast<size_t>(rank_);
    indices_.push_back(order[p % dataset_size_]);
  }
}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  position_ = 0;
  offset_ = 0;
  build_indices();
}

void DistributedSampler::reset() {
  position_ = 0;
  if (offset_ != 0) {
    offset_ = 0;
    build_indices();
  }
}

std::vector<size_t> DistributedSampler::next_batch(size_t n) {
  const size_t take = std::min(n, remaining());
  std::vector<size_t> out(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                          indices_.begin() + static_cast<std::ptrdiff_t>(position_ + take));
  position_ += take;
  return out;
}

void DistributedSampler::load_state(const DistributedSamplerState& state) {
  if (state.offset != offset_) {
    if (state.offset > dataset_size_)
      GZ_THROW(InvalidArgument, "DistributedSampler::load_state: offset ", state.offset, " > dataset size ",
               dataset_size_);
    DistributedSampler probe(*this);
    probe.offset_ = state.offset;
    probe.epoch_ = state.epoch;
    probe.build_indices();
    probe.load_state(state);  // same offset now: validates the position, changes nothing on error
    *this = std::move(probe);
    return;
  }
  if (state.position > num_samples_)
    GZ_THROW(InvalidArgument, "DistributedSampler::load_state: position ", state.position, " > num_samples ",
             num_samples_, " (rank ", rank_, " of ", num_replicas_, ", dataset size ", dataset_size_,
             "): state from another configuration?");
  if (state.epoch != epoch_) {
    epoch_ = state.epoch;
    build_indices();
  }
  position_ = state.position;
}

size_t DistributedSampler::global_position() const {
  return std::min(dataset_size_, offset_ + position_ * static_cast<size_t>(num_replicas_));
}

void DistributedSampler::load_global_state(int64_t epoch, size_t consumed) {
  if (consumed > dataset_size_)
    GZ_THROW(InvalidArgument, "DistributedSampler::load_global_state: ", consumed,
             " samples consumed > dataset size ", dataset_size_);
  epoch_ = epoch;
  offset_ = consumed;
  position_ = 0;
  build_indices();
}

}  // namespace gz
