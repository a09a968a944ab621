// ZeRO stage 3 / fully sharded data parallel for LibTorch C++ modules (in the spirit of PyTorch's
// FSDP2 fully_shard): every rank keeps 1/world of each unit's parameters, gradients and optimizer
// state; a unit's parameters are whole only while it runs forward or backward.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/sharded_checkpoint.h"

namespace gz {

/// @brief Options of FullyShardedDataParallel.
struct FullyShardOptions {
  /// @brief While a unit runs forward, start the all-gather of the unit that ran after it in the
  /// last forward (in backward: of the one before it), so that gather overlaps the compute.
  bool prefetch = true;
  /// @brief Free a unit's whole parameters when its forward returns (gathered again for its
  /// backward). false: keep them until its gradients are reduced (less communication, more memory).
  /// The root unit always keeps them: its backward comes first.
  bool reshard_after_forward = true;
  /// @brief Rank whose parameters and buffers every rank starts from (broadcast at construction).
  int root_rank = 0;
  /// @brief Forwards whose loss does not reach every unit or parameter, differently on each rank
  /// (DDP's option of the same name). Each forward() then walks the autograd graph from its output
  /// and agrees with the other ranks (one small all-reduce) on which units some rank's loss
  /// reaches: a unit reached on another rank but not here is tied to the output with a zero
  /// gradient, so every rank gathers and reduce-scatters the same units in the same order, and
  /// a unit waits only for the parameters the graph reaches. false: every rank's loss must reach
  /// the same units (parameters unused on every rank count as zero gradients either way).
  bool find_unused_parameters = false;
  /// @brief Dtype the gradients are reduce-scattered in (e.g. torch::kBFloat16: half the bytes
  /// of fp32), as DDP's fp16/bf16 compression hooks: each rank's flat gradient is divided by the
  /// world size and cast, the sum is cast back into the shard's gradient. Unset: the unit's dtype.
  std::optional<torch::ScalarType> reduce_dtype;
  /// @brief The model promises that it reads a unit's parameters only inside that unit's
  /// gz::run_unit() (as gz::train::ShardUnits models do). The first forward then gathers each unit
  /// when it runs, as later forwards do, instead of gathering every unit first (to find those the
  /// model does not run through run_unit(), which stay whole): its peak is a unit or two instead
  /// of the whole model. A unit no forward runs stays sharded. Broken promise: a unit read outside
  /// run_unit() reads a storage that holds no memory (undefined; typically a crash).
  bool units_only_in_run_unit = false;
};

/// @brief Memory held by a FullyShardedDataParallel on this rank, in bytes.
struct FullyShardMemory {
  int64_t shard_params = 0;  ///< this rank's parameter shards (what the optimizer steps)
  int64_t shard_grads = 0;   ///< this rank's averaged gradient shards (defined ones)
  int64_t whole_now = 0;     ///< whole parameters and gradients of units now unsharded
  int64_t whole_peak = 0;    ///< the most whole_now has been since construction (or reset_peak())
};

/// @brief Fully sharded data parallel (ZeRO stage 3) over module units.
///
/// The parameters of each unit (a submodule; the root module holds those in no unit) are laid out
/// back to back in one flat buffer padded to world blocks; rank r keeps block r (its shard) and the
/// model's parameters become views into a buffer whose memory exists only while the unit is
/// unsharded. LibTorch C++ modules have no forward pre-hooks, so the model marks where a unit
/// runs with gz::run_unit(); the whole model runs through forward():
/// @code
///   auto fsdp = gz::fully_shard(model, {model->block1, model->block2}, group);
///   torch::optim::AdamW opt(fsdp->parameters(), torch::optim::AdamWOptions(1e-3));  // the shards
///   // in Model::forward:  x = gz::run_unit(*block1, [&] { return block1->forward(x); });
///   opt.zero_grad();
///   auto out = fsdp->forward([&] { return model->forward(x); });
///   loss_fn(out, y).backward();   // each unit's gradients reduce-scattered as its backward ends
///   fsdp->clip_grad_norm_(1.0);   // optional: the global norm over every shard
///   opt.step();                   // steps the shards; the next forward gathers them
/// @endcode
/// Forward of a unit: wait for (or start) its all-gather, start the next unit's, run it, free its
/// whole parameters. Backward of a unit (an autograd node on its output): the same, in reverse
/// order; when every parameter of the unit has its gradient, the unit's flat gradient is
/// reduce-scattered (averaged) on the group's progress thread into this rank's shard gradient
/// (added to it when it is already defined: accumulation) and the whole memory is freed. Backward
/// returns once every reduce-scatter has.
///
/// Requirements and limits (each refused with gz::InvalidArgument where it can be detected):
/// the optimizer is built over parameters() and is elementwise (SGD, Adam, AdamW, gz::FusedAdamW,
/// Adagrad, RMSprop: a shard is a flat slice of several parameters, so one parameter group per
/// unit); every parameter of a unit has one dtype and device; a parameter belongs to the smallest
/// unit containing it (units may nest, the root takes the rest); every rank runs the same units in
/// the same order; the module's parameters must not be read outside forward() (they hold no memory
/// between steps: use gather_full_parameters()); buffers are broadcast once, at construction.
/// A unit that the model never runs through gz::run_unit() during the first forward stays whole
/// for good (logged once; it saves no memory, and forward only: its gradients arrive outside a
/// unit's backward and are refused), unless
/// FullyShardOptions::units_only_in_run_unit promises there is none.
///
/// A forward or backward that throws (on every rank alike) leaves nothing behind: forward() and
/// unshard() first wait for its ops, free what it gathered and drop its partial gradients
/// (gradients earlier passes reduced into the shards stay). Destroying the object gives the module
/// its whole parameters back: collective, as every rank destroys its own; while an exception
/// unwinds it does not wait for peers and leaves them NaN instead. When the object holds the
/// module's last reference on every rank (nothing can read it), the units are only freed.
class FullyShardedDataParallel {
 public:
  /// @brief As gz::fully_shard(). Collective.
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                           std::vector<std::shared_ptr<torch::nn::Module>> units, comm::CommPtr group,
                           FullyShardOptions options);
  /// @brief Collective: the module keeps its whole parameters, unless nothing else holds it (see
  /// the class).
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  /// @brief Run the model's forward `fn` with this object active on the calling thread: the root
  /// unit is gathered first, units run through gz::run_unit() gather and free themselves.
  torch::Tensor forward(const std::function<torch::Tensor()>& fn);
  /// @brief The flat parameter shards, one per unit (root first): build the optimizer over these.
  std::vector<torch::Tensor> parameters() const;
  /// @brief Scale the shard gradients so that the global L2 norm over the whole model is at most
  /// max_norm (torch::nn::utils::clip_grad_norm_'s rule); returns the norm before. Collective.
  double clip_grad_norm_(double max_norm);
  /// @brief Drop the shard gradients and any gradients kept by no_sync().
  void zero_grad();

  /// @brief While a guard lives, backward passes keep each unit's whole gradient (summed locally)
  /// instead of reduce-scattering it; the first backward after it reduces the sum. Costs one whole
  /// gradient of the model per rank (as PyTorch's FSDP no_sync). Accumulation without no_sync
  /// (every backward reduces and adds to the shard gradient) needs no guard.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedDataParallel& fsdp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    FullyShardedDataParallel& fsdp_;
  };

  /// @brief Collective: gather every unit into the module's parameters and keep them whole until
  /// the next forward() (which shards them again): for reading the model outside forward(), such
  /// as an evaluation loop or saving it. Holds the whole model meanwhile.
  void unshard();
  /// @brief Collective: copies of the whole parameters, in module->parameters() order.
  std::vector<torch::Tensor> gather_full_parameters();
  /// @brief Collective. Turns `opt` (built over parameters(); one group) into the optimizer over the
  /// module's sharded parameters that unsharded training has: on `root` with every parameter's
  /// whole state (what its save() writes: the format of ZeRO 1/2 and plain training), elsewhere
  /// with none; root -1: none anywhere, to load such a state (not collective then).
  /// restore_optimizer() or shard_optimizer() turns it back.
  void unshard_optimizer(torch::optim::Optimizer& opt, int root = 0);
  /// @brief After unshard_optimizer(): the shards and their state as before (nothing if not).
  void restore_optimizer(torch::optim::Optimizer& opt);
  /// @brief `opt` holds the unsharded state (loaded after unshard_optimizer(opt, -1), the same on
  /// every rank): each shard gets this rank's block of it, and `opt` steps the shards again.
  void shard_optimizer(torch::optim::Optimizer& opt);
  /// @brief After the module's parameters were overwritten while whole (unshard(), then loading
  /// them, the same on every rank): each rank's shards take their block. Not collective.
  void reshard_module();

  /// @brief Sharded checkpoint (gz/torch/sharded_checkpoint.h) of the shards and of `opt`'s state
  /// (`opt` over parameters()). Collective; nothing is gathered.
  void save_sharded(torch::optim::Optimizer& opt, const std::string& dir, const ShardedCheckpointMeta& meta);
  /// @brief This rank's shards and their state in `opt` from a sharded checkpoint of any world size
  /// and stage; the next forward() or unshard() gathers them. Collective: every rank installs or
  /// none does.
  void load_sharded(torch::optim::Optimizer& opt, const std::string& dir, const ShardedCheckpointMeta& expect = {});
  /// @brief Not collective: copies this rank's shards and their state in `opt` now; the function
  /// returned serializes the copy (any thread, while training goes on) in the format of its shard
  /// file with its own manifest (in-memory snapshots). `params` (optional) receives the names of
  /// the parameters the shards hold.
  std::function<std::string()> snapshot_shard(torch::optim::Optimizer& opt, const ShardedCheckpointMeta& meta,
                                              std::vector<std::string>* params = nullptr);
  /// @brief Collective: every rank's shards from its own snapshot_shard() bytes of a job of this world
  /// size; all or nothing, like load_sharded(). `where` names the bytes in errors.
  void load_shard_bytes(torch::optim::Optimizer& opt, const std::string& bytes, const std::string& where,
                        const ShardedCheckpointMeta& expect = {});
  /// @brief Collective: every rank's shards resharded from the snapshot_shard() bytes of a job of
  /// another world size (`shards[q]`: old rank q's; empty where this rank's shards do not need
  /// it); all or nothing, like load_sharded().
  void load_shard_snapshots(torch::optim::Optimizer& opt, const std::vector<std::string>& shards,
                            const std::string& where, const ShardedCheckpointMeta& expect = {});

  /// @brief Units, root first: each one's name (the module's name, "" for the root), parameter
  /// count and padded flat size.
  struct UnitInfo {
    std::string name;
    size_t params = 0;
    int64_t numel = 0, padded = 0;
  };
  std::vector<UnitInfo> units() const;
  FullyShardMemory memory() const;
  void reset_peak();
  /// @brief The options it was built with.
  const FullyShardOptions& options() const;
  const comm::CommPtr& group() const;

  /// @brief Internal state (src/torch/fsdp/fsdp_impl.h).
  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // the autograd hooks hold it weakly
};

/// @brief Shard `module` over `group` (nullptr = the default group): `units` are submodules (for
/// instance each transformer block); the root module is a unit too. Collective.
std::shared_ptr<FullyShardedDataParallel> fully_shard(std::shared_ptr<torch::nn::Module> module,
                                                      std::vector<std::shared_ptr<torch::nn::Module>> units,
                                                      comm::CommPtr group = nullptr,
                                                      FullyShardOptions options = {});

/// @brief The size policy (as FSDP's size_based_auto_wrap_policy): bottom up, a descendant of
/// `module` becomes a unit when its parameters not already in a unit below it reach `min_bytes`.
std::vector<std::shared_ptr<torch::nn::Module>> units_by_size(
    const std::shared_ptr<torch::nn::Module>& module, int64_t min_bytes);

/// @brief Run `fn` (the forward of `unit`) as a sharded unit when a FullyShardedDataParallel that
/// has `unit` is running forward() on this thread; otherwise just `fn()`. Models call it where
/// a unit runs, so the same model code serves plain, DDP and fully sharded training.
torch::Tensor run_unit(const torch::nn::Module& unit, const std::function<torch::Tensor()>& fn);

}  // namespace gz
