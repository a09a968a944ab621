// The Python package's bucket allocator (python/src/bucket_allocator.cpp), which serves torch's DDP
// Reducer its buckets from the group's alloc_buffer() inside a scope: it must keep c10's Allocator
// contract, raw_allocate()/raw_deallocate() included (raw_deleter() frees what the scope handed out).
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "bucket_allocator.h"
#include "torch/support/torch_test_util.h"

namespace {
using namespace gz;
using namespace gz::test;

TEST(BucketAllocator, RawAllocationsInsideAScopeAreFreedByTheRawDeleter) {
  // One rank: the allocator's path is the same at any size (the group's alloc_buffer() decides
  // where memory comes from), and one thread keeps the process-wide byte count exact.
  constexpr size_t kMin = 4096, kBig = 1 << 16;
  run_ranks(1, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, 1, store);
    python::install_bucket_allocator();
    c10::Allocator* a = c10::GetCPUAllocator();
    python::set_bucket_scope(g, kMin);
    const size_t live0 = python::live_shared_bucket_bytes();
    // The ordinary path: a DataPtr from the group's buffers, freed with the tensor.
    {
      auto t = torch::empty({static_cast<int64_t>(kBig / 4)});
      EXPECT_GE(python::live_shared_bucket_bytes(), live0 + kBig);
    }
    // c10's raw path: raw_allocate() needs data == context, raw_deallocate() uses raw_deleter().
    void* p = nullptr;
    try {
      p = a->raw_allocate(kBig);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "raw_allocate inside a scope: " << e.what();
    }
    if (p) {
      EXPECT_GE(python::live_shared_bucket_bytes(), live0 + kBig);
      std::memset(p, 1, kBig);
      a->raw_deallocate(p);
    }
    python::set_bucket_scope(nullptr, 0);
    // Outside a scope the wrapped allocator serves and frees, raw or not.
    void* q = a->raw_allocate(kBig);
    std::memset(q, 2, kBig);
    a->raw_deallocate(q);
    EXPECT_EQ(python::live_shared_bucket_bytes(), live0) << "rank " << r << ": scoped memory not freed";
  });
}

}  // namespace
