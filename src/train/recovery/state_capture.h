// The Trainer's state as a checkpoint or snapshot archive holds it, and its copy into host buffers
// that the next snapshot reuses: the training thread only copies, the snapshot writer's thread
// builds the archive from the copy (docs/reliability.md, "In-memory snapshots").
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

#include "gz/torch/grad_scaler.h"
#include "gz/train/checkpoint.h"

namespace gz::train {

/// @brief What a checkpoint archive holds, by reference: the live tensors (a disk checkpoint,
/// written at once) or a StateCapture's copies (a snapshot, written on another thread).
struct TrainingState {
  std::vector<NamedTensor> model;  ///< parameters, then buffers
  const torch::optim::Optimizer* optimizer = nullptr;  ///< null: not written (sharded checkpoints)
  GradScaler scaler;
  torch::Tensor rng;              ///< the default CPU generator's state
  std::vector<int64_t> counters;  ///< the Trainer's counters (apply_checkpoint reads them)
  double best_metric = 0;
};

/// @brief The archive of `state`: the one format of checkpoints and snapshots.
void write_training_state(const TrainingState& state, torch::serialize::OutputArchive& root);

/// @brief One copy of a TrainingState in host buffers, allocated by the first capture and reused
/// while the shapes stay. The optimizer's copy is a LibTorch optimizer of the live one's class
/// over the live parameters (only their addresses are read: they key the state in the archive)
/// whose state tensors are the buffers, so its save() writes what the live one's would.
class StateCapture {
 public:
  StateCapture() = default;
  StateCapture(const StateCapture&) = delete;
  StateCapture& operator=(const StateCapture&) = delete;
  /// @brief Waits for a deferred copy still running (it writes into this capture).
  ~StateCapture();
  /// @brief Why `state` cannot be captured (an optimizer whose state this file does not know, a
  /// tensor off the CPU), or empty when it can.
  static std::string unsupported(const TrainingState& state);
  /// @brief Copy `live` into the buffers (the training thread; not while state() is read).
  void capture(const TrainingState& live);
  /// @brief capture(), but the parameters and the optimizer's state tensors (the bulk: what the
  /// next forward and backward only read) are copied on a thread of this capture's; the rest
  /// (buffers, which a forward may change, RNG, scaler, counters, optimizer options) is copied
  /// here. Until wait_copied() returns, nothing may change the live parameters or optimizer state:
  /// the Trainer waits before its next optimizer step (Trainer::finish_state_copies()).
  /// `before_copy`, when set, runs on that thread first (a test slows the copy down with it).
  void capture_deferred(const TrainingState& live, std::function<void()> before_copy = {});
  /// @brief Wait until the last capture's copy is done (any thread, any number of times).
  /// Returns the copy's failure, or null.
  std::exception_ptr wait_copied();
  /// @brief The copy: read by the writer's thread between two captures, after wait_copied().
  const TrainingState& state() const { return state_; }

 private:
  using Bulk = std::vector<std::pair<torch::Tensor, torch::Tensor*>>;  // source, destination
  void capture_into(const TrainingState& live, Bulk* bulk);
  void capture_optimizer(const torch::optim::Optimizer& live, Bulk* bulk);
  void join_copy();
  TrainingState state_;
  std::thread copier_;
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;
  bool copying_ = false;
  std::exception_ptr copy_error_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  const std::type_info* live_type_ = nullptr;  // the class optimizer_ copies
  std::vector<torch::Tensor> live_params_;     // whose addresses optimizer_'s groups hold
};

/// @brief StateCaptures used in turn: acquire() waits until the writer has released the one it
/// returns (built its archive). One capture: each snapshot waits for the last one's archive; two:
/// the writer may lag one snapshot behind, at twice the memory.
class CaptureRing {
 public:
  explicit CaptureRing(int captures);
  /// @brief The next capture, once its last archive is built; busy until release().
  StateCapture& acquire();
  void release(StateCapture& capture);
  int size() const { return static_cast<int>(captures_.size()); }

 private:
  std::vector<std::unique_ptr<StateCapture>> captures_;
  std::vector<bool> busy_;
  size_t next_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace gz::train
