// Gradient compression: PowerSGD, 8-bit min-max quantisation and top-k sparsification, with error
// feedback, as communication hooks for DistributedDataParallel and compressors for Horovod mode.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gz/torch/comm_hooks.h"
#include "gz/torch/comm_stats.h"

namespace gz {

/// @brief How gradients travel (DDP comm hook or Horovod-mode compression).
enum class Compression {
  none,      ///< all-reduce in the gradients' dtype
  fp16,      ///< cast to float16 for the all-reduce (2x fewer bytes)
  bf16,      ///< cast to bfloat16 for the all-reduce (2x fewer bytes)
  powersgd,  ///< rank-r approximation of every matrix (PowerSGD), error feedback
  int8,      ///< 8-bit min-max quantisation per chunk, all-gathered, summed exactly; error feedback
  topk,      ///< the k largest |values| with their indices, all-gathered; error feedback
};

/// @brief "none", "fp16", "bf16", "powersgd", "int8", "topk".
const char* to_string(Compression c);
/// @brief Inverse of to_string; gz::InvalidArgument names the accepted values.
Compression parse_compression(const std::string& name);

/// @brief Knobs of the compressing hooks (each reads the ones of its method).
struct CompressionOptions {
  Compression method = Compression::none;
  /// @brief Iterations (steps) all-reduced uncompressed before compression starts (PyTorch's
  /// start_powerSGD_iter): the first steps move the weights the most, and error feedback needs a
  /// sensible starting point. Applies to powersgd, int8 and topk.
  int64_t start_step = 0;
  /// @brief Keep the part of the gradient the compression dropped and add it to the next step's
  /// gradient (error feedback). Applies to powersgd, int8 and topk.
  bool error_feedback = true;
  // --- powersgd ---
  /// @brief Rank r of the approximation M (n x m) ~ P (n x r) Q^T (r x m).
  int64_t powersgd_rank = 4;
  /// @brief Reuse last step's Q as this step's starting point (one power iteration per step
  /// converges over steps) instead of a new random Q.
  bool powersgd_warm_start = true;
  /// @brief Compress a matrix only if (n + m) r x this < n m; smaller ones and 1-D tensors (biases,
  /// norms) are all-reduced uncompressed, packed together.
  double powersgd_min_compression_rate = 2;
  /// @brief Seed of the random initial Q (the same on every rank).
  uint64_t seed = 0;
  // --- int8 ---
  /// @brief Elements per chunk with its own min and max (8 bytes of header per chunk).
  int64_t int8_chunk = 1024;
  // --- topk ---
  /// @brief Fraction of each bucket's elements sent (at least one).
  double topk_ratio = 0.01;
};

/// @brief The hook for `options.method` (none: allreduce_hook, fp16/bf16: the casting hooks).
/// Each call returns a hook with its own state (error feedback, Q matrices, step count), so build
/// one per DDP / DistributedOptimizer. `stats` (optional) counts the bytes it hands to collectives.
CommHook make_comm_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats = nullptr);

/// @brief PowerSGD (Vogels et al. 2019, as PyTorch's powerSGD_hook): per matrix M (a gradient of
/// 2+ dimensions viewed as shape[0] x rest, with error feedback added), P = M Q, all-reduce P,
/// orthogonalise P (Gram-Schmidt), Q = M^T P, all-reduce Q, M ~ P Q^T. Two all-reduces of
/// (n + m) r elements instead of one of n m; Q is kept for the next step (warm start). Tensors not
/// worth compressing ride along with P, uncompressed. The error (input minus result) is fed back.
CommHook powersgd_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats = nullptr);

/// @brief 8-bit min-max quantisation ("ByteGrad"): every chunk of int8_chunk elements is sent as
/// its min and max (f32) and one byte per element, round((x - min) / (max - min) * 255). The
/// quantised buckets are all-gathered and every rank sums the dequantised values of all ranks in
/// rank order, so the result is exactly the sum of the quantised values and the same on every rank
/// (no second quantisation). About 4x fewer bytes than f32; an all-gather sends (n-1) x payload per
/// rank, so past about 8 ranks a plain f32 all-reduce moves fewer bytes. Error feedback keeps each
/// rank's quantisation error.
CommHook int8_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats = nullptr);

/// @brief Top-k sparsification: the k = ceil(topk_ratio x numel) largest |values| of a bucket (with
/// error feedback added) are sent as (value, int32 index) pairs in one all-gather; every rank adds
/// all ranks' pairs in rank order. Error feedback keeps what was not sent, so every coordinate
/// eventually reaches the others.
CommHook topk_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats = nullptr);

}  // namespace gz
