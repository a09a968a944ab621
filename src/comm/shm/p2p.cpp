// Point-to-point over the shm segment: one channel per ordered pair of ranks, two slots each; the
// sender advances `head`, the receiver `tail`, and every chunk carries (tag, dtype, count, offset)
// so that a receive that does not match the send fails on both sides instead of corrupting data.
#include <algorithm>
#include <cstring>

#include "comm/shm/protocol.h"
#include "comm/shm/shm_communicator.h"

namespace gz::comm::shm {

void ShmCommunicator::do_send(const void* data_v, size_t count, DType dtype, int peer, int tag) {
  guarded([&] {
    OpCtx ctx{OpKind::send, current_seq(), op_deadline(), Stopwatch(), OpDesc{}, 0};
    ctx.peer = peer;
    ctx.tag = tag;
    check_interrupts(ctx, nullptr);
    ChannelCtrl& ch = channel(rank_, peer);
    const char* data = static_cast<const char*>(data_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.p2p_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    for (size_t it = 0; it < m; ++it) {
      uint32_t& head = send_head_[peer];
      // Two slots per channel: slot head % 2 is free once the receiver consumed chunk head - 2.
      if (!wait_for(&ch.tail, head - 1, &ch.tail_sleepers, peer, ctx, &ch.error))
        throw TimeoutError(detail::concat(where(ctx), ": deadline passed; rank ", peer, " is not receiving"), peer);
      char* s = channel_slot(rank_, peer, head);
      const size_t base = it * E;
      const size_t len = std::min(E, count - std::min(count, base));
      ChunkHeader hdr{tag, static_cast<uint8_t>(dtype), {0, 0, 0}, count, base};
      std::memcpy(s, &hdr, sizeof hdr);
      if (len) std::memcpy(s + kLine, data + base * es, len * es);
      ++head;
      publish(&ch.head, head, &ch.head_sleepers);
    }
  });
}

void ShmCommunicator::do_recv(void* data_v, size_t count, DType dtype, int peer, int tag) {
  guarded([&] {
    OpCtx ctx{OpKind::recv, current_seq(), op_deadline(), Stopwatch(), OpDesc{}, 0};
    ctx.peer = peer;
    ctx.tag = tag;
    check_interrupts(ctx, nullptr);
    ChannelCtrl& ch = channel(peer, rank_);
    char* data = static_cast<char*>(data_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.p2p_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    for (size_t it = 0; it < m; ++it) {
      uint32_t& tail = recv_tail_[peer];
      if (!wait_for(&ch.head, tail + 1, &ch.head_sleepers, peer, ctx, nullptr))
        throw TimeoutError(detail::concat(where(ctx), ": deadline passed; rank ", peer, " has not sent"), peer);
      const char* s = channel_slot(peer, rank_, tail);
      ChunkHeader hdr;
      std::memcpy(&hdr, s, sizeof hdr);
      const size_t base = it * E;
      if (hdr.tag != tag || hdr.dtype != static_cast<uint8_t>(dtype) || hdr.count != count || hdr.offset != base) {
        __atomic_store_n(&ch.error, 1u, __ATOMIC_SEQ_CST);
        futex_wake(&ch.tail);
        GZ_THROW(InvalidArgument, where(ctx), ": message mismatch: expected tag ", tag, " ", dtype_name(dtype), " x ",
                 count, ", rank ", peer, " sent tag ", hdr.tag, " ", dtype_name(static_cast<DType>(hdr.dtype % 8)),
                 " x ", hdr.count, " (sends and receives between two ranks must match in order)");
      }
      const size_t len = std::min(E, count - std::min(count, base));
      if (len) std::memcpy(data + base * es, s + kLine, len * es);
      ++tail;
      publish(&ch.tail, tail, &ch.tail_sleepers);
    }
  });
}

}  // namespace gz::comm::shm
