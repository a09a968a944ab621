// Reduce-scatter over the shm segment: per step, every rank writes to its slot the pieces of the
// peers' blocks, then folds its own block from its input and the peers' slots. An input in
// alloc_buffer memory skips the slots: each rank folds its block straight out of every rank's input.
#include <algorithm>

#include "comm/reduce/reduce.h"
#include "comm/shm/copy.h"
#include "comm/shm/shm_communicator.h"

namespace gz::comm::shm {

using reduce::reduce_n;

void ShmCommunicator::do_reduce_scatter(const void* send_v, void* recv_v, size_t rc, DType dtype, ReduceOp op) {
  guarded([&] {
    size_t offset = 0;
    uint64_t tag = 0;
    auto blk = zero_copy_block(send_v, rc * size_ * dtype_size(dtype), &offset, &tag);
    OpCtx ctx = begin_op(OpKind::reduce_scatter, rc, tag, dtype, op, -1);
    const char* send = static_cast<const char*>(send_v);
    char* recv = static_cast<char*>(recv_v);
    if (blk) return reduce_scatter_shared(*blk, offset, recv, rc, dtype, op, ctx);
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

void ShmCommunicator::reduce_scatter_shared(const Shared& b, size_t offset, char* recv, size_t rc,
                                            DType dtype, ReduceOp op, OpCtx& ctx) {
  const size_t es = dtype_size(dtype);
  step(ctx);  // every rank's input is complete, and the descriptors agree
  // One pass: read block `rank` of every input, write it once. recv may be this rank's own block
  // of its input (each vector step loads every source before it stores).
  const size_t piece = std::max<size_t>(1, layout_.slot_bytes / es);
  for (size_t done = 0; done < rc; done += piece) {
    const size_t len = std::min(piece, rc - done);
    const size_t at = offset + (size_t(rank_) * rc + done) * es;
    for (int q = 0; q < size_; ++q) srcs_[q] = b.base[q] + at;
    reduce_n(recv + done * es, nullptr, srcs_.data(), size_, len, dtype, op, size_);
  }
  step(ctx);  // every rank has read its block of my input: the caller may overwrite it
}

std::shared_ptr<ShmCommunicator::Shared> ShmCommunicator::zero_copy_block(const void* p, size_t bytes,
                                                                          size_t* offset,
                                                                          uint64_t* tag) const {
  *tag = 0;
  const bool small = bytes <= small_bytes_ && bytes <= layout_.slot_bytes;
  if (size_ == 1 || small || bytes >= (size_t(1) << 40)) return nullptr;
  auto blk = find_shared(p, bytes, offset);
  if (blk) *tag = ((blk->id + 1) << 40) | *offset;
  return blk;
}

}  // namespace gz::comm::shm
