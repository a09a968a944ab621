// What lies where in a shm group's segment: header, per-rank control lines, data slots and the
// point-to-point channels. Every rank computes the same Layout from (size, slot bytes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gz::comm::shm {

constexpr uint64_t kMagic = 0x677a2d73686d3032ull;  // "gz-shm02": liveness is a lock (liveness.h)
constexpr size_t kLine = 64;
constexpr size_t kDefaultChunk = 512 * 1024;  // per step: half of L2; three slots per rank stay in L3
constexpr size_t kDefaultSmall = 16 * 1024;   // at or below: one step, every rank reduces everything
constexpr size_t kMaxP2P = 64 * 1024;
constexpr int kDefaultSpinUs = 50;
constexpr size_t kScratch = 32 * 1024;  // streamed zero-copy all-reduce: one piece, in L1/L2

inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/// Descriptor of one collective, published before its first step (mismatch detection).
struct OpDesc {
  uint64_t coll;
  uint64_t count;
  uint64_t extra;  // allgatherv: hash of the counts; zero-copy allreduce: block and offset
  uint8_t kind, dtype, op, pad;
  int32_t root;
};
static_assert(sizeof(OpDesc) == 32, "OpDesc layout");

struct Header {
  uint64_t magic;
  uint32_t size;
  uint32_t pad;
  uint64_t slot_bytes;
  uint64_t small_bytes;  // latency-path threshold: rank 0's choice, so every rank takes the same path
  alignas(kLine) uint32_t poison;  // 0, or 1 + the rank that aborted
  uint32_t abort_claim;
  alignas(kLine) char reason[512];
};

struct RankCtrl {
  alignas(kLine) uint32_t flag;  // last step published (polled by peers: own line)
  alignas(kLine) OpDesc desc[2];
  alignas(kLine) uint32_t sleepers;  // waiters blocked in futex on `flag`
  int32_t pid;      // for messages only: whether the rank lives is its lock (liveness.h)
  uint32_t closed;  // set before the rank closes its communicator: it left, it did not die
};
static_assert(sizeof(RankCtrl) == 3 * kLine, "RankCtrl layout");

struct ChannelCtrl {
  alignas(kLine) uint32_t head;  // chunks written by the sender
  alignas(kLine) uint32_t head_sleepers;
  alignas(kLine) uint32_t tail;  // chunks consumed by the receiver
  alignas(kLine) uint32_t tail_sleepers;
  alignas(kLine) uint32_t error;  // set by the receiver on a mismatched message
};

struct ChunkHeader {
  int32_t tag;
  uint8_t dtype;
  uint8_t pad[3];
  uint64_t count;   // elements of the whole message
  uint64_t offset;  // first element of this chunk
};

/// @brief Segment layout shared by every rank of a group (computed from size and slot bytes).
struct Layout {
  Layout(int size, size_t slot_bytes);
  int size;
  size_t slot_bytes;  ///< bytes of one data slot (three per rank, reused in a ring)
  size_t p2p_bytes;   ///< bytes of one point-to-point slot (two per ordered pair)
  size_t ctrl_off, data_off, chan_off, total;
  size_t channel_bytes() const { return sizeof(ChannelCtrl) + 2 * (kLine + p2p_bytes); }
};

}  // namespace gz::comm::shm
