// Dynamic loss scaling for fp16 training (LibTorch's C++ API has no GradScaler).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace gz {

/// @brief Settings of GradScaler (PyTorch's defaults).
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  ///< disabled: scale() is the identity and step() always steps
};

/// @brief Multiplies the loss by a scale, unscales gradients before the optimizer step, skips steps
/// whose gradients hold inf/nan and adapts the scale: backoff on overflow, growth after
/// growth_interval clean steps. Works on any tensors (CPU too); use one per optimizer.
///
/// Per iteration: `scaler.scale(loss).backward(); scaler.step(opt); scaler.update();`
/// (call unscale_(opt) before step to clip gradients).
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// @brief loss * scale (loss unchanged when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// @brief Divide the gradients of `opt`'s parameters by the scale (once per iteration) and record
  /// whether any is inf/nan.
  void unscale_(torch::optim::Optimizer& opt);
  /// @brief Same on explicit parameters; returns true when some gradient is not finite.
  bool unscale_(const std::vector<torch::Tensor>& params);
  /// @brief unscale_ if not done yet, then opt.step() unless inf/nan was found. Returns true if stepped.
  bool step(torch::optim::Optimizer& opt);
  /// @brief Adapt the scale from this iteration's finding and reset per-iteration state.
  void update();

  double get_scale() const { return scale_; }
  /// @brief Clean steps since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }
  bool found_inf() const { return found_inf_; }
  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  /// @brief State for checkpoints (scale and growth tracker).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace gz
