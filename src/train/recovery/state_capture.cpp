// The checkpoint archive's one format, and the copy of the state into reused host buffers.
#include "state_capture.h"

#include <cstring>
#include <typeinfo>

#include "gz/core/error.h"
#include "gz/torch/fused_adamw.h"
#include "torch/torch_compat.h"  // the optimizer's state map key of a parameter

namespace gz::train {

namespace {

namespace optim = torch::optim;

enum class OptimizerKind { unknown, sgd, adam, adamw };

// By exact class: a subclass may save more than its base, and the copy would not hold it.
// FusedAdamW only replaces AdamW's step(): its state and save() are AdamW's.
OptimizerKind kind_of(const optim::Optimizer& opt) {
  const auto& type = typeid(opt);
  if (type == typeid(optim::SGD)) return OptimizerKind::sgd;
  if (type == typeid(optim::Adam)) return OptimizerKind::adam;
  if (type == typeid(optim::AdamW) || type == typeid(FusedAdamW)) return OptimizerKind::adamw;
  return OptimizerKind::unknown;
}

// A LibTorch optimizer of `kind` over `live`'s parameters and options (its state comes later).
std::unique_ptr<optim::Optimizer> make_copy(OptimizerKind kind, const optim::Optimizer& live) {
  std::vector<optim::OptimizerParamGroup> groups;
  for (const auto& g : live.param_groups()) groups.emplace_back(g.params(), g.options().clone());
  switch (kind) {
    case OptimizerKind::sgd:
      return std::make_unique<optim::SGD>(groups, static_cast<const optim::SGDOptions&>(live.defaults()));
    case OptimizerKind::adam:
      return std::make_unique<optim::Adam>(groups, static_cast<const optim::AdamOptions&>(live.defaults()));
    case OptimizerKind::adamw:
      return std::make_unique<optim::AdamW>(groups, static_cast<const optim::AdamWOptions&>(live.defaults()));
    case OptimizerKind::unknown:
      break;
  }
  GZ_THROW(InvalidArgument, "no state copy for optimizer ", typeid(live).name());
}

using Bulk = std::vector<std::pair<torch::Tensor, torch::Tensor*>>;

// `dst` <- `src`'s values on the CPU; `dst`'s memory is reused when shape and dtype match. With
// `bulk`, only `dst` is made ready here; the values are copied later (run_bulk).
void copy_tensor(const torch::Tensor& src, torch::Tensor& dst, Bulk* bulk = nullptr) {
  if (!src.defined()) {
    dst = torch::Tensor();
    return;
  }
  if (!dst.defined() || dst.sizes() != src.sizes() || dst.scalar_type() != src.scalar_type() ||
      dst.strides() != src.strides())
    dst = torch::empty_like(src, src.options().device(torch::kCPU).requires_grad(false));
  if (bulk)
    bulk->emplace_back(src, &dst);
  else
    dst.copy_(src);
}

// On the copy's own thread: a plain memcpy where the layouts match (no intra-op thread pool
// started on this thread, which would compete with the training thread's).
void run_bulk(const Bulk& bulk) {
  torch::NoGradGuard no_grad;
  for (const auto& [src, dst] : bulk) {
    if (src.is_contiguous() && dst->is_contiguous() && src.nbytes() == dst->nbytes())
      std::memcpy(dst->data_ptr(), src.data_ptr(), src.nbytes());
    else
      dst->copy_(src);
  }
}

template <typename State>
State& state_as(std::unique_ptr<optim::OptimizerParamState>& slot) {
  if (!slot) slot = std::make_unique<State>();
  return static_cast<State&>(*slot);
}

template <typename State>
const State& live_as(const optim::OptimizerParamState& live) {
  const auto* s = dynamic_cast<const State*>(&live);
  if (!s)
    GZ_THROW(Error, "optimizer state of class ", typeid(live).name(), ", expected ", typeid(State).name());
  return *s;
}

// Adam and AdamW keep the same fields (LibTorch 1.13 and 2.x alike).
template <typename State>
void copy_adam_state(const optim::OptimizerParamState& from, std::unique_ptr<optim::OptimizerParamState>& to,
                     Bulk* bulk) {
  const auto& src = live_as<State>(from);
  auto& dst = state_as<State>(to);
  dst.step(src.step());
  copy_tensor(src.exp_avg(), dst.exp_avg(), bulk);
  copy_tensor(src.exp_avg_sq(), dst.exp_avg_sq(), bulk);
  copy_tensor(src.max_exp_avg_sq(), dst.max_exp_avg_sq(), bulk);
}

void copy_param_state(OptimizerKind kind, const optim::OptimizerParamState& from,
                      std::unique_ptr<optim::OptimizerParamState>& to, Bulk* bulk) {
  switch (kind) {
    case OptimizerKind::sgd:
      copy_tensor(live_as<optim::SGDParamState>(from).momentum_buffer(),
                  state_as<optim::SGDParamState>(to).momentum_buffer(), bulk);
      return;
    case OptimizerKind::adam:
      return copy_adam_state<optim::AdamParamState>(from, to, bulk);
    case OptimizerKind::adamw:
      return copy_adam_state<optim::AdamWParamState>(from, to, bulk);
    case OptimizerKind::unknown:
      break;
  }
  GZ_THROW(InvalidArgument, "no state copy for this optimizer");
}

std::vector<torch::Tensor> params_of(const optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params()) out.push_back(p);
  return out;
}

bool same_params(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].is_same(b[i])) return false;
  return true;
}

}  // namespace

void write_training_state(const TrainingState& state, torch::serialize::OutputArchive& root) {
  torch::serialize::OutputArchive model_archive, opt_archive, scaler_archive;
  save_module_state(state.model, model_archive);
  root.write("model", model_archive);
  if (state.optimizer) {  // none in a sharded checkpoint's state.pt: the shards hold it
    state.optimizer->save(opt_archive);
    root.write("optimizer", opt_archive);
  }
  state.scaler.save(scaler_archive);
  root.write("scaler", scaler_archive);
  root.write("rng_cpu", state.rng);
  root.write("counters", torch::tensor(state.counters, torch::kInt64));
  root.write("best_metric", torch::tensor({state.best_metric}, torch::kFloat64));
}

std::string StateCapture::unsupported(const TrainingState& state) {
  if (kind_of(*state.optimizer) == OptimizerKind::unknown)
    return detail::concat("optimizer ", typeid(*state.optimizer).name(), " (copied: SGD, Adam, AdamW)");
  for (const auto& t : state.model)
    if (t.tensor.device() != torch::kCPU) return detail::concat("'", t.name, "' on ", t.tensor.device());
  return {};
}

StateCapture::~StateCapture() { join_copy(); }

void StateCapture::join_copy() {
  if (copier_.joinable()) copier_.join();
}

void StateCapture::capture(const TrainingState& live) {
  join_copy();
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    copy_error_ = nullptr;  // a deferred copy's failure belongs to its own capture
  }
  capture_into(live, nullptr);
}

void StateCapture::capture_deferred(const TrainingState& live, std::function<void()> before_copy) {
  join_copy();  // the last copy is done (its archive was built from it): only joined here
  auto bulk = std::make_shared<Bulk>();
  capture_into(live, bulk.get());
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    copying_ = true;
    copy_error_ = nullptr;
  }
  auto copy = [this, bulk, before_copy = std::move(before_copy)] {
    std::exception_ptr error;
    try {
      if (before_copy) before_copy();
      run_bulk(*bulk);
    } catch (...) {
      error = std::current_exception();
    }
    bulk->clear();  // the live tensors' references go before the news that the copy is done
    {
      std::lock_guard<std::mutex> lock(copy_mu_);
      copying_ = false;
      copy_error_ = error;
    }
    copy_cv_.notify_all();
  };
  try {
    copier_ = std::thread(copy);
  } catch (...) {  // std::system_error, or std::bad_alloc for the thread's state
    copy();        // no thread to be had: copied here, as capture() would
  }
}

std::exception_ptr StateCapture::wait_copied() {
  std::unique_lock<std::mutex> lock(copy_mu_);
  copy_cv_.wait(lock, [this] { return !copying_; });
  return copy_error_;
}

void StateCapture::capture_into(const TrainingState& live, Bulk* bulk) {
  torch::NoGradGuard no_grad;
  state_.model.resize(live.model.size());
  for (size_t i = 0; i < live.model.size(); ++i) {
    auto& mine = state_.model[i];
    mine.name = live.model[i].name;
    mine.buffer = live.model[i].buffer;
    // A forward changes buffers (batch norm's running statistics): copied now.
    copy_tensor(live.model[i].tensor, mine.tensor, mine.buffer ? nullptr : bulk);
  }
  capture_optimizer(*live.optimizer, bulk);
  state_.optimizer = optimizer_.get();
  state_.scaler = live.scaler;
  copy_tensor(live.rng, state_.rng);
  state_.counters = live.counters;
  state_.best_metric = live.best_metric;
}

void StateCapture::capture_optimizer(const torch::optim::Optimizer& live, Bulk* bulk) {
  const OptimizerKind kind = kind_of(live);
  auto params = params_of(live);
  // A new optimizer or new parameters (a rebuilt model): a new copy, keyed by the new addresses.
  if (!optimizer_ || *live_type_ != typeid(live) ||
      optimizer_->param_groups().size() != live.param_groups().size() || !same_params(params, live_params_)) {
    optimizer_ = make_copy(kind, live);
    live_type_ = &typeid(live);
    live_params_ = std::move(params);
  }
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(live.param_groups()[g].options().clone());
  auto& mine = optimizer_->state();
  const auto& theirs = live.state();
  for (const auto& p : live_params_) {
    const auto key = torch_compat::state_key(theirs, p);
    const auto it = theirs.find(key);
    if (it == theirs.end())
      mine.erase(key);  // no state before its first step
    else
      copy_param_state(kind, *it->second, mine[key], bulk);
  }
}

CaptureRing::CaptureRing(int captures) {
  for (int i = 0; i < std::max(1, captures); ++i) captures_.push_back(std::make_unique<StateCapture>());
  busy_.assign(captures_.size(), false);
}

StateCapture& CaptureRing::acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  const size_t i = next_;
  cv_.wait(lock, [&] { return !busy_[i]; });
  busy_[i] = true;
  next_ = (i + 1) % captures_.size();
  return *captures_[i];
}

void CaptureRing::release(StateCapture& capture) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < captures_.size(); ++i)
      if (captures_[i].get() == &capture) busy_[i] = false;
  }
  cv_.notify_all();
}

}  // namespace gz::train
