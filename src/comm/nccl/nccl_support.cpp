#include "comm/nccl/nccl_support.h"

#include "gz/core/error.h"

namespace gz::comm::nccl_detail {

int choose_cuda_device(int requested, const Env& env, int rank, int device_count) {
  if (device_count <= 0)
    GZ_THROW(InvalidArgument, "nccl: rank ", rank, " sees no CUDA device (CUDA_VISIBLE_DEVICES='",
             env.get("CUDA_VISIBLE_DEVICES", "<unset>"), "'); the NCCL backend needs one GPU per rank");
  if (requested >= 0) {
    if (requested >= device_count)
      GZ_THROW(InvalidArgument, "nccl: rank ", rank, " asked for CUDA device ", requested, " but only ", device_count,
               " device(s) are visible");
    return requested;
  }
  if (device_count == 1) return 0;
  for (const char* var : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    auto local = env.get_int(var);
    if (!local) continue;
    if (*local < 0 || *local >= device_count)
      GZ_THROW(InvalidArgument, "nccl: rank ", rank, " has ", var, "=", *local, " but only ", device_count,
               " CUDA device(s) are visible; NCCL needs one GPU per rank on a node (start at most ", device_count,
               " ranks per node or set NcclOptions::device)");
    return static_cast<int>(*local);
  }
  return rank % device_count;
}

P2pHeader make_p2p_header(int tag, uint64_t bytes, uint64_t pair_seq) {
  P2pHeader h;
  h.magic = kP2pMagic;
  h.tag = tag;
  h.bytes = bytes;
  h.pair_seq = pair_seq;
  return h;
}

void check_p2p_header(const P2pHeader& h, uint64_t expected_seq, int peer, int rank) {
  if (h.magic != kP2pMagic)
    GZ_THROW(PeerError, "nccl recv on rank ", rank, ": message #", expected_seq, " from rank ", peer,
             " is not a send header (bad magic 0x", std::hex, h.magic, std::dec,
             "); the two ranks issued different ops in between (a collective on one, send/recv on the other?)");
  if (h.pair_seq != expected_seq)
    GZ_THROW(PeerError, "nccl recv on rank ", rank, ": expected message #", expected_seq, " from rank ", peer,
             " but got #", h.pair_seq, " (tag ", h.tag, ")");
}

}  // namespace gz::comm::nccl_detail
