// ZeroRedundancyOptimizer: layout, the reduce-scatter hook, the sharded step and its all-gathers.
// Checkpoints (consolidate, save, load) are in zero_checkpoint.cpp.
#include "gz/torch/zero_redundancy_optimizer.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <exception>
#include <unordered_map>
#include <unordered_set>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/torch/tensor_adapter.h"
#include "torch/zero/state_codec.h"
#include "torch/zero/zero_impl.h"

namespace gz {

namespace {

using torch::optim::Optimizer;

std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::shared_ptr<Optimizer>& local) {
  if (!local) GZ_THROW(InvalidArgument, "ZeroRedundancyOptimizer: null optimizer");
  return local->param_groups();
}

std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(const std::shared_ptr<Optimizer>& local) {
  if (!local) GZ_THROW(InvalidArgument, "ZeroRedundancyOptimizer: null optimizer");
  return local->defaults().clone();
}

// Elementwise optimizers only: each element's update depends on that element alone (and on
// scalars), so stepping flat blocks equals stepping whole parameters.
bool elementwise(const Optimizer& o) {
  namespace t = torch::optim;
  return dynamic_cast<const t::SGD*>(&o) || dynamic_cast<const t::Adam*>(&o) ||
         dynamic_cast<const t::AdamW*>(&o) || dynamic_cast<const t::Adagrad*>(&o) ||
         dynamic_cast<const t::RMSprop*>(&o);
}

// Reduce-scatter of one bucket: rank r receives the average of block r into its gradient shard.
// Stage 2 adds to the shard when the bucket was already reduced since the last step (several
// synchronised backward passes before one step): its transient bucket freed the earlier gradients,
// so the shard is the only place they add up. Stage 1's bucket keeps the local sum of every
// backward since zero_grad(), so its reduce-scatter replaces the shard.
CommHook reduce_scatter_hook(std::weak_ptr<ZeroRedundancyOptimizer::Impl> weak) {
  return [weak](comm::Communicator& g, GradBucket& bucket) {
    auto s = weak.lock();
    if (!s)
      GZ_THROW(
          Error,
          "DistributedDataParallel: its ZeroRedundancyOptimizer was destroyed; gradients have nowhere to go");
    auto& out = s->shard_grads.at(bucket.index);
    auto& buf = bucket.buffer;
    if (buf.numel() != out.numel() * g.size())
      GZ_THROW(Error, "ZeroRedundancyOptimizer: bucket ", bucket.index, " has ", buf.numel(),
               " elements, expected ", out.numel() * g.size());
    const bool accumulate = s->options.stage == 2 && s->fresh[bucket.index];
    auto dst = accumulate ? torch::empty_like(out) : out;
    const bool avg = bucket.divisor == g.size();
    g.reduce_scatter(buf.data_ptr(), dst.data_ptr(), static_cast<size_t>(dst.numel()),
                     to_dtype(buf.scalar_type(), "reduce_scatter"),
                     avg ? comm::ReduceOp::avg : comm::ReduceOp::sum);
    if (s->options.stats) s->options.stats->add(static_cast<uint64_t>(dst.numel() * dst.element_size()));
    if (!avg && bucket.divisor != 1) dst.div_(bucket.divisor);
    if (accumulate) out.add_(dst);
    s->fresh[bucket.index] = 1;
    // Checked after the collective, so that every rank still issues it.
    if (s->gathers_unwaited.load())
      GZ_THROW(Error, "ZeroRedundancyOptimizer: rank ", g.rank(),
               ": a forward ran while the last step's parameter ",
               "all-gathers were still running; call ddp.forward()/ddp.pre_forward() or synchronize() before "
               "the forward");
  };
}

// Which optimizer group each of DDP's parameters belongs to (im.groups), and what the shard
// layout needs to know of each; every parameter DDP averages must be in the optimizer once.
std::vector<zero::ParamInfo> param_infos(ZeroRedundancyOptimizer::Impl& im) {
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < im.params.size(); ++i) index[im.params[i].unsafeGetTensorImpl()] = i;
  std::vector<zero::ParamInfo> info(im.params.size());
  std::vector<uint8_t> seen(im.params.size(), 0);
  auto& lgroups = im.local->param_groups();
  im.groups.resize(lgroups.size());
  for (size_t g = 0; g < lgroups.size(); ++g) {
    for (auto& p : lgroups[g].params()) {
      auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end())
        GZ_THROW(InvalidArgument, "ZeroRedundancyOptimizer: optimizer group ", g, " has a parameter (shape ",
                 p.sizes(), ") that DDP does not average (not in its module, or not requiring grad)");
      const size_t i = it->second;
      if (seen[i])
        GZ_THROW(InvalidArgument, "ZeroRedundancyOptimizer: parameter '", im.reducer->param_names()[i],
                 "' is in the optimizer twice");
      seen[i] = 1;
      im.groups[g].push_back(i);
      info[i] = {p.numel(), static_cast<int64_t>(p.element_size()), g, static_cast<int>(p.scalar_type())};
    }
  }
  for (size_t i = 0; i < im.params.size(); ++i)
    if (!seen[i])
      GZ_THROW(InvalidArgument, "ZeroRedundancyOptimizer: parameter '", im.reducer->param_names()[i],
               "' is averaged by DDP but not in the optimizer");
  return info;
}

// The model's parameters move into flat buffers (im.flat, im.views); this rank's block of each is
// what it steps (im.shard_params, im.shard_grads). Collective (alloc_buffer).
void build_flat_buffers(ZeroRedundancyOptimizer::Impl& im) {
  torch::NoGradGuard no_grad;
  im.views.resize(im.params.size());
  for (auto& b : im.buckets) {
    auto& p0 = im.params[b.params.front()];
    // Memory the group gathers into without staging copies (shm: peers copy straight out of it).
    const auto fo = p0.options().requires_grad(false);
    auto flat = p0.is_cpu() ? alloc_buffer_tensor(*im.group, b.padded(im.world), fo)
                            : torch::zeros({b.padded(im.world)}, fo);
    for (size_t j = 0; j < b.params.size(); ++j) {
      auto& p = im.params[b.params[j]];
      auto view = flat.narrow(0, b.offsets[j], b.numels[j]).view(p.sizes());
      view.copy_(p.detach());
      p.set_data(view);
      im.views[b.params[j]] = view;
    }
    const auto [lo, hi] = b.block(im.rank);
    im.shard_params.push_back(flat.narrow(0, lo, hi - lo).detach());
    im.shard_grads.push_back(torch::zeros({hi - lo}, flat.options()));
    im.flat.push_back(std::move(flat));
  }
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp,
                                                 std::shared_ptr<Optimizer> local, ZeroOptions options)
    : Optimizer(groups_of(local), defaults_of(local)), impl_(std::make_shared<Impl>()) {
  auto& im = *impl_;
  im.group = ddp.group();
  im.rank = im.group->rank();
  im.world = im.group->size();
  im.reducer = ddp.reducer().shared_from_this();
  im.local = std::move(local);
  im.options = options;
  GZ_CHECK_ARG(options.stage == 1 || options.stage == 2,
               "ZeroRedundancyOptimizer: stage must be 1 or 2, got ", options.stage);
  if (!elementwise(*im.local))
    GZ_THROW(InvalidArgument,
             "ZeroRedundancyOptimizer: shards only elementwise optimizers (torch::optim SGD, Adam, ",
             "AdamW, Adagrad, RMSprop, gz::FusedAdamW and their subclasses)");
  if (im.reducer->join_mode()) GZ_THROW(Error, "ZeroRedundancyOptimizer: cannot be built inside ddp.join()");

  im.params = im.reducer->params();
  const std::vector<zero::ParamInfo> info = param_infos(im);

  // Buckets in DDP's current gradient order (its rebuilt order if it has run a backward).
  std::vector<size_t> order;
  for (auto& b : im.reducer->bucket_layout()) order.insert(order.end(), b.begin(), b.end());
  im.buckets = zero::plan_shards(order, info, im.world, options.first_bucket_bytes, options.bucket_bytes);
  const size_t nb = im.buckets.size();
  im.bucket_of_group.resize(im.groups.size());
  for (size_t k = 0; k < nb; ++k) im.bucket_of_group[im.buckets[k].group].push_back(k);

  build_flat_buffers(im);
  im.fresh.assign(nb, 0);
  im.gathers.resize(nb);

  // State the optimizer already has (Adagrad's initial sums, or a trained one) is sharded too.
  im.shard_state_from_model_params();
  im.use_shard_params();

  BucketPlan plan;
  for (auto& b : im.buckets) plan.layout.push_back(b.params);
  plan.pad_multiple = im.world * zero::kAlign;
  plan.transient = options.stage == 2;
  im.reducer->set_bucket_plan(std::move(plan));
  for (size_t k = 0; k < nb; ++k)
    if (im.reducer->bucket_numel(k) != im.buckets[k].padded(im.world))
      GZ_THROW(Error, "ZeroRedundancyOptimizer: bucket ", k, " of DDP has ", im.reducer->bucket_numel(k),
               " elements, the shard layout ", im.buckets[k].padded(im.world));
  im.reducer->own_comm_hook(reduce_scatter_hook(impl_), "ZeroRedundancyOptimizer (its reduce-scatter)");
  std::weak_ptr<Impl> weak = impl_;
  ddp.set_pre_forward_hook([weak] {
    if (auto s = weak.lock()) s->wait_gathers();
  });
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  // The all-gathers write into memory the parameters keep alive; still, no op outlives its owner.
  for (auto& w : impl_->gathers)
    if (w)
      comm::finish_or_abort(*impl_->group, *w,
                            "ZeroRedundancyOptimizer: an all-gather still running past its deadline");
}

void ZeroRedundancyOptimizer::Impl::wait_gathers() {
  std::exception_ptr first;
  for (auto& w : gathers) {
    if (!w) continue;
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    if (!w->is_completed())
      comm::finish_or_abort(*group, *w, "ZeroRedundancyOptimizer: an all-gather past its deadline");
    w.reset();
  }
  gathers_unwaited = false;
  if (first) std::rethrow_exception(first);
}

void ZeroRedundancyOptimizer::Impl::rebind_params() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    if (p.data_ptr() == views[i].data_ptr() && p.sizes() == views[i].sizes() &&
        p.strides() == views[i].strides())
      continue;
    views[i].copy_(p.detach());
    p.set_data(views[i]);
  }
}

void ZeroRedundancyOptimizer::Impl::use_model_params() {
  auto& lg = local->param_groups();
  for (size_t g = 0; g < lg.size(); ++g) {
    std::vector<torch::Tensor> ps;
    for (size_t i : groups[g]) ps.push_back(params[i]);
    lg[g].params() = std::move(ps);
  }
}

void ZeroRedundancyOptimizer::Impl::use_shard_params() {
  auto& lg = local->param_groups();
  for (size_t g = 0; g < lg.size(); ++g) {
    std::vector<torch::Tensor> ps;
    for (size_t k : bucket_of_group[g]) ps.push_back(shard_params[k]);
    lg[g].params() = std::move(ps);
  }
}

torch::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  auto& im = *impl_;
  if (im.reducer->join_mode())
    GZ_THROW(Error, "ZeroRedundancyOptimizer: step() inside ddp.join() is not supported");
  im.wait_gathers();
  im.rebind_params();
  im.consolidated.clear();
  torch::NoGradGuard no_grad;
  // The model-facing groups carry the options (an lr schedule writes there).
  auto& lg = im.local->param_groups();
  for (size_t g = 0; g < lg.size(); ++g) lg[g].set_options(param_groups_[g].options().clone());
  // Last bucket first: it holds the first layers, which the next forward needs first. Each
  // bucket's all-gather runs while the next bucket steps.
  for (size_t k = im.buckets.size(); k-- > 0;) {
    if (!im.fresh[k]) continue;  // no synchronised backward since the last step (same on every rank)
    im.fresh[k] = 0;
    auto& sp = im.shard_params[k];
    sp.mutable_grad() = im.shard_grads[k];
    try {
      im.local->step();
    } catch (...) {
      sp.mutable_grad() = torch::Tensor();
      throw;
    }
    sp.mutable_grad() = torch::Tensor();
    auto& f = im.flat[k];
    const auto [lo, hi] = im.buckets[k].block(im.rank);
    char* base = static_cast<char*>(f.data_ptr());
    im.gathers[k] =
        im.group->allgather_async(base + lo * f.element_size(), base, static_cast<size_t>(hi - lo),
                                  to_dtype(f.scalar_type(), "allgather"));
    if (im.options.stats) im.options.stats->add(static_cast<uint64_t>((hi - lo) * f.element_size()));
    im.gathers_unwaited = true;
  }
  ++im.steps;
  if (!im.options.overlap_allgather) im.wait_gathers();
  return loss;
}

void ZeroRedundancyOptimizer::synchronize() { impl_->wait_gathers(); }

bool ZeroRedundancyOptimizer::gathers_pending() const { return impl_->gathers_unwaited.load(); }

double ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm) {
  auto& im = *impl_;
  double local = 0;
  for (size_t k = 0; k < im.buckets.size(); ++k)
    if (im.fresh[k]) local += im.shard_grads[k].to(torch::kDouble).pow(2).sum().item<double>();
  im.group->allreduce(&local, 1, DType::f64, comm::ReduceOp::sum);
  const double total = std::sqrt(local);
  const double coef = max_norm / (total + 1e-6);  // torch::nn::utils::clip_grad_norm_'s rule
  if (coef < 1)
    for (size_t k = 0; k < im.buckets.size(); ++k)
      if (im.fresh[k]) im.shard_grads[k].mul_(coef);
  return total;
}

torch::optim::Optimizer& ZeroRedundancyOptimizer::local_optimizer() { return *impl_->local; }

std::vector<torch::Tensor> ZeroRedundancyOptimizer::local_gradients() const { return impl_->shard_grads; }

int ZeroRedundancyOptimizer::stage() const { return impl_->options.stage; }

std::vector<ZeroRedundancyOptimizer::BucketInfo> ZeroRedundancyOptimizer::buckets() const {
  std::vector<BucketInfo> out;
  for (auto& b : impl_->buckets) {
    BucketInfo bi;
    bi.params = b.params;
    bi.numel = b.numel;
    bi.padded = b.padded(impl_->world);
    std::tie(bi.first, bi.last) = b.block(impl_->rank);
    out.push_back(std::move(bi));
  }
  return out;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  const Optimizer* o = &optimizer;
  if (auto* z = dynamic_cast<const ZeroRedundancyOptimizer*>(o))
    o = &const_cast<ZeroRedundancyOptimizer*>(z)->local_optimizer();
  std::unordered_set<const void*> storages;
  int64_t bytes = 0;
  for (auto& kv : o->state()) {
    auto fields = zero::state_fields(*kv.second);
    for (auto& [name, t] : fields.tensors) {
      if (!t->defined()) continue;
      const auto& st = t->storage();
      if (storages.insert(st.data()).second) bytes += static_cast<int64_t>(st.nbytes());
    }
  }
  return bytes;
}

}  // namespace gz
