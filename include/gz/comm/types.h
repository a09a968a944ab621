// Small vocabulary shared by every backend of the LibTorch-free communication layer.
#pragma once

#include <cstdint>
#include <string>

namespace gz::comm {

/// @brief Reduction applied element-wise. avg = sum / world size (integers: truncated).
enum class ReduceOp : uint8_t { sum = 0, avg, min, max, prod };

/// @brief Collective kinds, used for sequence checks and messages.
enum class OpKind : uint8_t {
  allreduce = 0, broadcast, allgather, allgatherv, reduce_scatter, reduce, barrier, send, recv
};

const char* reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& s);
const char* op_kind_name(OpKind k);

}  // namespace gz::comm
