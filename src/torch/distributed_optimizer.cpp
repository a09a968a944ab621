#include "gz/torch/distributed_optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/serialize.h>

#include <algorithm>
#include <numeric>
#include <sstream>
#include <thread>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/process_group.h"
#include "gz/torch/row_sparse.h"
#include "gz/torch/tensor_adapter.h"

namespace gz {

class DistributedOptimizer::Hook : public torch::autograd::FunctionPostHook {
 public:
  Hook(std::shared_ptr<std::atomic<DistributedOptimizer*>> owner, size_t index)
      : owner_(std::move(owner)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto* o = owner_->load()) o->on_ready(index_);
    return outputs;
  }

 private:
  std::shared_ptr<std::atomic<DistributedOptimizer*>> owner_;
  size_t index_;
};

namespace {
// Gradients at least this big are all-reduced where they are: packing them would cost two copies
// of the tensor and save only one collective's fixed cost (Horovod, too, skips the fusion buffer
// for a lone tensor).
constexpr int64_t kInPlaceBytes = int64_t(1) << 20;

c10::ScalarType wire_type(Compression c, c10::ScalarType grad) {
  if (!c10::isFloatingType(grad)) return grad;
  switch (c) {
    case Compression::fp16:
      return c10::ScalarType::Half;
    case Compression::bf16:
      return c10::ScalarType::BFloat16;
    default:
      return grad;
  }
}

// Whether a contiguous gradient of this type and size is all-reduced where it is, never packed
// into the fusion buffer: uncompressed and at least kInPlaceBytes.
bool reduced_in_place(Compression c, c10::ScalarType type, int64_t bytes) {
  return wire_type(c, type) == type && bytes >= kInPlaceBytes;
}
}  // namespace

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                           NamedParameters named_parameters, Compression compression,
                                           int backward_passes_per_step, comm::CommPtr group)
    : DistributedOptimizer(
          std::move(optimizer), std::move(named_parameters),
          [&] {
            DistributedOptimizerOptions o;
            o.compression = compression;
            o.backward_passes_per_step = backward_passes_per_step;
            return o;
          }(),
          std::move(group)) {}

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                           NamedParameters named_parameters,
                                           const DistributedOptimizerOptions& options, comm::CommPtr group)
    : optimizer_(std::move(optimizer)), group_(resolve_group(group)), options_(options) {
  GZ_CHECK_ARG(options_.backward_passes_per_step >= 1,
               "backward_passes_per_step = ", options_.backward_passes_per_step);
  std::sort(named_parameters.begin(), named_parameters.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < named_parameters.size(); ++i) {
    auto& [name, p] = named_parameters[i];
    if (i > 0 && name == named_parameters[i - 1].first)
      GZ_THROW(InvalidArgument, "DistributedOptimizer: duplicate parameter name '", name, "'");
    if (!p.requires_grad()) continue;
    check_device(p, *group_, "DistributedOptimizer");
    to_dtype(p.scalar_type(), "DistributedOptimizer");
    names_.push_back(name);
    params_.push_back(p);
  }
  if (options_.comm_hook) {
    hook_ = options_.comm_hook;
  } else if (options_.compression == Compression::powersgd || options_.compression == Compression::int8 ||
             options_.compression == Compression::topk) {
    CompressionOptions co = options_.compression_options;
    co.method = options_.compression;
    hook_ = make_comm_hook(co, options_.stats);
  }
  passes_.assign(params_.size(), 0);
  submitted_.assign(params_.size(), 0);
  row_sparse_.assign(params_.size(), 0);
  row_state_.resize(params_.size());
  // One fusion buffer for the whole run, big enough for the largest tensor that may pass through
  // it. CPU gradients live contiguous in the arena, so those reduced_in_place() never do and need
  // no room here (for bert-small that is 5 MB of buffer instead of 64 MiB, in /dev/shm on every
  // rank).
  size_t largest = 0, total = 0;
  for (auto& p : params_) {
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    if (p.is_cpu() && reduced_in_place(options_.compression, p.scalar_type(), b)) continue;
    largest = std::max(largest, static_cast<size_t>(b));
    total += static_cast<size_t>(b);
  }
  const size_t bytes = std::min(std::max(options_.fusion_bytes, largest), std::max<size_t>(total, 8));
  // Memory the group can all-reduce in place (shm: mapped by every rank), so a fused all-reduce
  // costs no staging copies. Same size on every rank: the same named parameters everywhere.
  fusion_ = alloc_buffer_tensor(*group_, static_cast<int64_t>(bytes), torch::kUInt8);
  bind_arena();
  alive_ = std::make_shared<std::atomic<DistributedOptimizer*>>(this);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) GZ_THROW(InvalidArgument, "DistributedOptimizer: parameter '", names_[i], "' is not a leaf");
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<Hook>(alive_, i)));
    accumulators_.push_back(std::move(acc));
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  alive_->store(nullptr);
  // The negotiation loop runs on the progress thread with `this`: it must have returned before
  // any member goes. No more gradients will come, so let it stop waiting for them.
  comm::WorkPtr loop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    loop = loop_;
    closing_ = true;
  }
  cv_.notify_all();
  if (loop)
    comm::finish_or_abort(*group_, *loop, "DistributedOptimizer destroyed while its step was still running");
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void DistributedOptimizer::bind_arena() {
  // Every CPU gradient gets a slot of one arena from alloc_buffer, in the agreed (name) order, so
  // its offset is the same on every rank and big gradients are all-reduced there with no staging
  // copies (as DDP's gradient_as_bucket_view). AccumulateGrad adds into the slot in place.
  torch::NoGradGuard no_grad;
  std::vector<int64_t> offset(params_.size(), -1);
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].is_cpu()) continue;
    offset[i] = total;
    total += (params_[i].numel() * params_[i].element_size() + 63) / 64 * 64;
  }
  if (total == 0) return;
  arena_ = alloc_buffer_tensor(*group_, total, torch::kUInt8);
  views_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (offset[i] < 0) continue;
    const auto& p = params_[i];
    // detach(): a plain tensor on the arena's memory, not an autograd view, so zero_grad() may detach_() it.
    views_[i] = arena_.narrow(0, offset[i], p.numel() * p.element_size())
                    .view(p.scalar_type())
                    .view(p.sizes())
                    .detach();
    auto& g = params_[i].mutable_grad();
    if (g.defined()) views_[i].copy_(g);
    g = views_[i];
  }
}

void DistributedOptimizer::on_ready(size_t index) {
  // A gradient that left its arena slot (zero_grad(set_to_none), or replaced by the user) moves
  // back: copied once, then accumulated in place again.
  if (index < views_.size() && views_[index].defined()) {
    auto& g = params_[index].mutable_grad();
    if (!is_bound_to(g, views_[index])) {
      torch::NoGradGuard no_grad;
      if (g.is_sparse()) {  // nn::Embedding sparse(true) with .grad unset: densified into the slot
        views_[index].zero_();
        views_[index].add_(g);
      } else {
        views_[index].copy_(g);
      }
      g = views_[index];
    }
  }
  if (++passes_[index] < options_.backward_passes_per_step) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (submitted_[index]) return;
    submitted_[index] = 1;
    wake = ++num_submitted_ == params_.size();
    if (!plan_.empty()) wake = --plan_left_[plan_group_of_[index]] == 0 || wake;
    if (!loop_) loop_ = group_->submit([this] { run_cycles(); });
  }
  // The loop waits out its cycle time (or, replaying, for its next group); only the last gradient
  // of the step or of a replayed group cuts that short.
  if (wake) cv_.notify_all();
}

void DistributedOptimizer::run_cycles() {
  const size_t n = params_.size();
  const int world = group_->size();
  const Duration stall_error = options_.stall_error.count() > 0 ? options_.stall_error : group_->timeout();
  std::vector<uint8_t> done(n, 0), msg(n + 1), all((n + 1) * world);
  std::vector<Clock::time_point> partial_since(n);
  std::vector<uint8_t> partial(n, 0), warned(n, 0);
  size_t ndone = 0;
  int cycles = 0;
  bool stall_flag = false;
  auto last_progress = Clock::now();
  auto next_cycle = last_progress;            // the first cycle starts at once
  std::vector<std::vector<size_t>> executed;  // the groups reduced this step, in order
  // Every rank holds the same plan (built from agreed groups after the same steps), so every rank
  // replays, or negotiates, alike. A rank waits at most `patience` for its next group before it
  // confirms anyway: the group then fails everywhere and the stall report takes over.
  std::vector<std::vector<size_t>> plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan = plan_;
  }
  bool replay = !plan.empty();
  size_t next_group = 0;
  hook_bucket_ = 0;
  const auto patience = std::min({options_.stall_warning, stall_error, group_->timeout()}) / 2;
  while (ndone < n) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (replay) {
        // Replaying, a cycle costs every rank a rendezvous: enter one only when this rank holds the
        // whole next group (as a DDP bucket), or when backward is over and it never will.
        cv_.wait_for(lock, patience, [&] { return plan_left_[next_group] == 0 || closing_; });
      } else {
        // Cycles start at least cycle_time apart, so the gradients that become ready in between
        // are negotiated and reduced together: one allgather and one fused all-reduce for many
        // tensors (Horovod's background loop does the same) instead of a rendezvous of every rank
        // per ready gradient. Once every local gradient is submitted, go at once: the step waits.
        cv_.wait_until(lock, next_cycle, [&] { return num_submitted_ == n; });
      }
      for (size_t i = 0; i < n; ++i) msg[i] = submitted_[i] && !done[i];
    }
    const auto cycle_start = Clock::now();
    next_cycle = cycle_start + options_.cycle_time;
    msg[n] = stall_flag;
    group_->allgather(msg.data(), all.data(), n + 1, DType::u8);
    if (timeline_) timeline_->span("comm", replay ? "confirm" : "negotiate", cycle_start, Clock::now());
    ++cycles;
    auto everywhere = [&](size_t i) {
      for (int r = 0; r < world; ++r)
        if (!all[r * (n + 1) + i]) return false;
      return true;
    };
    if (replay) {
      // One confirmation covers every following group that all ranks hold by now (communication
      // lagging behind backward, or backward over): they are reduced together, one round trip
      // and one fused all-reduce instead of one each. Every rank saw the same flags, so all take
      // the same groups; the schedule keeps them as separate groups.
      std::vector<size_t> ready;
      while (next_group < plan.size() &&
             std::all_of(plan[next_group].begin(), plan[next_group].end(), everywhere)) {
        const auto& next = plan[next_group++];
        ready.insert(ready.end(), next.begin(), next.end());
        executed.push_back(next);
      }
      if (!ready.empty()) {
        reduce_fused(ready);
        for (size_t i : ready) done[i] = 1;
        ndone += ready.size();
        last_progress = Clock::now();
        continue;
      }
      // Some rank lacks part of the group (no flag is set while replaying): negotiate the rest.
      replay = false;
    }
    std::vector<size_t> agreed;
    bool any_stall = false;
    auto now = Clock::now();
    for (int r = 0; r < world; ++r) any_stall = any_stall || all[r * (n + 1) + n];
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      int have = 0;
      for (int r = 0; r < world; ++r) have += all[r * (n + 1) + i];
      if (have == world) {
        agreed.push_back(i);
        partial[i] = 0;
      } else if (have > 0) {
        if (!partial[i]) {
          partial[i] = 1;
          partial_since[i] = now;
        } else if (now - partial_since[i] >= options_.stall_warning && !warned[i]) {
          warned[i] = 1;
          std::string missing;
          for (int r = 0; r < world; ++r)
            if (!all[r * (n + 1) + i]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          GZ_LOG(warn, "DistributedOptimizer: rank ", group_->rank(), ": tensor '", names_[i],
                 "' submitted by ", have, " of ", world, " ranks; still missing on ranks [", missing,
                 "] after ", format_duration(std::chrono::duration_cast<Duration>(now - partial_since[i])));
        }
        if (now - partial_since[i] >= stall_error) stall_flag = true;
      }
    }
    // Tensors that no rank submitted for too long (e.g. unused everywhere) stall the step too.
    if (agreed.empty() && now - last_progress >= stall_error) stall_flag = true;
    if (!agreed.empty()) last_progress = now;
    if (any_stall) {
      // Every rank saw the same flags, so every rank fails here with the same report.
      std::ostringstream os;
      int listed = 0;
      for (size_t i = 0; i < n && listed < 10; ++i) {
        if (done[i] || !partial[i]) continue;
        os << (listed++ ? "; " : "") << "'" << names_[i] << "' missing on ranks [";
        bool first = true;
        for (int r = 0; r < world; ++r)
          if (!all[r * (n + 1) + i]) {
            os << (first ? "" : ", ") << r;
            first = false;
          }
        os << "]";
      }
      if (!listed)
        for (size_t i = 0; i < n && listed < 10; ++i)
          if (!done[i]) os << (listed++ ? ", " : "not submitted by any rank: ") << "'" << names_[i] << "'";
      GZ_THROW(TimeoutError, "DistributedOptimizer: rank ", group_->rank(), ": stalled after ", cycles,
               " negotiation cycles: ", os.str());
    }
    if (!agreed.empty()) {
      reduce_fused(agreed);
      executed.push_back(agreed);
    }
    for (size_t i : agreed) done[i] = 1;
    ndone += agreed.size();
  }
  last_cycles_ = cycles;
  last_replayed_ = replay;
  // After the first step, before its schedule is recorded: the buckets of the replayed schedule
  // are sized over the gradients that stay dense.
  if (!row_sparse_decided_) decide_row_sparse();
  record_schedule(executed);
}

void DistributedOptimizer::record_schedule(const std::vector<std::vector<size_t>>& executed) {
  // The next step replays this one's groups, merged in order into buckets as DDP's. Merging is
  // idempotent, so a replayed step records the plan it ran. Groups hold agreed indices only, so the
  // plan is the same on every rank.
  std::vector<std::vector<size_t>> plan;
  if (options_.replay_schedule) {
    size_t total = 0;
    for (size_t i = 0; i < params_.size(); ++i)
      if (!row_sparse_[i]) total += static_cast<size_t>(params_[i].numel() * params_[i].element_size());
    const size_t bucket_cap =
        std::min(options_.replay_bucket_bytes,
                 std::max(size_t(1) << 20, total / std::max<size_t>(options_.replay_min_buckets, 1)));
    size_t bytes = 0, cap = std::min(options_.replay_bucket_bytes, size_t(1) << 20);
    for (const auto& g : executed) {
      size_t gb = 0;
      for (size_t i : g) gb += static_cast<size_t>(params_[i].numel() * params_[i].element_size());
      if (plan.empty() || bytes + gb > cap) {
        if (!plan.empty()) cap = bucket_cap;
        plan.emplace_back();
        bytes = 0;
      }
      plan.back().insert(plan.back().end(), g.begin(), g.end());
      bytes += gb;
    }
  }
  std::vector<size_t> group_of(params_.size());
  for (size_t k = 0; k < plan.size(); ++k)
    for (size_t i : plan[k]) group_of[i] = k;
  std::lock_guard<std::mutex> lock(mu_);
  plan_ = std::move(plan);
  plan_group_of_ = std::move(group_of);
}

void DistributedOptimizer::reduce_fused(const std::vector<size_t>& idx) {
  const auto start = Clock::now();
  const double cpu0 = timeline_ ? Timeline::thread_cpu_us() : 0;
  struct Record {  // one span per call, recorded however it leaves
    DistributedOptimizer* self;
    const std::vector<size_t>& idx;
    Clock::time_point start;
    double cpu0;
    ~Record() {
      if (!self->timeline_) return;
      int64_t bytes = 0;
      for (size_t i : idx) bytes += self->params_[i].numel() * self->params_[i].element_size();
      self->timeline_->span("comm", "group of " + std::to_string(idx.size()), start, Clock::now(),
                            "\"bytes\":" + std::to_string(bytes) +
                                ",\"cpu_us\":" + std::to_string(Timeline::thread_cpu_us() - cpu0));
    }
  } record{this, idx, start, cpu0};
  torch::NoGradGuard no_grad;
  const double world = group_->size();
  // Averages `t` (a contiguous tensor of the wire type) in place across the group.
  auto average = [&](const torch::Tensor& t, c10::ScalarType gtype) {
    const auto wtype = t.scalar_type();
    const auto count = static_cast<size_t>(t.numel());
    if (options_.stats) options_.stats->add(static_cast<uint64_t>(t.numel() * t.element_size()));
    if (!c10::isFloatingType(wtype)) {
      group_->allreduce(t.data_ptr(), count, to_dtype(wtype), comm::ReduceOp::sum);
      t.div_(world, "trunc");
    } else if (wtype != gtype) {
      // Compressed: divide first, which keeps the sum inside the narrow wire type's range.
      t.div_(world);
      group_->allreduce(t.data_ptr(), count, to_dtype(wtype), comm::ReduceOp::sum);
    } else {
      // The backend's avg divides inside the reduction: one pass over the buffer fewer.
      group_->allreduce(t.data_ptr(), count, to_dtype(wtype), comm::ReduceOp::avg);
    }
  };
  // Uncompressed, contiguous and big: reduced where it is.
  auto in_place = [&](const torch::Tensor& g) {
    return g.is_contiguous() && reduced_in_place(options_.compression, g.scalar_type(),
                                                 g.numel() * static_cast<int64_t>(g.element_size()));
  };
  size_t k = 0;
  while (k < idx.size()) {
    const auto& g0 = params_[idx[k]].mutable_grad();
    auto gtype = g0.scalar_type();
    auto wtype = wire_type(options_.compression, gtype);
    if (row_sparse_[idx[k]]) {  // rows on the wire, full precision (they are few)
      allreduce_row_sparse(*group_, g0, world, row_state_[idx[k]], options_.row_sparse);
      ++k;
      continue;
    }
    if (in_place(g0)) {
      if (hook_)
        run_hook(g0.view({-1}), {g0}, {idx[k]});
      else
        average(g0, gtype);
      ++k;
      continue;
    }
    // One fused all-reduce per run of same-dtype tensors that fits the fusion buffer.
    const int64_t esize = c10::elementSize(wtype);
    const int64_t cap = fusion_.numel() / esize;
    auto buf = torch::from_blob(fusion_.data_ptr(), {cap}, torch::TensorOptions().dtype(wtype));
    int64_t off = 0;
    size_t start = k;
    while (k < idx.size()) {
      const auto& g = params_[idx[k]].grad();
      if (g.scalar_type() != gtype || off + g.numel() > cap || row_sparse_[idx[k]]) break;
      if (k > start && in_place(g)) break;
      buf.narrow(0, off, g.numel()).view(g.sizes()).copy_(g);
      off += g.numel();
      ++k;
    }
    // The buffer holds every tensor that can come here (see the constructor); fail, never spin.
    if (k == start)
      GZ_THROW(Error, "DistributedOptimizer: gradient of '", names_[idx[k]], "' (",
               g0.numel() * c10::elementSize(wtype), " bytes on the wire) does not fit the ", fusion_.numel(),
               "-byte fusion buffer");
    if (hook_) {
      std::vector<torch::Tensor> views;
      std::vector<size_t> ids;
      int64_t o = 0;
      for (size_t j = start; j < k; ++j) {
        const auto& g = params_[idx[j]].grad();
        views.push_back(buf.narrow(0, o, g.numel()).view(g.sizes()));
        ids.push_back(idx[j]);
        o += g.numel();
      }
      run_hook(buf.narrow(0, 0, off), std::move(views), std::move(ids));
    } else {
      average(buf.narrow(0, 0, off), gtype);
    }
    off = 0;
    for (size_t j = start; j < k; ++j) {
      auto& g = params_[idx[j]].mutable_grad();
      g.copy_(buf.narrow(0, off, g.numel()).view(g.sizes()));
      off += g.numel();
    }
  }
}

void DistributedOptimizer::run_hook(const torch::Tensor& flat, std::vector<torch::Tensor> gradients,
                                    std::vector<size_t> ids) {
  GradBucket b;
  b.index = hook_bucket_++;
  b.buffer = flat;
  b.divisor = group_->size();
  b.gradients = std::move(gradients);
  b.param_ids = std::move(ids);
  hook_(*group_, b);
}

void DistributedOptimizer::synchronize() {
  ScopedPhase waiting(Phase::comm);  // the exposed wait for this step's gradient reductions
  comm::WorkPtr loop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    loop = loop_;
    closing_ = true;  // no more gradients this step: a replayed group still incomplete never will be
  }
  cv_.notify_all();
  std::exception_ptr err;
  if (loop) {
    try {
      loop->wait();
    } catch (...) {
      err = std::current_exception();
    }
    // Past its deadline and still running: abort, so it returns before the next step reuses state.
    if (!loop->is_completed())
      comm::finish_or_abort(*group_, *loop, "DistributedOptimizer: a step's reduction outlived its deadline");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    loop_.reset();
    std::fill(submitted_.begin(), submitted_.end(), 0);
    num_submitted_ = 0;
    closing_ = false;
    if (err) plan_.clear();  // a failed step's schedule means nothing; negotiate the next one
    plan_left_.resize(plan_.size());
    for (size_t k = 0; k < plan_.size(); ++k) plan_left_[k] = plan_[k].size();
  }
  std::fill(passes_.begin(), passes_.end(), 0);
  if (err) std::rethrow_exception(err);
}

void DistributedOptimizer::decide_row_sparse() {
  // On the progress thread at the end of the first step's loop: every gradient is averaged, the
  // same on every rank; rank 0's choice is broadcast anyway so no rank can take the other path
  // (the collectives differ). Read by later loops and, after synchronize(), by the user thread.
  row_sparse_decided_ = true;
  if (!options_.row_sparse.enabled) return;
  std::vector<uint8_t> flags(params_.size(), 0);
  if (group_->rank() == 0)
    for (size_t i = 0; i < params_.size(); ++i)
      flags[i] = is_row_sparse_candidate(params_[i].grad(), options_.row_sparse) ? 1 : 0;
  if (group_->size() > 1) group_->broadcast(flags.data(), flags.size(), DType::u8, 0);
  row_sparse_ = std::move(flags);
}

bool DistributedOptimizer::row_sparse(const std::string& name) const {
  auto it = std::lower_bound(names_.begin(), names_.end(), name);
  if (it == names_.end() || *it != name)
    GZ_THROW(InvalidArgument, "DistributedOptimizer: no tensor '", name, "'");
  return row_sparse_[static_cast<size_t>(it - names_.begin())] != 0;
}

int64_t DistributedOptimizer::last_rows_exchanged(const std::string& name) const {
  if (!row_sparse(name)) return -1;
  auto it = std::lower_bound(names_.begin(), names_.end(), name);
  return row_state_[static_cast<size_t>(it - names_.begin())].last_rows;
}

void DistributedOptimizer::submit_zeros() {
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params_) {
      auto& g = p.mutable_grad();
      if (g.defined())
        g.zero_();
      else
        g = torch::zeros_like(p);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    passes_[i] = options_.backward_passes_per_step - 1;
    on_ready(i);
  }
}

void DistributedOptimizer::step() {
  if (!optimizer_) GZ_THROW(InvalidArgument, "DistributedOptimizer::step: constructed without an optimizer");
  synchronize();
  optimizer_->step();
}

void DistributedOptimizer::zero_grad() {
  if (!optimizer_)
    GZ_THROW(InvalidArgument, "DistributedOptimizer::zero_grad: constructed without an optimizer");
  optimizer_->zero_grad();
}

void DistributedOptimizer::set_backward_passes_per_step(int n) {
  GZ_CHECK_ARG(n >= 1, "backward_passes_per_step = ", n);
  std::lock_guard<std::mutex> lock(mu_);
  options_.backward_passes_per_step = n;
}

void broadcast_parameters(const NamedParameters& params, int root, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params) {
    TensorSpan s(p.detach(), *g, "broadcast_parameters");
    g->broadcast(s.data(), s.count(), s.dtype(), root);
    s.finish();
  }
}

void broadcast_parameters(torch::nn::Module& module, int root, const comm::CommPtr& group) {
  NamedParameters all;
  for (auto& item : module.named_parameters()) all.emplace_back(item.key(), item.value());
  for (auto& item : module.named_buffers()) all.emplace_back(item.key(), item.value());
  broadcast_parameters(all, root, group);
}

void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  // Serialise on root with the optimizer's own archive format (state by parameter position and the
  // groups' hyper-parameters), ship the bytes, load everywhere else.
  std::string bytes;
  if (g->rank() == root) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream os;
    archive.save_to(os);
    bytes = os.str();
  }
  int64_t len = static_cast<int64_t>(bytes.size());
  g->broadcast(&len, 1, DType::i64, root);
  bytes.resize(static_cast<size_t>(len));
  g->broadcast(bytes.data(), bytes.size(), DType::u8, root);
  if (g->rank() != root) {
    std::istringstream is(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(is);
    optimizer.load(archive);
  }
}

}  // namespace gz
