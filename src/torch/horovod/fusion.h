// Horovod mode's data movement (its fusion buffer and ops): the gradients of an agreed group
// averaged in place, in order. A run of same-dtype tensors is packed into the fusion buffer for one
// collective, in the wire type of the compression or through the comm hook; a big uncompressed
// gradient is reduced where it lies; a row-sparse one travels as its non-zero rows.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/core/timeline.h"
#include "gz/torch/distributed_optimizer.h"
#include "gz/torch/row_sparse.h"

namespace gz::horovod {

class Fusion {
 public:
  /// @brief Collective (the fusion buffer comes from group.alloc_buffer). `params` in the agreed
  /// (name) order; `names` alike (kept by reference).
  Fusion(comm::CommPtr group, const std::vector<torch::Tensor>& params, const std::vector<std::string>& names,
         const DistributedOptimizerOptions& options);

  /// @brief Whether a contiguous gradient of this type and size is reduced where it lies, never
  /// packed (uncompressed and big), so it needs no room in the fusion buffer.
  static bool reduced_in_place(Compression c, c10::ScalarType type, int64_t bytes);

  /// @brief Start of a step: comm-hook buckets are numbered from 0 again.
  void begin_step() { hook_bucket_ = 0; }
  /// @brief Collective (progress thread): average the gradients of tensors `idx` across the group.
  void reduce(const std::vector<size_t>& idx);

  /// @brief Collective, once, after the first step (every gradient averaged): rank 0 decides which
  /// tensors travel as rows from then on.
  void decide_row_sparse();
  bool row_sparse_decided() const { return decided_; }
  bool row_sparse(size_t i) const { return row_sparse_[i] != 0; }
  /// @brief Rows all ranks exchanged for tensor i in the last step; -1 when dense or not row-sparse.
  int64_t last_rows(size_t i) const { return row_sparse_[i] ? row_state_[i].last_rows : -1; }
  /// @brief Bytes tensor i puts on the wire when dense; 0 when it travels as rows.
  size_t dense_bytes(size_t i) const;

 private:
  void average(const torch::Tensor& t, c10::ScalarType grad_type);
  void run_hook(const torch::Tensor& flat, std::vector<torch::Tensor> gradients, std::vector<size_t> ids);
  bool in_place(const torch::Tensor& g) const;
  /// @brief Pack tensors idx[k..] of one dtype into the fusion buffer, reduce, unpack; returns the
  /// index after the last one packed.
  size_t reduce_packed(const std::vector<size_t>& idx, size_t k);

  comm::CommPtr group_;
  const std::vector<torch::Tensor>& params_;
  const std::vector<std::string>& names_;
  Compression compression_;
  CommHook hook_;  // empty: all-reduce (cast per `compression_`)
  std::shared_ptr<CommStats> stats_;
  RowSparseOptions row_options_;
  torch::Tensor fusion_;    // bytes, from alloc_buffer
  size_t hook_bucket_ = 0;  // groups handed to hook_ this step
  bool decided_ = false;
  std::vector<uint8_t> row_sparse_;        // per tensor: rows on the wire
  std::vector<RowSparseState> row_state_;  // per tensor
  Timeline* timeline_ = Timeline::process();
};

}  // namespace gz::horovod
