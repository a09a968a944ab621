#include "gz/torch/async_model_averager.h"

#include <numeric>

#include "flat_tensors.h"
#include "gz/core/error.h"
#include "gz/torch/process_group.h"

namespace gz {

AsyncModelAverager::AsyncModelAverager(torch::nn::Module& module, comm::CommPtr group,
                                       AsyncAveragingOptions options)
    : AsyncModelAverager(module.parameters(), module.buffers(), std::move(group), std::move(options)) {}

AsyncModelAverager::AsyncModelAverager(std::vector<torch::Tensor> params, std::vector<torch::Tensor> buffers,
                                       comm::CommPtr group, AsyncAveragingOptions options)
    : options_(std::move(options)), header_(2, 0) {
  GZ_CHECK_ARG(options_.max_staleness >= 0, "async averaging max_staleness = ", options_.max_staleness);
  GZ_CHECK_ARG(options_.warmup_steps >= 0, "async averaging warmup_steps = ", options_.warmup_steps);
  auto g = resolve_group(group);
  // Its own communicator (own connections and progress thread): rounds run beside whatever the
  // training thread does on the group, and in the same order on every rank.
  std::vector<int> all(static_cast<size_t>(g->size()));
  std::iota(all.begin(), all.end(), 0);
  comm_ = g->new_group(all);
  if (!comm_) GZ_THROW(Error, "AsyncModelAverager: new_group of all ranks returned no communicator");
  flat_ = std::make_unique<averaging::FlatTensors>(
      averaging::averaged_tensors(params, buffers, options_.average_buffers), *comm_);
  for (const auto& f : flat_->flats()) snapshot_.push_back(torch::empty_like(f));
  folded_step_ = options_.warmup_steps;
}

AsyncModelAverager::~AsyncModelAverager() {
  if (!work_) return;  // fold() leaves none behind, not even when its wait failed
  // Not synchronised: peers are in this round or will start the next one, which this rank never
  // joins. Aborting tells them at once instead of at the round's deadline.
  try {
    comm_->abort("AsyncModelAverager destroyed with a round in flight (synchronize() was not called)");
  } catch (...) {
  }
  comm::finish_or_abort(*comm_, *work_, "AsyncModelAverager destroyed with a round in flight");
}

void AsyncModelAverager::post(bool syncing) {
  flat_->pack();
  const auto& flats = flat_->flats();
  for (size_t i = 0; i < flats.size(); ++i) snapshot_[i].copy_(flats[i]);
  header_[0] = step_;
  header_[1] = syncing ? 1 : 0;
  comm::Communicator* c = comm_.get();
  averaging::FlatTensors* flat = flat_.get();
  int64_t* header = header_.data();
  CommStats* stats = options_.stats.get();
  // On comm_'s progress thread; the training thread leaves flat_ and header_ alone until fold().
  work_ = comm_->submit([c, flat, header, stats] {
    c->allreduce(header, 2, DType::i64, comm::ReduceOp::min);
    if (stats) stats->add(2 * sizeof(int64_t));
    flat->allreduce_avg(*c, stats);
  });
}

bool AsyncModelAverager::fold() {
  try {
    work_->wait();
  } catch (...) {
    // Failed, or given up on while it may still run on flat_ and header_: a round that never
    // completes is aborted (the peers then fail too) and waited for, so that no round outlives
    // this rank's wait. work_ stays set until then: the destructor does the same if this throws.
    comm::finish_or_abort(*comm_, *work_, "AsyncModelAverager: a round outlived its deadline");
    work_.reset();
    throw;
  }
  work_.reset();
  ++rounds_;
  folded_step_ = header_[0];
  const bool all_syncing = header_[1] == 1;
  if (all_syncing) {
    // Nobody trained since its snapshot: the average itself, bit for bit the same on every rank.
    flat_->unpack();
  } else {
    // Keep what this rank learnt while the round ran: param += average - snapshot.
    const auto& flats = flat_->flats();
    for (size_t i = 0; i < flats.size(); ++i) flats[i].sub_(snapshot_[i]);
    flat_->add_to_tensors();
  }
  return all_syncing;
}

void AsyncModelAverager::step() {
  ++step_;
  if (step_ <= options_.warmup_steps) return;
  if (work_ && work_->is_completed()) fold();
  if (!work_) post(false);
  // The bound: block until the folded model holds every rank's parameters from step_ - S or later.
  while (step_ - folded_step_ > options_.max_staleness) {
    ++waits_;
    fold();
    post(false);
  }
}

void AsyncModelAverager::synchronize() {
  // Every rank calls this at the same step, so either none has a round going (still warming up)
  // or all have; rounds go on, flagged, until one in which every rank was synchronising.
  if (!work_) {
    if (step_ <= options_.warmup_steps) return;
    post(true);
  }
  while (!fold()) post(true);
}

}  // namespace gz
