// Row-sparse gradient exchange: a gradient whose rows are mostly zero (an embedding table's: only
// the rows of this step's tokens are touched) travels as (row index, row) pairs instead of whole.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "gz/comm/communicator.h"

namespace gz {

/// @brief When gradients travel as rows (DDPOptions::row_sparse, DistributedOptimizerOptions::row_sparse).
///
/// After the first synchronised step every floating-point gradient with at least `min_rows` rows
/// (dim 0) whose averaged value has at most `max_candidate_density` of its rows non-zero becomes
/// row-sparse (rank 0 decides, every rank follows). From then on, each step: every rank counts its
/// non-zero rows, the counts are all-gathered, and while all ranks' rows together take at most
/// `max_wire_ratio` of the dense gradient's bytes the rows are all-gathered and summed; otherwise
/// that step all-reduces the dense gradient (every rank decides alike from the same counts). The
/// optimizer always sees the dense averaged gradient: results are those of the dense path (float
/// sums in rank order).
struct RowSparseOptions {
  bool enabled = true;
  int64_t min_rows = 64;
  double max_candidate_density = 0.25;
  double max_wire_ratio = 1.0;
};

/// @brief Scratch of one row-sparse gradient, kept across steps (no allocation per step).
struct RowSparseState {
  std::vector<int64_t> counts;  // per rank: rows sent
  std::vector<uint8_t> send;    // [k x int64 index][k rows]
  std::vector<uint8_t> recv;
  /// @brief Rows exchanged in the last call, over all ranks; -1 when it went dense.
  int64_t last_rows = -1;
};

/// @brief Indices (ascending) of the rows (dim 0) of a contiguous CPU tensor that hold any non-zero
/// byte (a row of -0.0 counts as non-zero: it is sent, so every rank ends with the same bits).
std::vector<int64_t> nonzero_rows(const torch::Tensor& t);

/// @brief Whether `grad` qualifies as row-sparse under `options` (see RowSparseOptions).
bool is_row_sparse_candidate(const torch::Tensor& grad, const RowSparseOptions& options);

/// @brief Replace `grad` (contiguous, CPU, floating point, dim >= 1) on every rank of `group` by
/// (sum over ranks) / divisor, moving only non-zero rows when that is cheaper (see
/// RowSparseOptions). Collective: every rank calls it for the same gradient in the same order.
/// Returns true when rows were exchanged, false when the dense all-reduce ran.
bool allreduce_row_sparse(comm::Communicator& group, const torch::Tensor& grad, double divisor,
                          RowSparseState& state, const RowSparseOptions& options);

}  // namespace gz
