// Broadcast over the shm segment: per chunk, the root copies into its slot, one step, every other
// rank copies out of the root's slot.
#include <algorithm>

#include "comm/shm/copy.h"
#include "comm/shm/shm_communicator.h"

namespace gz::comm::shm {

void ShmCommunicator::do_broadcast(void* data_v, size_t count, DType dtype, int root) {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::broadcast, count, 0, dtype, ReduceOp::sum, root);
    char* data = static_cast<char*>(data_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.slot_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    const bool stream = count * es >= stream_bytes_;
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const size_t len = std::min(E, count - std::min(count, base));
      const uint32_t s = (phase_ + 1) % 3;
      if (rank_ == root && size_ > 1) copy_cached(slot(rank_, s), data + base * es, len * es);
      step(ctx);
      if (rank_ != root) to_user(data + base * es, slot(root, s), len * es, stream);
    }
  });
}

}  // namespace gz::comm::shm
