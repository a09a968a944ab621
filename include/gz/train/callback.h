// Training callbacks: hooks the Trainer calls on every rank; built-ins print/log/save on the main
// process only.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gz/core/deadline.h"

namespace gz::train {

class Trainer;
class TensorBoardWriter;

/// @brief Hooks around the training loop. Defaults do nothing. At zero_stage 3 the model's
/// parameters hold no memory between forwards: a hook reading Trainer::model() calls
/// Trainer::gather_model() first (collective: on every rank).
class Callback {
 public:
  virtual ~Callback() = default;
  /// @brief When train() begins, and again (without on_train_end) after an in-place recovery
  /// (Trainer::set_regroup) restored an earlier step: per-run state is reset here.
  virtual void on_train_begin(Trainer&) {}
  virtual void on_train_end(Trainer&) {}
  virtual void on_epoch_begin(Trainer&) {}
  virtual void on_epoch_end(Trainer&) {}
  /// @brief Before the optimizer step's micro-batches (the lr for this step is already set).
  virtual void on_step_begin(Trainer&) {}
  /// @brief After the optimizer step; state().step counts it.
  virtual void on_step_end(Trainer&) {}
  /// @brief After an evaluation; state().metrics hold its (rank-averaged) results.
  virtual void on_evaluate(Trainer&) {}
  /// @brief After a checkpoint was written to `dir`.
  virtual void on_save(Trainer&, const std::string& dir) {}
  /// @brief Whether this callback may change the model's parameters or the optimizer's state.
  /// A background checkpoint or snapshot copies them while training goes on (until the next
  /// optimizer step); before a hook of a callback that may change them the Trainer waits for
  /// that copy. Override to return false in a callback that only reads them: it then runs while
  /// the copy does.
  virtual bool changes_training_state() const { return true; }
};
using CallbackPtr = std::shared_ptr<Callback>;

/// @brief Sets the optimizer lr from the LrScheduler before every step.
class LrSchedulerCallback : public Callback {
 public:
  // Reads parameters and optimizer state at most (the lr it sets is copied at once).
  bool changes_training_state() const override { return false; }
  void on_step_begin(Trainer& t) override;
};

/// @brief Saves a checkpoint every save_steps steps (or each epoch end) and at the end; tracks the
/// best metric; rotation keeps save_total_limit (CheckpointManager).
class ModelCheckpoint : public Callback {
 public:
  bool changes_training_state() const override { return false; }
  void on_train_begin(Trainer&) override { last_saved_ = -1; }  // a replacement starts with none
  void on_step_end(Trainer& t) override;
  void on_epoch_end(Trainer& t) override;
  void on_evaluate(Trainer& t) override;
  void on_train_end(Trainer& t) override;

 private:
  int64_t last_saved_ = -1;
};

/// @brief Stops training after `patience` evaluations without an improvement > threshold.
class EarlyStopping : public Callback {
 public:
  bool changes_training_state() const override { return false; }
  EarlyStopping(int64_t patience, double threshold) : patience_(patience), threshold_(threshold) {}
  void on_evaluate(Trainer& t) override;

 private:
  int64_t patience_;
  double threshold_;
};

/// @brief Appends one JSON line per log/eval event to work_dir/history.jsonl and scalars to
/// TensorBoard event files in work_dir/tb (main process only).
class HistoryLogger : public Callback {
 public:
  bool changes_training_state() const override { return false; }
  explicit HistoryLogger(bool tensorboard);
  ~HistoryLogger() override;
  void on_train_begin(Trainer& t) override;
  void on_step_end(Trainer& t) override;
  void on_evaluate(Trainer& t) override;
  void on_train_end(Trainer& t) override;
  /// @brief One more row of `kind` in history.jsonl and TensorBoard (tags kind/key), for other
  /// built-in callbacks (the straggler report). Main process only; a no-op elsewhere.
  void log(Trainer& t, const std::string& kind, const std::map<std::string, double>& values);

 private:
  void write(const std::string& kind, Trainer& t, const std::map<std::string, double>& values);
  bool tensorboard_;
  std::ofstream jsonl_;
  std::unique_ptr<TensorBoardWriter> tb_;
};

/// @brief Progress bar on the main process: step/total, it/s, ETA, loss, lr. Redraws in place with
/// '\r' on a terminal; plain lines every log_every steps otherwise (or when `bar` is false).
class ProgressBar : public Callback {
 public:
  bool changes_training_state() const override { return false; }
  /// @brief `tty` < 0: detect from stdout.
  explicit ProgressBar(bool bar, int tty = -1);
  void on_train_begin(Trainer& t) override;
  void on_step_end(Trainer& t) override;
  void on_evaluate(Trainer& t) override;
  void on_train_end(Trainer& t) override;

 private:
  void draw(Trainer& t, bool final_line);
  bool bar_;
  bool tty_;
  Stopwatch clock_;
  Stopwatch since_draw_;
  int64_t start_step_ = 0;
  bool dirty_ = false;
};

/// @brief L1 magnitude pruning: after every optimizer step, zero the smallest-|w| fraction
/// `sparsity` of each weight tensor (dim >= 2) with masks computed once at the first step.
class PruningCallback : public Callback {
 public:
  explicit PruningCallback(double sparsity) : sparsity_(sparsity) {}
  /// @brief Masks again from the weights after the next step: after an in-place recovery the
  /// survivors' masks would differ from a replacement's.
  void on_train_begin(Trainer&) override { impl_.reset(); }
  void on_step_end(Trainer& t) override;
  void on_train_end(Trainer& t) override;

 private:
  double sparsity_;
  bool masks_ready_ = false;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// @brief Config key log_samples: every rank writes the dataset indices it trains on in each step to
/// work_dir/samples/session-<session id>-rank<r>.txt: a header line
/// "# session S world W rank R start_step X epoch E epoch_samples C global_batch G", then one line
/// per optimizer step, "<epoch> <step> <n> <index>...", written when the step begins (see
/// sample_log.cpp for why), and "done <step>" when it ends. A resumed run starts a new session, so an
/// auditor (tests/train/check_sample_log.py) can keep, for every step, the last session that ran
/// it and check that each epoch read every sample of its order at most once and none twice.
class SampleLog : public Callback {
 public:
  bool changes_training_state() const override { return false; }
  void on_train_begin(Trainer& t) override;
  void on_step_begin(Trainer& t) override;
  void on_step_end(Trainer& t) override;
  void on_train_end(Trainer& t) override;

 private:
  std::ofstream out_;
};

}  // namespace gz::train
