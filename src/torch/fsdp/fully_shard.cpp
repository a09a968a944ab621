// FullyShardedDataParallel: construction, forward, the units' memory and all-gathers, the public
// accessors. Backward (hooks, reduce-scatters, clipping) is in fsdp_backward.cpp.
#include "gz/torch/fully_shard.h"

#include <exception>
#include <limits>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/torch/collectives.h"
#include "gz/torch/process_group.h"
#include "gz/torch/tensor_adapter.h"
#include "torch/fsdp/flat_storage.h"
#include "torch/fsdp/fsdp_impl.h"

namespace gz {

namespace {
bool live(const FsdpUnit& u) { return !u.params.empty(); }
// Makes an Impl the active one of this thread for one forward(), and undoes it however it ends.
struct ActiveScope {
  explicit ActiveScope(FullyShardedDataParallel::Impl* s) : prev(active_fsdp()) {
    if (prev) GZ_THROW(Error, "FullyShardedDataParallel: forward() inside another one's forward()");
    active_fsdp() = s;
    s->in_forward = true;
  }
  ~ActiveScope() {
    active_fsdp()->in_forward = false;
    active_fsdp() = prev;
  }
  FullyShardedDataParallel::Impl* prev;
};
}  // namespace

FullyShardedDataParallel::Impl*& active_fsdp() {
  thread_local FullyShardedDataParallel::Impl* active = nullptr;
  return active;
}

void FullyShardedDataParallel::Impl::track(int64_t bytes) {
  whole_now += bytes;
  whole_peak = std::max(whole_peak, whole_now);
}

void FullyShardedDataParallel::Impl::allocate_full(FsdpUnit& u) {
  const auto want = static_cast<size_t>(fsdp_bytes_of(u.full));
  if (fsdp::storage_bytes(u.full) == want) return;
  fsdp::set_storage_bytes(u.full, want);
  track(static_cast<int64_t>(want));
}

void FullyShardedDataParallel::Impl::release_full(FsdpUnit& u) {
  if (u.gather) ensure_whole(static_cast<size_t>(&u - units.data()));  // never free under an all-gather
  const auto had = static_cast<int64_t>(fsdp::storage_bytes(u.full));
  fsdp::set_storage_bytes(u.full, 0);
  track(-had);
  u.state = FsdpUnit::State::sharded;
}

void FullyShardedDataParallel::Impl::start_gather(size_t i) {
  auto& u = units[i];
  if (!live(u) || u.state != FsdpUnit::State::sharded) return;
  allocate_full(u);
  u.gather = allgather_async(u.shard.detach(), u.full, group);
  u.state = FsdpUnit::State::gathering;
}

void FullyShardedDataParallel::Impl::ensure_whole(size_t i) {
  auto& u = units[i];
  if (!live(u) || u.state == FsdpUnit::State::whole) return;
  if (u.state == FsdpUnit::State::sharded) start_gather(i);
  auto work = std::move(u.gather);
  u.state = FsdpUnit::State::whole;  // set first: a failed gather leaves the unit to be released
  try {
    work->wait();
  } catch (...) {
    comm::finish_or_abort(*group, *work, "FullyShardedDataParallel: an all-gather past its deadline");
    throw;
  }
}

void FullyShardedDataParallel::Impl::prefetch(int64_t position) {
  if (options.prefetch && position >= 0 && position < static_cast<int64_t>(order.size()))
    start_gather(order[static_cast<size_t>(position)]);
}

void FullyShardedDataParallel::Impl::wait_all_work() noexcept {
  for (auto& u : units)
    for (auto* w : {&u.gather, &u.reduce})
      if (*w) comm::finish_or_abort(*group, **w, "FullyShardedDataParallel: an op still running at teardown");
}

torch::Tensor FullyShardedDataParallel::Impl::run_unit(size_t i, const std::function<torch::Tensor()>& fn) {
  auto& u = units[i];
  u.entered = true;
  const auto pos = static_cast<int64_t>(cur_order.size());
  cur_order.push_back(i);
  ensure_whole(i);
  // The unit that came next in the last forward gathers while this one computes.
  if (pos < static_cast<int64_t>(order.size()) && order[static_cast<size_t>(pos)] == i) prefetch(pos + 1);
  torch::Tensor out = fn();
  const bool grad = torch::GradMode::is_enabled() && out.defined() && out.requires_grad();
  if (grad) out = attach_pre_backward(i, out);
  if (grad && options.find_unused_parameters) {
    if (u.output.defined())  // which call's backward runs where would differ between ranks
      GZ_THROW(InvalidArgument, "FullyShardedDataParallel: unit '", u.name,
               "' ran twice in one forward; with ",
               "find_unused_parameters a unit runs at most once per forward (make the other use a unit of "
               "its own)");
    u.output = out;
  }
  if (!u.always_whole && (!grad || options.reshard_after_forward)) release_full(u);
  return out;
}

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                   std::vector<std::shared_ptr<torch::nn::Module>> units,
                                                   comm::CommPtr group, FullyShardOptions options)
    : impl_(std::make_shared<Impl>()) {
  auto& im = *impl_;
  GZ_CHECK_ARG(module != nullptr, "fully_shard: null module");
  im.group = resolve_group(group);
  im.rank = im.group->rank();
  im.world = im.group->size();
  im.options = options;
  GZ_CHECK_ARG(options.root_rank >= 0 && options.root_rank < im.world, "fully_shard: root_rank ",
               options.root_rank, " outside the group of ", im.world);
  if (options.reduce_dtype) {
    GZ_CHECK_ARG(c10::isFloatingType(*options.reduce_dtype),
                 "fully_shard: reduce_dtype must be a floating type, got ", *options.reduce_dtype);
    to_dtype(*options.reduce_dtype, "fully_shard reduce_dtype");
  }
  im.module = std::move(module);
  im.assign_units(units);
  for (auto& u : im.units)  // the root holds every unit; a unit may hold others
    for (const auto& m : u.module ? u.module->modules(false) : im.module->modules(false))
      u.encloses = u.encloses || im.unit_of_module.count(m.get()) > 0;
  for (auto& u : im.units) {
    if (!live(u)) continue;
    check_device(u.params[0], *im.group, "fully_shard");
    to_dtype(u.params[0].scalar_type(), "fully_shard");
    im.build_flat(u);
  }
  torch::NoGradGuard no_grad;
  for (auto& b : im.module->buffers()) broadcast(b, options.root_rank, im.group);
  im.pos_in_order.assign(im.units.size(), -1);
  im.install_hooks();
}

namespace {

using Impl = FullyShardedDataParallel::Impl;

// A forward or backward that threw left its state behind. LibTorch's engine drops the
// end-of-backward callback of a failed backward, so nothing else would reset it.
bool pass_left_open(const Impl& s) {
  if (s.callback_queued) return true;
  for (const auto& u : s.units)
    if (u.in_backward || u.reduce || u.gather) return true;
  return false;
}

// Waits for that pass's ops, frees what it gathered and drops its partial gradients (and those
// no_sync() kept): a unit left "in backward" would skip its gather in the next backward and read
// freed memory. Gradients that earlier backward passes reduced into the shards stay.
void abandon_pass(Impl& s) noexcept {
  s.callback_queued = false;
  for (auto& u : s.units) {
    for (auto* w : {&u.gather, &u.reduce})
      if (*w) {
        comm::finish_or_abort(*s.group, **w, "FullyShardedDataParallel: an op of a failed pass");
        w->reset();
      }
    u.reduced = torch::Tensor();
    u.in_backward = false;
    u.pending = 0;
    u.output = torch::Tensor();
    u.tied = false;
    for (auto& p : u.params) p.mutable_grad() = torch::Tensor();
    if (u.grad_full.defined()) s.track(-fsdp_bytes_of(u.grad_full));
    u.grad_full = torch::Tensor();
    if (!live(u)) continue;
    if (u.always_whole)
      u.state = FsdpUnit::State::sharded;  // keeps its memory; the next forward gathers it again
    else
      s.release_full(u);
  }
}

void gather_all(Impl& s) {
  s.mark_stale();
  for (size_t i = 0; i < s.units.size(); ++i) s.start_gather(i);
  for (size_t i = 0; i < s.units.size(); ++i) s.ensure_whole(i);
}

// Whether anyone but the wrapper holds the module on some rank: then it may be read after the
// wrapper, on every rank alike. Collective, as the gather it decides (which would otherwise hold
// the whole model on every rank for nothing, as a process ends: more than a training step does).
bool module_outlives_wrapper(Impl& s) {
  double held = s.module.use_count() > 1 ? 1 : 0;
  s.group->allreduce(&held, 1, DType::f64, comm::ReduceOp::max);
  return held > 0;
}

// Frees every unit's whole memory: nothing will read the module again.
void free_all(Impl& s) noexcept {
  s.wait_all_work();
  for (auto& u : s.units) {
    u.gather.reset();
    if (live(u)) s.release_full(u);
  }
}

// The module outlives its wrapper: its parameters get the whole values (every rank destroys its
// wrapper, so the all-gathers meet). Not while an exception unwinds: the peers may be gone, and
// waiting would only end at the op's deadline; nor on an aborted group (an in-place recovery's
// teardown), where no gather can run; the parameters are NaN then, never silently stale.
void give_back_parameters(Impl& s) noexcept {
  const bool unwinding = std::uncaught_exceptions() > 0, aborted = s.group && s.group->aborted();
  if (!unwinding && !aborted) {
    try {
      if (module_outlives_wrapper(s))
        gather_all(s);
      else
        free_all(s);
      return;
    } catch (const std::exception& e) {
      GZ_LOG(error, "FullyShardedDataParallel: rank ", s.rank,
             ": gathering the parameters at teardown failed: ", e.what());
    } catch (...) {
      GZ_LOG(error, "FullyShardedDataParallel: rank ", s.rank,
             ": gathering the parameters at teardown failed");
    }
  }
  if (s.module.use_count() == 1) return free_all(s);  // no one to mislead: nothing to fill
  GZ_LOG(warn, "FullyShardedDataParallel: rank ", s.rank, ": destroyed ",
         unwinding ? "while an exception unwinds"
         : aborted ? "on an aborted group"
                   : "after a failed gather",
         ": the module's sharded parameters are left NaN");
  s.wait_all_work();
  torch::NoGradGuard no_grad;
  for (auto& u : s.units) {
    u.gather.reset();
    if (!live(u)) continue;
    s.allocate_full(u);
    u.full.fill_(std::numeric_limits<double>::quiet_NaN());
  }
}

}  // namespace

FullyShardedDataParallel::~FullyShardedDataParallel() {
  auto& im = *impl_;
  if (pass_left_open(im)) abandon_pass(im);
  im.remove_hooks();
  give_back_parameters(im);
}

torch::Tensor FullyShardedDataParallel::forward(const std::function<torch::Tensor()>& fn) {
  auto& im = *impl_;
  ActiveScope scope(&im);
  torch::Tensor out;
  try {
    im.begin_forward();
    out = fn();
  } catch (...) {
    abandon_pass(im);  // nothing of a failed forward stays gathered or in flight
    throw;
  }
  const bool grad = torch::GradMode::is_enabled() && out.defined() && out.requires_grad();
  if (grad) out = im.attach_pre_backward(0, out);  // the root stays whole: its backward comes first
  im.end_forward(grad);
  if (grad && im.options.find_unused_parameters) {
    try {
      out = im.tie_unused(out);
    } catch (...) {
      abandon_pass(im);
      throw;
    }
  }
  return out;
}

void FullyShardedDataParallel::Impl::mark_stale() {
  // Whatever is whole outside forward and backward is stale: the optimizer may have stepped the
  // shards since. Its memory is kept for the next gather.
  for (auto& u : units) {
    if (u.gather) ensure_whole(static_cast<size_t>(&u - units.data()));
    if (u.state == FsdpUnit::State::whole) u.state = FsdpUnit::State::sharded;
  }
}

void FullyShardedDataParallel::Impl::begin_forward() {
  if (pass_left_open(*this)) abandon_pass(*this);  // the last forward or backward threw
  mark_stale();
  // The first forward gathers every unit: one that the model does not run through run_unit()
  // must still be whole when it is read. Unless the model promised there is none: then every unit
  // counts as run through run_unit() (none is kept whole) and gathers when it runs.
  const bool first = forwards == 0 && !options.units_only_in_run_unit;
  if (forwards == 0 && options.units_only_in_run_unit)
    for (auto& u : units) u.entered = true;
  cur_order.assign(1, 0);
  for (auto& u : units) {
    u.expected = u.params.size();  // find_unused_parameters sets it at the end of forward
    u.output = torch::Tensor();
    u.tied = false;
  }
  for (size_t i = 0; i < units.size(); ++i)
    if (i == 0 || first || units[i].always_whole) start_gather(i);
  prefetch(1);
  for (size_t i = 0; i < units.size(); ++i)
    if (i == 0 || first || units[i].always_whole) ensure_whole(i);
}

void FullyShardedDataParallel::Impl::end_forward(bool grad) {
  if (!grad) release_full(units[0]);
  if (forwards++ == 0)
    for (size_t i = 1; i < units.size(); ++i) {
      auto& u = units[i];
      if (!live(u) || u.entered) continue;
      u.always_whole = true;
      GZ_LOG(warn, "fully_shard: unit '", u.name,
             "' did not run through gz::run_unit() in the first forward: it stays whole on every rank");
    }
  // A prefetch the forward did not use (the order changed) must not outlive it.
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].state == FsdpUnit::State::gathering) {
      ensure_whole(i);
      if (!units[i].always_whole) release_full(units[i]);
    }
  order = cur_order;
  pos_in_order.assign(units.size(), -1);
  for (size_t p = 0; p < order.size(); ++p)
    if (pos_in_order[order[p]] < 0) pos_in_order[order[p]] = static_cast<int64_t>(p);
}

torch::Tensor run_unit(const torch::nn::Module& unit, const std::function<torch::Tensor()>& fn) {
  auto* s = active_fsdp();
  if (!s) return fn();
  auto it = s->unit_of_module.find(&unit);
  if (it == s->unit_of_module.end() || s->units[it->second].params.empty()) return fn();
  return s->run_unit(it->second, fn);
}

std::shared_ptr<FullyShardedDataParallel> fully_shard(std::shared_ptr<torch::nn::Module> module,
                                                      std::vector<std::shared_ptr<torch::nn::Module>> units,
                                                      comm::CommPtr group, FullyShardOptions options) {
  return std::make_shared<FullyShardedDataParallel>(std::move(module), std::move(units), std::move(group),
                                                    options);
}

std::vector<torch::Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<torch::Tensor> out;
  for (auto& u : impl_->units)
    if (live(u)) out.push_back(u.shard);
  return out;
}

void FullyShardedDataParallel::unshard() {
  auto& im = *impl_;
  GZ_CHECK_ARG(!im.in_forward, "FullyShardedDataParallel: unshard() inside forward()");
  if (pass_left_open(im)) abandon_pass(im);
  gather_all(im);
}

std::vector<torch::Tensor> FullyShardedDataParallel::gather_full_parameters() {
  auto& im = *impl_;
  GZ_CHECK_ARG(!im.in_forward, "FullyShardedDataParallel: gather_full_parameters() inside forward()");
  std::unordered_map<const void*, torch::Tensor> whole;
  torch::NoGradGuard no_grad;
  for (auto& u : im.units) {
    if (!live(u)) continue;
    auto flat = torch::empty({u.layout.padded(im.world)}, u.shard.options().requires_grad(false));
    allgather_async(u.shard.detach(), flat, im.group)->wait();
    for (size_t j = 0; j < u.params.size(); ++j)
      whole[u.params[j].unsafeGetTensorImpl()] =
          flat.narrow(0, u.layout.offsets[j], u.layout.numels[j]).view(u.params[j].sizes()).clone();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : im.module->parameters()) {
    auto it = whole.find(p.unsafeGetTensorImpl());
    out.push_back(it != whole.end() ? it->second : p.detach().clone());
  }
  return out;
}

std::vector<FullyShardedDataParallel::UnitInfo> FullyShardedDataParallel::units() const {
  std::vector<UnitInfo> out;
  for (auto& u : impl_->units)
    out.push_back(
        {u.name, u.params.size(), live(u) ? u.layout.numel : 0, live(u) ? u.layout.padded(impl_->world) : 0});
  return out;
}

FullyShardMemory FullyShardedDataParallel::memory() const {
  FullyShardMemory m;
  for (auto& u : impl_->units) {
    if (!live(u)) continue;
    m.shard_params += fsdp_bytes_of(u.shard);
    if (u.shard.grad().defined()) m.shard_grads += fsdp_bytes_of(u.shard.grad());
  }
  m.whole_now = impl_->whole_now;
  m.whole_peak = impl_->whole_peak;
  return m;
}

void FullyShardedDataParallel::reset_peak() { impl_->whole_peak = impl_->whole_now; }

const FullyShardOptions& FullyShardedDataParallel::options() const { return impl_->options; }

const comm::CommPtr& FullyShardedDataParallel::group() const { return impl_->group; }

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(FullyShardedDataParallel& fsdp) : fsdp_(fsdp) {
  fsdp_.impl_->sync = false;
}
FullyShardedDataParallel::NoSyncGuard::~NoSyncGuard() { fsdp_.impl_->sync = true; }

}  // namespace gz
