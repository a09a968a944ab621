// broadcast_bytes(): the snapshot sent to the ranks whose node lost it, in chunks (threads over shm).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "gz/comm/shm.h"
#include "gz/train/recovery/chunked_broadcast.h"
#include "support/run_ranks.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_snapshot_broadcast {

using gz::train::broadcast_bytes;

namespace {

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

}  // namespace

// A payload of 3.5 chunks from a root that is not rank 0 arrives bit-equal on every rank, whatever
// the receivers held before (more, fewer or no bytes), as 1 size op + 4 chunk ops: each chunk is
// its own op with its own deadline. Mutation check: one broadcast of the whole payload (as
// before) fails the op count; an offset that does not advance fails the equality.
TEST(SnapshotBroadcast, APayloadOfSeveralChunksArrivesBitEqualInOneOpPerChunk) {
  constexpr size_t kChunk = 1000;
  for (size_t n : {size_t{0}, size_t{1}, kChunk, kChunk + 1, 3 * kChunk + kChunk / 2}) {
    const std::string sent = random_bytes(n, static_cast<unsigned>(n) + 1);
    gz::test::run_ranks(3, [&](int rank, std::shared_ptr<gz::Store> store) {
      gz::comm::ShmOptions so;
      so.timeout = std::chrono::seconds(30);
      auto group = gz::comm::create_shm_communicator(rank, 3, store, so);
      const int root = 2;
      std::string bytes = rank == root ? sent : random_bytes(rank == 0 ? n + 77 : n / 2, 9);
      const uint64_t before = group->sequence();
      broadcast_bytes(*group, bytes, root, kChunk);
      EXPECT_EQ(group->sequence() - before, 1 + (n + kChunk - 1) / kChunk)
          << "rank " << rank << ", " << n << " bytes";
      EXPECT_EQ(bytes.size(), n) << "rank " << rank;
      EXPECT_TRUE(bytes == sent) << "rank " << rank << ": " << n << " bytes differ";
    });
  }
}

}  // namespace test_snapshot_broadcast
