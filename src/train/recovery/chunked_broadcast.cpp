// A byte string broadcast in chunks (the snapshot sent to the ranks whose node lost it).
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

}  // namespace gz::train
