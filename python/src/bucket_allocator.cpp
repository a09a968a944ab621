#include "bucket_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstring>

namespace gz::python {

namespace {

struct Scope {
  std::shared_ptr<comm::Communicator> group;
  size_t min_bytes = 0;
};
thread_local Scope tls_scope;
std::atomic<size_t> g_shared_bytes{0};

// Forwards to the allocator it replaced, except in an open scope for big enough requests.
class BucketAllocator final : public c10::Allocator {
 public:
  explicit BucketAllocator(c10::Allocator* next) : next_(next) {}

  // LibTorch 2.x made allocate() non-const and added copy_data(); 1.13 has the const form only.
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return allocate_impl(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return allocate_impl(n); }
#endif

  c10::DeleterFnPtr raw_deleter() const override { return next_->raw_deleter(); }

 private:
  c10::DataPtr allocate_impl(size_t n) const {
    const Scope& s = tls_scope;
    if (!s.group || n < s.min_bytes) return next_->allocate(n);
    // Collective: every rank's Reducer makes the same requests in the same order.
    auto mem = s.group->alloc_buffer(n);
    g_shared_bytes += n;
    void* data = mem.get();
    return {data, new std::shared_ptr<void>(std::move(mem)), &release, c10::Device(c10::DeviceType::CPU)};
  }

  static void release(void* ctx) { delete static_cast<std::shared_ptr<void>*>(ctx); }
  c10::Allocator* next_;
};

}  // namespace

void install_bucket_allocator() {
  static BucketAllocator* installed = [] {
    auto* a = new BucketAllocator(c10::GetCPUAllocator());  // lives as long as the process
    c10::SetCPUAllocator(a, /*priority=*/1);                // above the default's 0
    return a;
  }();
  (void)installed;
}

void set_bucket_scope(std::shared_ptr<comm::Communicator> group, size_t min_bytes) {
  tls_scope.group = std::move(group);
  tls_scope.min_bytes = min_bytes;
}

size_t shared_bucket_bytes() { return g_shared_bytes.load(); }

}  // namespace gz::python
