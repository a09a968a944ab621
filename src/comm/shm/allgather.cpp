// All-gather (equal and varying counts) over the shm segment: per chunk, every rank copies its
// piece into its slot, one step, every rank copies the peers' pieces out. An output in alloc_buffer
// memory skips the slots: each rank copies the peers' pieces straight out of their outputs.
#include <algorithm>
#include <cstring>

#include "comm/shm/copy.h"
#include "comm/shm/shm_communicator.h"

namespace gz::comm::shm {

void ShmCommunicator::do_allgather(const void* send_v, void* recv_v, size_t count, DType dtype) {
  guarded([&] {
    size_t offset = 0;
    uint64_t tag = 0;
    auto blk = zero_copy_block(recv_v, count * size_ * dtype_size(dtype), &offset, &tag);
    OpCtx ctx = begin_op(OpKind::allgather, count, tag, dtype, ReduceOp::sum, -1);
    const char* send = static_cast<const char*>(send_v);
    char* recv = static_cast<char*>(recv_v);
    if (blk) return allgather_shared(*blk, offset, send, recv, count, dtype, ctx);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.slot_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    const bool stream = count * es * size_ >= stream_bytes_;
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const size_t len = std::min(E, count - std::min(count, base));
      const uint32_t s = (phase_ + 1) % 3;
      if (size_ > 1) copy_cached(slot(rank_, s), send + base * es, len * es);
      step(ctx);
      for (int p = 0; p < size_; ++p)
        if (p != rank_) to_user(recv + (size_t(p) * count + base) * es, slot(p, s), len * es, stream);
    }
    char* own = recv + size_t(rank_) * count * es;
    if (own != send) std::memmove(own, send, count * es);
  });
}

void ShmCommunicator::do_allgatherv(const void* send_v, void* recv_v, const std::vector<size_t>& counts,
                                    DType dtype) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the counts: cheap equality check
  size_t total = 0, maxc = 0;
  std::vector<size_t> offs(size_);
  for (int p = 0; p < size_; ++p) {
    offs[p] = total;
    total += counts[p];
    maxc = std::max(maxc, counts[p]);
    hash = (hash ^ counts[p]) * 1099511628211ull;
  }
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::allgatherv, total, hash, dtype, ReduceOp::sum, -1);
    const char* send = static_cast<const char*>(send_v);
    char* recv = static_cast<char*>(recv_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.slot_bytes / es;
    const size_t m = std::max<size_t>(1, (maxc + E - 1) / E);
    const bool stream = total * es >= stream_bytes_;
    auto len_of = [&](int p, size_t base) { return std::min(E, counts[p] - std::min(counts[p], base)); };
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const uint32_t s = (phase_ + 1) % 3;
      if (size_ > 1) copy_cached(slot(rank_, s), send + base * es, len_of(rank_, base) * es);
      step(ctx);
      for (int p = 0; p < size_; ++p)
        if (p != rank_) to_user(recv + (offs[p] + base) * es, slot(p, s), len_of(p, base) * es, stream);
    }
    char* own = recv + offs[rank_] * es;
    if (own != send) std::memmove(own, send, counts[rank_] * es);
  });
}

void ShmCommunicator::allgather_shared(const Shared& b, size_t offset, const char* send, char* recv,
                                       size_t count, DType dtype, OpCtx& ctx) {
  const size_t bytes = count * dtype_size(dtype);
  char* own = recv + size_t(rank_) * bytes;
  if (own != send) std::memmove(own, send, bytes);
  step(ctx);  // every rank's piece sits in its output, and the descriptors agree
  const bool stream = bytes * size_ >= stream_bytes_;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) to_user(recv + size_t(p) * bytes, b.base[p] + offset + size_t(p) * bytes, bytes, stream);
  step(ctx);  // every rank has copied my piece: the caller may overwrite it
}

}  // namespace gz::comm::shm
