// Small all-reduces on the synchronous mesh: one exchange, no event-loop hop (see sync_mesh.h).
#include <gloo/transport/tcp/pair.h>

#include <cstring>
#include <vector>

#include "comm/gloo/sync_mesh.h"
#include "gz/core/error.h"

namespace gz::comm::gloo_impl {

void sync_exchange_allreduce(SyncMesh& mesh, void* data, size_t count, size_t elem_size,
                             const ReduceFn& reduce, Deadline deadline, int* peer) {
  const int rank = mesh.rank(), size = mesh.size();
  const size_t bytes = count * elem_size;
  if (bytes > mesh.limits().exchange_max)
    GZ_THROW(InvalidArgument, "gloo sync exchange: ", bytes, " bytes > ", mesh.limits().exchange_max);
  *peer = -1;
  const SyncMesh::Op op = mesh.begin(deadline);  // the deadline holds for the whole exchange
  // Write to every peer first (each message fits what its socket may queue unread), then read
  // every peer. One inbox per peer suffices: data lands in an inbox only while its owner reads,
  // and a peer's next message waits in the kernel until then.
  for (int s = 1; s < size; ++s) {
    const int j = (rank + s) % size;
    *peer = j;
    mesh.arm(j, deadline);
    auto out = mesh.pair(j).createSendBuffer(SyncMesh::slot(SyncMesh::kExchange, rank, j), data, bytes);
    out->send(0, bytes, 0);
    out->waitSend();
  }
  for (int s = 1; s < size; ++s) {
    const int j = (rank - s + size) % size;
    *peer = j;
    mesh.arm(j, deadline);
    mesh.inbox(j, SyncMesh::kExchange).waitRecv();
    mesh.note_arrival(j);
  }
  *peer = -1;
  // Contributions in rank order, the same on every rank.
  auto contribution = [&](int r) -> const void* {
    return r == rank ? data : mesh.inbox_data(r, SyncMesh::kExchange);
  };
  if (size == 2) {
    reduce(data, contribution(0), contribution(1), count);
    return;
  }
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  reduce(scratch.data(), contribution(0), contribution(1), count);
  for (int r = 2; r < size; ++r) reduce(scratch.data(), scratch.data(), contribution(r), count);
  std::memcpy(data, scratch.data(), bytes);
}

}  // namespace gz::comm::gloo_impl
