// Training configuration: YAML file, overridden by command-line flags, saved to work_dir/config.yaml.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gz::train {

/// @brief Learning-rate schedule settings (the `scheduler:` block).
struct SchedulerConfig {
  std::string name = "cosine";       ///< multi_step, cosine, linear, constant
  int64_t warmup_steps = 0;          ///< linear warm-up length in optimizer steps ...
  double warmup_epochs = 0;          ///< ... or in epochs (used when warmup_steps == 0)
  std::vector<int64_t> milestones;   ///< multi_step: epochs (or steps when unit == "step")
  std::string unit = "epoch";        ///< unit of milestones: epoch | step
  double gamma = 0.1;                ///< multi_step decay factor
  double min_lr = 0;                 ///< floor of cosine / linear decay
};

// --- communication algorithms (gz/torch/compression.h, local_sgd.h, async_model_averager.h) ---
/// @brief Gradient compression (the `compression:` block; modes ddp and horovod).
struct CompressionConfig {
  std::string method = "none";  ///< none, fp16, bf16, powersgd, int8, topk
  int64_t start_step = 0;       ///< powersgd/int8/topk: plain all-reduce for the first N steps
  bool error_feedback = true;   ///< powersgd/int8/topk: feed the compression error into the next step
  int64_t rank = 4;             ///< powersgd: approximation rank
  int64_t int8_chunk = 1024;    ///< int8: elements per min/max chunk
  double topk_ratio = 0.01;     ///< topk: fraction of elements sent
};

/// @brief Model averaging instead of a gradient all-reduce every step (the `averaging:` block; mode ddp).
struct AveragingConfig {
  std::string method = "none";  ///< none, local_sgd (every `period` steps), async (background rounds)
  int64_t period = 8;           ///< local_sgd: H, average every H optimizer steps
  int64_t warmup_steps = 0;     ///< W: plain DDP (gradient all-reduce) for the first W steps
  bool buffers = true;          ///< also average floating-point buffers
  int64_t max_staleness = 4;    ///< async: S, the staleness bound in steps
};
// --- end communication algorithms ---

/// @brief The straggler report (the `straggler:` block; modes ddp and horovod; gz/train/straggler.h).
struct StragglerConfig {
  int64_t every = 10;               ///< steps per window, 0 = off (env GZ_STRAGGLER_EVERY overrides)
  int64_t windows = 3;              ///< windows in a row a rank must be late before it is named
  double threshold_ms = 5;          ///< late means at least this many ms/step behind ...
  double threshold_fraction = 0.2;  ///< ... and at least this fraction of the step
  double min_window_ms = 1000;      ///< windows span at least this long (more steps when steps are short)
  bool link_probe = true;           ///< probe host links when communication dominates the step
};

/// @brief Everything gz-train needs to run one job. Defaults make a small single-process run.
struct TrainConfig {
  // data
  std::string dataset = "fashion_mnist";  ///< fashion_mnist, image_folder, text_lines, synthetic
  std::string train_data;
  std::string test_data;
  int64_t train_limit = 0;  ///< use only the first N training samples (0 = all); quick runs/tests
  int64_t test_limit = 0;   ///< use only the first N test samples (0 = all)
  bool augment = false;     ///< random crop (pad 2) + horizontal flip for images
  int64_t num_workers = 2;  ///< loader prefetch threads (0 = build batches inline)
  // model
  std::string net_type = "cnn";
  int64_t input_size = 28;
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  double dropout = 0.1;
  int64_t hidden = 256;  ///< width of mlp's hidden layers and of bert_small's encoder
  int64_t layers = 4;    ///< mlp's hidden layers, bert_small's encoder blocks
  // optimisation
  int64_t batch_size = 64;  ///< per rank, per micro-step
  int64_t eval_batch_size = 256;
  double lr = 1e-3;
  std::string optimizer = "adamw";  ///< sgd (with momentum), adam, adamw
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string loss = "cross_entropy";  ///< cross_entropy, label_smoothing
  double label_smoothing = 0.1;        ///< used when loss == label_smoothing
  SchedulerConfig scheduler;
  int64_t num_epochs = 1;
  int64_t max_steps = 0;  ///< > 0: stop after this many optimizer steps (overrides num_epochs)
  int64_t gradient_accumulation_steps = 1;
  double max_grad_norm = 0;  ///< > 0: clip gradients to this global norm
  // evaluation, saving, logging
  int64_t eval_steps = 0;  ///< evaluate every N steps; 0 = at the end of every epoch
  int64_t save_steps = 0;  ///< checkpoint every N steps; 0 = at the end of every epoch
  int64_t save_total_limit = 2;  ///< keep at most N checkpoints (the best is never deleted)
  /// @brief false: write no checkpoints at all (benchmarks, memory tests: at zero_stage 3 a
  /// checkpoint consolidates the whole optimizer state on rank 0).
  bool save_checkpoints = true;
  /// @brief Write consolidated disk checkpoints in the background: the training thread copies
  /// the state into host buffers (kept from one save to the next: 1 x the state's bytes) and a
  /// thread writes the copy; one write at a time (a save waits for the last one). false: written
  /// on the training thread, which waits for the file system.
  bool async_checkpoint = true;
  std::string metric_for_best_model = "test_accuracy";
  bool greater_is_better = true;
  int64_t early_stopping_patience = 0;  ///< evaluations without improvement before stopping (0 = off)
  double early_stopping_threshold = 0;
  double prune_sparsity = 0;  ///< > 0: L1 magnitude pruning of weights to this sparsity
  int64_t log_every = 50;
  bool progress = true;
  bool tensorboard = true;
  std::string work_dir = "work_dirs/run";
  // runtime
  int64_t seed = 42;
  int64_t num_threads = 1;  ///< intra-op threads per process (0 = LibTorch default)
  std::string mode = "single";  ///< single, ddp, horovod, dp
  std::string backend = "auto";
  int64_t dp_replicas = 2;  ///< mode dp: CPU replicas
  std::string device = "cpu";  ///< cpu, cuda
  std::string mixed_precision = "no";  ///< no, bf16, fp16 (fp16 needs CUDA)
  CompressionConfig compression;       ///< gradient compression (ddp, horovod)
  AveragingConfig averaging;           ///< local SGD / asynchronous model averaging (ddp)
  std::string finetune;  ///< initial weights (a checkpoint dir/file or model file)
  std::string resume_from_checkpoint;  ///< path, or "auto" = latest in work_dir
  // elastic: resuming on another world size (gz/train/elastic_batch.h)
  std::string elastic_batch = "keep_global";  ///< keep_global | scale_lr
  /// @brief Samples per optimizer step over all ranks; 0 = batch_size x gradient_accumulation_steps
  /// x world of the first launch (a resumed run takes it from the checkpoint).
  int64_t global_batch_size = 0;
  bool log_samples = false;  ///< every rank appends each step's sample indices to work_dir/samples/
  /// @brief In-memory snapshot of the whole training state every N optimizer steps (0 = off),
  /// kept in snapshot_dir on every node (2 generations); resume_from_checkpoint: auto restores
  /// the newest one every rank can get before looking at disk checkpoints.
  int64_t snapshot_every = 0;
  std::string snapshot_dir;  ///< empty: /dev/shm/gz-snapshots-<uid>/<hash of work_dir>
  // ZeRO (mode ddp): 0 = plain DDP; 1 = optimizer state sharded over the ranks (each keeps 1/world
  // of it); 2 = gradients sharded too; 3 = parameters sharded too. Same results as 0.
  int64_t zero_stage = 0;
  /// @brief zero_stage 3: gather the next unit while one computes (gz::FullyShardOptions::prefetch);
  /// false for measuring what the overlap gains.
  bool fsdp_prefetch = true;
  /// @brief auto | consolidated | sharded. sharded: every rank writes its part of the parameters
  /// and optimizer state (checkpoint-<step>/shards/), nothing is gathered; consolidated: rank 0
  /// writes the whole state into state.pt. auto = sharded when zero_stage >= 1 (consolidated, with a
  /// warning, once a save finds a rank that cannot see the folder). Both load at any
  /// stage and world size; sharded needs zero_stage >= 1 and a folder every rank sees.
  std::string checkpoint_format = "auto";
  StragglerConfig straggler;  ///< the straggler report (gz/train/straggler.h)
};

/// @brief Parse a YAML file (may be empty) then apply `--key value` / `--key=value` flags.
/// Unknown keys, wrong types and out-of-range values throw gz::InvalidArgument naming the key and
/// where it came from (file or flag).
TrainConfig load_config(const std::string& yaml_path, const std::vector<std::string>& flags);
/// @brief Same from YAML text (for tests); `origin` names the source in messages.
TrainConfig parse_config(const std::string& yaml_text, const std::vector<std::string>& flags,
                         const std::string& origin = "<string>");
/// @brief YAML text of every field (round-trips through parse_config).
std::string config_to_yaml(const TrainConfig& config);
/// @brief Write config_to_yaml() to `path` atomically.
void save_config(const TrainConfig& config, const std::string& path);
/// @brief Every accepted key ("lr", "scheduler.warmup_steps", ...).
std::vector<std::string> config_keys();
/// @brief Whether `config` writes sharded checkpoints (checkpoint_format, auto resolved).
bool sharded_checkpoints(const TrainConfig& config);

}  // namespace gz::train
