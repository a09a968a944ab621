// Reduce-scatter over the shm segment: per step, every rank writes to its slot the pieces of the
// peers' blocks, then folds its own block from its input and the peers' slots.
#include <algorithm>

#include "comm/reduce/reduce.h"
#include "comm/shm/copy.h"
#include "comm/shm/shm_communicator.h"

namespace gz::comm::shm {

using reduce::reduce_n;

void ShmCommunicator::do_reduce_scatter(const void* send_v, void* recv_v, size_t rc, DType dtype, ReduceOp op) {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::reduce_scatter, rc, 0, dtype, op, -1);
    const char* send = static_cast<const char*>(send_v);
    char* recv = static_cast<char*>(recv_v);
    const int n = size_;
    const size_t es = dtype_size(dtype);
    // Each step moves E elements of every block; block p's piece sits at p * E in the slot.
    const size_t E = std::max<size_t>(1, layout_.slot_bytes / (es * n));
    const size_t m = std::max<size_t>(1, (rc + E - 1) / E);
    std::vector<const void*>& srcs = srcs_;
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const size_t len = std::min(E, rc - std::min(rc, base));
      const uint32_t s = (phase_ + 1) % 3;
      for (int p = 0; p < n; ++p)
        if (p != rank_) copy_cached(slot(rank_, s) + p * E * es, send + (size_t(p) * rc + base) * es, len * es);
      step(ctx);
      for (int q = 0; q < n; ++q)
        srcs[q] = q == rank_ ? send + (size_t(rank_) * rc + base) * es : slot(q, s) + rank_ * E * es;
      reduce_n(recv + base * es, nullptr, srcs.data(), n, len, dtype, op, n);
    }
  });
}

}  // namespace gz::comm::shm
