// All-reduce and reduce over the shm segment. Three paths:
// - latency (small messages): one step; every rank copies its input into its slot, then each
//   rank (or only the root) folds all slots in rank order;
// - bandwidth (through the slots): chunks of a slot's size; each rank reduces one part of every
//   chunk and the others copy it out, pipelined so that a chunk's reduce shares a step with the
//   next chunk's copy-in;
// - zero copy (alloc_buffer memory): ranks reduce straight between each other's blocks.
#include <algorithm>
#include <cstring>

#include "comm/reduce/reduce.h"
#include "comm/shm/copy.h"
#include "comm/shm/shm_communicator.h"

namespace gz::comm::shm {

using reduce::reduce_n;

namespace {

struct Part {
  size_t off, len;
};
// Partition of a chunk of `len` elements among n owners, cut at cache-line multiples.
inline Part part_of(size_t len, int n, int i, size_t esize) {
  const size_t align = std::max<size_t>(1, kLine / esize);
  const size_t per = round_up((len + n - 1) / n, align);
  const size_t b = std::min(len, per * size_t(i));
  const size_t e = std::min(len, per * size_t(i + 1));
  return {b, e - b};
}

}  // namespace

void ShmCommunicator::reduce_impl(char* data, size_t count, DType dtype, ReduceOp op, int root, OpCtx& ctx) {
  const size_t es = dtype_size(dtype);
  const int n = size_;
  std::vector<const void*>& srcs = srcs_;
  if (count * es <= small_bytes_ && count * es <= layout_.slot_bytes) {
    // Latency path: one step; every rank (or only the root) folds all inputs in rank order.
    const uint32_t s = (phase_ + 1) % 3;
    if (n > 1 && count) std::memcpy(slot(rank_, s), data, count * es);  // data may be null when count is 0
    step(ctx);
    if (root >= 0 && root != rank_) return;
    for (int q = 0; q < n; ++q) srcs[q] = q == rank_ ? data : slot(q, s);
    reduce_n(data, nullptr, srcs.data(), n, count, dtype, op, n);
    return;
  }
  // Bandwidth path, per chunk: copy into my slot only the parts peers reduce; reduce my own part
  // from my user buffer + peers' slots into my buffer and my slot; copy peers' results out.
  // The reduce of chunk k and the copy-in of chunk k+1 share one step.
  const size_t E = layout_.slot_bytes / es;
  const size_t m = (count + E - 1) / E;
  // Messages far beyond the caches: write results to the user buffer with streaming stores.
  const bool stream = count * es >= stream_bytes_;
  size_t prev_base = 0, prev_len = 0;
  uint32_t prev_slot = 0;
  for (size_t it = 0; it <= m; ++it) {
    if (it > 0) {
      const Part pr = part_of(prev_len, n, rank_, es);
      if (pr.len > 0) {
        char* mine = data + (prev_base + pr.off) * es;
        for (int q = 0; q < n; ++q) srcs[q] = q == rank_ ? mine : slot(q, prev_slot) + pr.off * es;
        reduce_n(mine, slot(rank_, prev_slot) + pr.off * es, srcs.data(), n, pr.len, dtype, op, n);
      }
    }
    const size_t base = it * E;
    const size_t len = it < m ? std::min(E, count - base) : 0;
    const uint32_t s = (phase_ + 1) % 3;
    for (int p = 0; p < n && len > 0; ++p) {
      if (p == rank_) continue;
      const Part pp = part_of(len, n, p, es);
      copy_cached(slot(rank_, s) + pp.off * es, data + (base + pp.off) * es, pp.len * es);
    }
    step(ctx);
    if (it > 0 && (root < 0 || root == rank_)) {
      for (int p = 0; p < n; ++p) {
        if (p == rank_) continue;
        const Part pp = part_of(prev_len, n, p, es);
        char* to = data + (prev_base + pp.off) * es;
        const char* from = slot(p, prev_slot) + pp.off * es;
        to_user(to, from, pp.len * es, stream);
      }
    }
    prev_base = base;
    prev_len = len;
    prev_slot = s;
  }
}

void ShmCommunicator::do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  guarded([&] {
    // alloc_buffer memory beyond the latency path: reduce straight between the ranks' blocks. The
    // descriptor carries block and offset, so ranks passing different memory fail with a mismatch.
    const size_t bytes = count * dtype_size(dtype);
    const bool small = bytes <= small_bytes_ && bytes <= layout_.slot_bytes;
    size_t offset = 0;
    std::shared_ptr<Shared> blk;
    if (size_ > 1 && !small && bytes < (size_t(1) << 40)) blk = find_shared(data, bytes, &offset);
    const uint64_t tag = blk ? ((blk->id + 1) << 40) | offset : 0;
    OpCtx ctx = begin_op(OpKind::allreduce, count, tag, dtype, op, -1);
    // One rank: every op (avg divides by 1) leaves the data as it is; skip two passes over it.
    if (size_ == 1) return;
    if (blk)
      allreduce_shared(*blk, offset, count, dtype, op, ctx);
    else
      reduce_impl(static_cast<char*>(data), count, dtype, op, -1, ctx);
  });
}

void ShmCommunicator::allreduce_shared(const Shared& b, size_t offset, size_t count, DType dtype, ReduceOp op,
                                       OpCtx& ctx) {
  const size_t es = dtype_size(dtype);
  const int n = size_;
  step(ctx);  // every rank's block holds its input, and the descriptors agree
  // My part: read it from every rank's block, write the result into every rank's block. Two
  // passes over the data per rank instead of four through the slots. Pieces of a slot's size keep
  // the result in cache for the copies to the third and later ranks. Far beyond the caches the
  // result goes through a small scratch and out with streaming stores, which skip reading the
  // output lines first and leave the caches to the training step.
  const Part mine = part_of(count, n, rank_, es);
  const bool stream = count * es >= stream_bytes_;
  const size_t piece = std::max<size_t>(1, (stream ? scratch_.size() : layout_.slot_bytes) / es);
  for (size_t done = 0; done < mine.len; done += piece) {
    const size_t len = std::min(piece, mine.len - done);
    const size_t at = offset + (mine.off + done) * es;
    for (int q = 0; q < n; ++q) srcs_[q] = b.base[q] + at;
    if (stream) {
      reduce_n(scratch_.data(), nullptr, srcs_.data(), n, len, dtype, op, n);
      for (int q = 0; q < n; ++q) copy_streaming(b.base[q] + at, scratch_.data(), len * es);
      continue;
    }
    char* me = b.base[rank_] + at;
    // Each vector step loads every source before it stores, so both outputs may be sources.
    reduce_n(me, n == 2 ? b.base[1 - rank_] + at : nullptr, srcs_.data(), n, len, dtype, op, n);
    for (int q = 0; n > 2 && q < n; ++q)
      if (q != rank_) copy_cached(b.base[q] + at, me, len * es);
  }
  step(ctx);  // every block holds the whole result
}

void ShmCommunicator::do_reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::reduce, count, 0, dtype, op, root);
    if (size_ > 1) reduce_impl(static_cast<char*>(data), count, dtype, op, root, ctx);
  });
}

}  // namespace gz::comm::shm
