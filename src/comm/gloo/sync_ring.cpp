// A pipelined ring (reduce-scatter, all-gather, or both = all-reduce) on the synchronous mesh,
// driven by the calling thread (see sync_mesh.h).
//
// Messages. Every block is cut into the same number of segments, nseg. Message m (m = 0, 1, ...)
// is segment m % nseg of step m / nseg. Reduce-scatter step s sends block (rank - s - 1) and folds
// block (rank - s - 2) from the left into ours, so after size - 1 steps block `rank` holds the
// full reduction; all-gather step t then sends block (rank - t) and receives block (rank - t - 1)
// from the left straight into place. Either way message m forwards what message m - nseg brought
// in, so it may be written once that one has been read (and reduced).
//
// Schedule. One thread writes to the right and reads from the left: it writes whenever the next
// message is ready and fewer than window() segments are written beyond what it has read, and
// reads otherwise. While it reads and reduces, the kernel carries what it wrote, so both
// directions of every link stay busy. Deadlock freedom: if every rank were blocked in a write,
// summing "written minus read" over the ring gives at most size * window segments, so some link
// holds at most window segments unread; the sender's socket buffer queues that many (the mesh
// sized it so), so its write cannot be blocked. If a rank waits in a read, its left neighbour has
// not written that message yet, and so on around the ring — impossible, as each one has written
// at least one message more than it has read.
#include <gloo/transport/tcp/pair.h>

#include <memory>
#include <vector>

#include "comm/gloo/sync_mesh.h"
#include "gz/core/error.h"

namespace gz::comm::gloo_impl {
namespace {

struct Segment {
  size_t offset;  // elements
  size_t count;
};

}  // namespace

void sync_ring(SyncMesh& mesh, void* data, size_t elem_size, const std::vector<size_t>& offset,
               const std::vector<size_t>& count, const ReduceFn* reduce, bool gather, Deadline deadline,
               int* peer) {
  const int rank = mesh.rank(), size = mesh.size();
  const int right = (rank + 1) % size, left = (rank - 1 + size) % size;
  const SyncMesh::Op op = mesh.begin(deadline);  // the deadline holds for the whole ring
  auto* base = static_cast<uint8_t*>(data);
  const size_t seg_elems = mesh.limits().segment / elem_size;
  if (seg_elems == 0) GZ_THROW(InvalidArgument, "gloo sync ring: no segment size agreed");
  size_t nseg = 1;
  for (size_t c : count) nseg = std::max(nseg, (c + seg_elems - 1) / seg_elems);
  const size_t reduce_steps = reduce ? static_cast<size_t>(size - 1) : 0;
  const size_t gather_steps = gather ? static_cast<size_t>(size - 1) : 0;
  const size_t total = (reduce_steps + gather_steps) * nseg;
  const auto block = [&](long long b) { return static_cast<size_t>(((b % size) + size) % size); };
  // Segment j of block b: the same cut on every rank, so both ends agree on every message.
  const auto segment = [&](size_t b, size_t j) {
    const size_t lo = j * count[b] / nseg, hi = (j + 1) * count[b] / nseg;
    return Segment{offset[b] + lo, hi - lo};
  };
  // Message m: the segment it sends and the one it receives (step s, segment j).
  const auto sent = [&](size_t m) {
    const long long s = static_cast<long long>(m / nseg);
    const long long b =
        m / nseg < reduce_steps ? rank - s - 1 : rank - (s - static_cast<long long>(reduce_steps));
    return segment(block(b), m % nseg);
  };
  const auto received = [&](size_t m) {
    const long long s = static_cast<long long>(m / nseg);
    const long long b =
        m / nseg < reduce_steps ? rank - s - 2 : rank - (s - static_cast<long long>(reduce_steps)) - 1;
    return segment(block(b), m % nseg);
  };

  size_t total_elems = 0;
  for (int b = 0; b < size; ++b) total_elems = std::max(total_elems, offset[b] + count[b]);
  const size_t bytes = total_elems * elem_size;
  using Kind = SyncMesh::Kind;
  std::unique_ptr<::gloo::transport::Buffer> to_inbox, to_place, gathered;
  if (reduce_steps)
    to_inbox = mesh.pair(right).createSendBuffer(SyncMesh::slot(Kind::kRingReduce, rank, right), base, bytes);
  if (gather_steps) {
    to_place = mesh.pair(right).createSendBuffer(SyncMesh::slot(Kind::kRingGather, rank, right), base, bytes);
    gathered = mesh.pair(left).createRecvBuffer(SyncMesh::slot(Kind::kRingGather, left, rank), base, bytes);
  }
  ::gloo::transport::Buffer* inbox = reduce_steps ? &mesh.inbox(left, Kind::kRingReduce) : nullptr;
  const uint8_t* inbox_mem = reduce_steps ? mesh.inbox_data(left, Kind::kRingReduce) : nullptr;
  const size_t window = mesh.window(right);

  size_t written = 0, read = 0;
  bool arrived = false;  // the left neighbour's first message of this op (flight recorder)
  while (read < total) {
    const bool ready =
        written < total && written - read < window && (written < nseg || read > written - nseg);
    if (ready) {
      const Segment g = sent(written);
      if (g.count > 0) {  // empty segments (tiny blocks) are skipped on both ends alike
        *peer = right;
        mesh.arm(right, deadline);
        const bool reducing = written / nseg < reduce_steps;
        auto& out = reducing ? to_inbox : to_place;
        out->send(g.offset * elem_size, g.count * elem_size, reducing ? 0 : g.offset * elem_size);
        out->waitSend();
      }
      ++written;
      continue;
    }
    const Segment g = received(read);
    if (g.count > 0) {
      *peer = left;
      mesh.arm(left, deadline);
      if (read / nseg < reduce_steps) {
        inbox->waitRecv();
        uint8_t* acc = base + g.offset * elem_size;
        (*reduce)(acc, acc, inbox_mem, g.count);
      } else {
        gathered->waitRecv();
      }
      if (!arrived) mesh.note_arrival(left), arrived = true;
    }
    ++read;
  }
  *peer = -1;
}

}  // namespace gz::comm::gloo_impl
