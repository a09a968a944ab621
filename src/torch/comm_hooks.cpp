#include "gz/torch/comm_hooks.h"

#include "gz/torch/tensor_adapter.h"

namespace gz {

bool reduce_rows(comm::Communicator& group, GradBucket& bucket) {
  if (!bucket.rows.defined()) return false;
  allreduce_row_sparse(group, bucket.rows, bucket.divisor, bucket.row_state, bucket.row_sparse);
  return true;
}

uint64_t rows_wire_bytes(const GradBucket& bucket) {
  const auto& buf = bucket.buffer;
  const int64_t dense = buf.numel() * static_cast<int64_t>(buf.element_size());
  const int64_t n = bucket.row_state.last_rows;
  if (n < 0) return static_cast<uint64_t>(dense);
  return static_cast<uint64_t>(n * (dense / std::max<int64_t>(bucket.rows.size(0), 1) + 8));
}

CommHook allreduce_hook(std::shared_ptr<CommStats> stats) {
  return [stats](comm::Communicator& group, GradBucket& bucket) {
    if (reduce_rows(group, bucket)) {
      if (stats) stats->add(rows_wire_bytes(bucket));
      return;
    }
    auto& buf = bucket.buffer;
    // Dividing by the world size is the backend's avg: fused into the reduction (one pass over the
    // bucket fewer). Under join() fewer ranks contribute, so divide separately.
    const bool avg = bucket.divisor == group.size() && c10::isFloatingType(buf.scalar_type());
    group.allreduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), to_dtype(buf.scalar_type()),
                    avg ? comm::ReduceOp::avg : comm::ReduceOp::sum);
    if (stats) stats->add(static_cast<uint64_t>(buf.numel() * buf.element_size()));
    if (!avg && bucket.divisor != 1) buf.div_(bucket.divisor);
  };
}

namespace {
CommHook compress_hook(c10::ScalarType wire, std::shared_ptr<CommStats> stats) {
  CommHook plain = allreduce_hook(stats);
  return [wire, stats, plain](comm::Communicator& group, GradBucket& bucket) {
    if (bucket.rows.defined()) return plain(group, bucket);  // rows: few, full precision
    auto& buf = bucket.buffer;
    if (buf.scalar_type() == wire) return plain(group, bucket);
    if (!bucket.state.defined() || bucket.state.numel() != buf.numel() || bucket.state.scalar_type() != wire)
      bucket.state = torch::empty({buf.numel()}, buf.options().dtype(wire));
    // Divide before the cast so the sum of world-size values stays inside the narrow type's range.
    if (bucket.divisor != 1) buf.div_(bucket.divisor);
    bucket.state.copy_(buf);
    group.allreduce(bucket.state.data_ptr(), static_cast<size_t>(buf.numel()), to_dtype(wire),
                    comm::ReduceOp::sum);
    if (stats) stats->add(static_cast<uint64_t>(bucket.state.numel() * bucket.state.element_size()));
    buf.copy_(bucket.state);
  };
}
}  // namespace

CommHook fp16_compress_hook(std::shared_ptr<CommStats> stats) {
  return compress_hook(c10::ScalarType::Half, std::move(stats));
}
CommHook bf16_compress_hook(std::shared_ptr<CommStats> stats) {
  return compress_hook(c10::ScalarType::BFloat16, std::move(stats));
}

}  // namespace gz
