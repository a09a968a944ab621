#include "gz/comm/types.h"

#include "gz/core/error.h"

namespace gz::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "avg" || s == "mean") return ReduceOp::avg;
  if (s == "min") return ReduceOp::min;
  if (s == "max") return ReduceOp::max;
  if (s == "prod" || s == "product") return ReduceOp::prod;
  GZ_THROW(InvalidArgument, "unknown reduce op '", s, "' (expected sum, avg, min, max, prod)");
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::broadcast: return "broadcast";
    case OpKind::allgather: return "allgather";
    case OpKind::allgatherv: return "allgatherv";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::reduce: return "reduce";
    case OpKind::barrier: return "barrier";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
  }
  return "?";
}

}  // namespace gz::comm
