// ZeroRedundancyOptimizer checkpoints: the sharded state is written and read in the format of the
// wrapped optimizer over the whole model, so checkpoints move between world sizes and to or from
// training without ZeRO.
//
// Both directions go through the wrapped optimizer's own save()/load(): for that moment its
// parameters are the model's and its state the per-parameter one.
#include <algorithm>
#include <exception>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/torch/tensor_adapter.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "torch/zero/state_codec.h"
#include "torch/zero/zero_impl.h"

namespace gz {

namespace {

using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StatePtr = std::unique_ptr<torch::optim::OptimizerParamState>;

// Restores the local optimizer's parameters to the shards and its state to `saved` when a
// save()/load() through it fails half-way.
struct RestoreOnFailure {
  ZeroRedundancyOptimizer::Impl& im;
  StateMap* saved;
  bool armed = true;
  ~RestoreOnFailure() {
    if (!armed) return;
    im.use_shard_params();
    if (saved) im.local->state() = std::move(*saved);
  }
};

}  // namespace

void ZeroRedundancyOptimizer::Impl::shard_state_from_model_params() {
  auto& state = local->state();
  StateMap sharded;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const auto& b = buckets[k];
    // Per parameter of the bucket: its state, if it has one.
    std::vector<torch::optim::OptimizerParamState*> per(b.params.size(), nullptr);
    torch::optim::OptimizerParamState* proto = nullptr;
    for (size_t j = 0; j < b.params.size(); ++j) {
      auto it = state.find(zero::state_key(state, params[b.params[j]]));
      if (it == state.end()) continue;
      per[j] = it->second.get();
      if (!proto) proto = per[j];
    }
    if (!proto) continue;  // never stepped: the optimizer creates the shard's state itself
    StatePtr st = proto->clone();
    auto fields = zero::state_fields(*st);
    if (fields.step) {
      // A bucket steps as one; parameters that skipped steps (no gradient) disagree: the most wins.
      int64_t hi = *fields.step, lo = *fields.step;
      for (auto* s : per)
        if (s) {
          hi = std::max(hi, *zero::state_fields(*s).step);
          lo = std::min(lo, *zero::state_fields(*s).step);
        }
      if (hi != lo)
        GZ_LOG(warn, "ZeroRedundancyOptimizer: parameters of bucket ", k, " have step counts ", lo, "..", hi,
               "; the bucket steps as one and continues from ", hi);
      *fields.step = hi;
    }
    const auto [blo, bhi] = b.block(rank);
    const auto& opts = shard_params[k].options();
    for (size_t t = 0; t < fields.tensors.size(); ++t) {
      torch::Tensor& out = *fields.tensors[t].second;
      bool any = false;
      for (auto* s : per) any = any || (s && zero::state_fields(*s).tensors[t].second->defined());
      if (!any) {
        out = torch::Tensor();
        continue;
      }
      // This rank's block: each parameter's owned part; padding and missing state are zero.
      out = torch::zeros({bhi - blo}, opts);
      for (size_t j = 0; j < b.params.size(); ++j) {
        if (!per[j]) continue;
        const torch::Tensor& src = *zero::state_fields(*per[j]).tensors[t].second;
        if (!src.defined()) continue;
        if (src.numel() != b.numels[j])
          GZ_THROW(InvalidArgument, "ZeroRedundancyOptimizer: state '", fields.tensors[t].first,
                   "' of parameter '", reducer->param_names()[b.params[j]], "' has ", src.numel(),
                   " elements, the parameter ", b.numels[j]);
        const auto [first, last] = zero::owned_part(b, j, rank);
        if (first >= last) continue;
        out.narrow(0, first - blo, last - first)
            .copy_(src.reshape({-1}).narrow(0, first - b.offsets[j], last - first));
      }
    }
    sharded[zero::state_key(sharded, shard_params[k])] = std::move(st);
  }
  state = std::move(sharded);
}

void ZeroRedundancyOptimizer::Impl::consolidate(int root) {
  GZ_CHECK_ARG(root >= 0 && root < world, "consolidate_state_dict: root ", root, " outside [0, ", world, ")");
  wait_gathers();
  consolidated.clear();
  consolidated.resize(params.size());
  auto& state = local->state();
  // Per bucket: bit 0 = has state, bit t+1 = tensor field t defined. Every rank must agree, or the
  // all-gathers below would not match.
  std::vector<int64_t> flags(2 * buckets.size(), 0);
  std::vector<torch::optim::OptimizerParamState*> shard_state(buckets.size(), nullptr);
  for (size_t k = 0; k < buckets.size(); ++k) {
    auto it = state.find(zero::state_key(state, shard_params[k]));
    if (it == state.end()) continue;
    shard_state[k] = it->second.get();
    int64_t bits = 1;
    auto fields = zero::state_fields(*shard_state[k]);
    for (size_t t = 0; t < fields.tensors.size(); ++t)
      if (fields.tensors[t].second->defined()) bits |= int64_t(1) << (t + 1);
    flags[2 * k] = bits;
    flags[2 * k + 1] = -bits;
  }
  group->allreduce(flags.data(), flags.size(), DType::i64, comm::ReduceOp::max);
  for (size_t k = 0; k < buckets.size(); ++k)
    if (flags[2 * k] != -flags[2 * k + 1])
      GZ_THROW(Error, "consolidate_state_dict: rank ", rank,
               ": ranks disagree on which optimizer state bucket ", k, " has (state flags ",
               -flags[2 * k + 1], " to ", flags[2 * k], ")");
  for (size_t k = 0; k < buckets.size(); ++k) {
    if (!shard_state[k]) continue;
    const auto& b = buckets[k];
    auto fields = zero::state_fields(*shard_state[k]);
    if (rank == root)
      for (size_t j = 0; j < b.params.size(); ++j) consolidated[b.params[j]] = shard_state[k]->clone();
    for (size_t t = 0; t < fields.tensors.size(); ++t) {
      const torch::Tensor& mine = *fields.tensors[t].second;
      if (!mine.defined()) continue;
      auto whole = torch::empty({b.padded(world)}, mine.options());
      group->allgather(mine.data_ptr(), whole.data_ptr(), static_cast<size_t>(mine.numel()),
                       to_dtype(mine.scalar_type(), "allgather"));
      if (rank != root) continue;
      for (size_t j = 0; j < b.params.size(); ++j) {
        const auto& p = params[b.params[j]];
        auto f = zero::state_fields(*consolidated[b.params[j]]);
        *f.tensors[t].second = whole.narrow(0, b.offsets[j], b.numels[j]).view(p.sizes()).clone();
      }
    }
  }
  consolidated_at = steps;
  consolidated_root = root;
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int root) { impl_->consolidate(root); }

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  auto& im = *impl_;
  if (im.world == 1 && im.consolidated_at != im.steps) im.consolidate(0);  // nothing to gather
  if (im.consolidated_at != im.steps || im.rank != im.consolidated_root)
    GZ_THROW(Error, "ZeroRedundancyOptimizer::save on rank ", im.rank,
             ": call consolidate_state_dict(root) on every ",
             "rank after the last step, then save() on the root",
             im.consolidated_at == im.steps ? " (this rank is not the root)" : "");
  im.wait_gathers();
  auto& state = im.local->state();
  StateMap shards = std::move(state);
  state = StateMap();
  RestoreOnFailure restore{im, &shards};
  im.use_model_params();
  auto& lg = im.local->param_groups();
  for (size_t g = 0; g < lg.size(); ++g) lg[g].set_options(param_groups_[g].options().clone());
  for (size_t i = 0; i < im.params.size(); ++i)
    if (im.consolidated[i]) state[zero::state_key(state, im.params[i])] = im.consolidated[i]->clone();
  im.local->save(archive);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  auto& im = *impl_;
  im.wait_gathers();
  auto& state = im.local->state();
  StateMap shards = std::move(state);
  state = StateMap();
  RestoreOnFailure restore{im, &shards};
  im.use_model_params();
  im.local->load(archive);  // per-parameter state keyed by the model's parameters, and the options
  auto& lg = im.local->param_groups();
  for (size_t g = 0; g < lg.size(); ++g) param_groups_[g].set_options(lg[g].options().clone());
  im.shard_state_from_model_params();
  restore.saved = nullptr;  // the new shard state stays
  im.consolidated.clear();
  im.consolidated_at = -1;
}

}  // namespace gz
