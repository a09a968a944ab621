// Byte strings sent in chunks (snapshots: broadcast to the ranks whose node lost it, or a ZeRO
// shard sent point-to-point to its buddy), each chunk an op with its own deadline.
#include "gz/train/recovery/chunked_broadcast.h"

#include <algorithm>
#include <cstdint>

#include "gz/core/error.h"

namespace gz::train {

void broadcast_bytes(comm::Communicator& group, std::string& bytes, int root, size_t chunk_bytes) {
  if (chunk_bytes == 0) GZ_THROW(InvalidArgument, "broadcast_bytes: chunk_bytes must be positive");
  int64_t size = group.rank() == root ? static_cast<int64_t>(bytes.size()) : 0;
  group.broadcast(&size, 1, DType::i64, root);
  if (group.rank() != root) bytes.resize(static_cast<size_t>(size));
  // Default OpOptions: each chunk's deadline is the group's timeout from when that chunk starts.
  for (size_t at = 0; at < bytes.size(); at += chunk_bytes)
    group.broadcast(bytes.data() + at, std::min(chunk_bytes, bytes.size() - at), DType::u8, root);
}

void send_bytes(comm::Communicator& group, const std::string& bytes, int to, size_t chunk_bytes) {
  if (chunk_bytes == 0) GZ_THROW(InvalidArgument, "send_bytes: chunk_bytes must be positive");
  int64_t size = static_cast<int64_t>(bytes.size());
  group.send(&size, 1, DType::i64, to, kSnapshotTag);
  for (size_t at = 0; at < bytes.size(); at += chunk_bytes)
    group.send(bytes.data() + at, std::min(chunk_bytes, bytes.size() - at), DType::u8, to, kSnapshotTag);
}

std::string recv_bytes(comm::Communicator& group, int from, size_t chunk_bytes) {
  if (chunk_bytes == 0) GZ_THROW(InvalidArgument, "recv_bytes: chunk_bytes must be positive");
  int64_t size = 0;
  group.recv(&size, 1, DType::i64, from, kSnapshotTag);
  if (size < 0) GZ_THROW(Error, "recv_bytes: rank ", from, " announced ", size, " bytes");
  std::string bytes(static_cast<size_t>(size), '\0');
  for (size_t at = 0; at < bytes.size(); at += chunk_bytes)
    group.recv(bytes.data() + at, std::min(chunk_bytes, bytes.size() - at), DType::u8, from, kSnapshotTag);
  return bytes;
}

std::string exchange_bytes(comm::Communicator& group, const std::string* out, int to, int from,
                           bool send_first, size_t chunk_bytes) {
  std::string in;
  if (send_first && out) send_bytes(group, *out, to, chunk_bytes);
  if (from >= 0) in = recv_bytes(group, from, chunk_bytes);
  if (!send_first && out) send_bytes(group, *out, to, chunk_bytes);
  return in;
}

}  // namespace gz::train
