// Host-only pieces of the NCCL backend (no CUDA, no NCCL): which device a rank uses, the header
// that tags a point-to-point message, and the mailbox of messages that arrived before the recv
// that wants them. Kept apart so the tests check them on machines without a GPU.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "gz/core/env.h"

namespace gz::comm::nccl_detail {

/// @brief The CUDA device of a rank: `requested` when >= 0; else LOCAL_RANK, else
/// OMPI_COMM_WORLD_LOCAL_RANK; else rank % device_count. A process that sees exactly one device
/// uses device 0 (launchers that give each rank its own CUDA_VISIBLE_DEVICES). Throws
/// InvalidArgument when no device is visible or the choice is out of range (two ranks on one GPU
/// are not supported by NCCL, so a local rank >= device_count is an error, not a wrap-around).
int choose_cuda_device(int requested, const Env& env, int rank, int device_count);

/// @brief Sent before every point-to-point payload so the receiver can match by tag.
struct P2pHeader {
  uint32_t magic = 0;
  int32_t tag = 0;
  uint64_t bytes = 0;     // payload size that follows (0 = no payload message)
  uint64_t pair_seq = 0;  // messages sent so far from this sender to this receiver
  uint64_t reserved = 0;
};
static_assert(sizeof(P2pHeader) == 32, "P2pHeader is a fixed 32-byte wire record");

constexpr uint32_t kP2pMagic = 0x505a4e47;  // "GNZP" little-endian

P2pHeader make_p2p_header(int tag, uint64_t bytes, uint64_t pair_seq);
/// @brief Throws PeerError naming peer, rank and both sequence numbers when `h` is not the header
/// expected next from `peer` (NCCL paired the wrong messages: the ranks' op orders differ).
void check_p2p_header(const P2pHeader& h, uint64_t expected_seq, int peer, int rank);

/// @brief Messages from one peer that arrived before a recv asked for their tag; FIFO per tag.
template <typename Msg>
class TagMailbox {
 public:
  void put(int tag, uint64_t bytes, Msg msg) {
    by_tag_[tag].emplace_back(bytes, std::move(msg));
    ++count_;
    bytes_ += bytes;
  }
  /// @brief The oldest message with `tag`, with its size, if any.
  std::optional<std::pair<uint64_t, Msg>> take(int tag) {
    auto it = by_tag_.find(tag);
    if (it == by_tag_.end()) return std::nullopt;
    std::pair<uint64_t, Msg> m = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) by_tag_.erase(it);
    --count_;
    bytes_ -= m.first;
    return m;
  }
  size_t count() const { return count_; }
  uint64_t bytes() const { return bytes_; }
  void clear() {
    by_tag_.clear();
    count_ = 0;
    bytes_ = 0;
  }
  /// @brief "tag 3 x2 (8192 bytes), tag 7 x1 (4 bytes)" or "none", for error messages.
  std::string describe() const {
    if (by_tag_.empty()) return "none";
    std::string s;
    for (const auto& [tag, q] : by_tag_) {
      uint64_t b = 0;
      for (const auto& m : q) b += m.first;
      if (!s.empty()) s += ", ";
      s += "tag " + std::to_string(tag) + " x" + std::to_string(q.size()) + " (" + std::to_string(b) + " bytes)";
    }
    return s;
  }

 private:
  std::map<int, std::deque<std::pair<uint64_t, Msg>>> by_tag_;
  size_t count_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace gz::comm::nccl_detail
