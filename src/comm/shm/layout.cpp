// Where the parts of a group's segment lie (see layout.h).
#include "comm/shm/layout.h"

#include <algorithm>

namespace gz::comm::shm {

Layout::Layout(int n, size_t slot) : size(n) {
  slot_bytes = round_up(std::max<size_t>(slot, kLine * size_t(n)), kLine);
  // Point-to-point channels grow with n^2: keep their total near 8 MiB (4 KiB .. 64 KiB each).
  const size_t fair = round_up(std::max<size_t>(4096, (4u << 20) / (size_t(n) * n)), kLine);
  p2p_bytes = std::min({slot_bytes, kMaxP2P, fair});
  ctrl_off = round_up(sizeof(Header), 4096);
  data_off = round_up(ctrl_off + sizeof(RankCtrl) * n, 4096);
  chan_off = round_up(data_off + 3 * slot_bytes * n, 4096);
  total = round_up(chan_off + channel_bytes() * size_t(n) * n, 4096);
}

}  // namespace gz::comm::shm
