#include "bucket_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace gz::python {

namespace {

struct Scope {
  std::shared_ptr<comm::Communicator> group;
  size_t min_bytes = 0;
};
thread_local Scope tls_scope;
std::atomic<size_t> g_shared_bytes{0};
std::atomic<size_t> g_live_bytes{0};

// What a scope handed out, by data pointer: c10's raw_allocate() hands out the data pointer alone
// (it needs data == context), and raw_deleter() must free it from that pointer.
struct Handed {
  std::shared_ptr<void> mem;
  size_t bytes = 0;
};
std::mutex g_mu;
std::unordered_map<void*, Handed>& handed() {
  static auto* m = new std::unordered_map<void*, Handed>();  // lives as long as the allocator
  return *m;
}

// Forwards to the allocator it replaced, except in an open scope for big enough requests.
class BucketAllocator final : public c10::Allocator {
 public:
  explicit BucketAllocator(c10::Allocator* next) : next_(next) { next_raw_ = next_->raw_deleter(); }

  // LibTorch 2.x made allocate() non-const and added copy_data(); 1.13 has the const form only.
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return allocate_impl(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return allocate_impl(n); }
#endif

  // Frees both kinds: what a scope handed out, and (forwarded) what the wrapped allocator did.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }

 private:
  c10::DataPtr allocate_impl(size_t n) const {
    const Scope& s = tls_scope;
    if (!s.group || n < s.min_bytes) return next_->allocate(n);
    // Collective: every rank's Reducer makes the same requests in the same order.
    auto mem = s.group->alloc_buffer(n);
    void* data = mem.get();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      handed().emplace(data, Handed{std::move(mem), n});
    }
    g_shared_bytes += n;
    g_live_bytes += n;
    return {data, data, &raw_delete, c10::Device(c10::DeviceType::CPU)};
  }

  static void raw_delete(void* data) {
    Handed h;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto it = handed().find(data);
      if (it == handed().end()) {
        if (next_raw_) next_raw_(data);
        return;
      }
      h = std::move(it->second);
      handed().erase(it);
    }
    g_live_bytes -= h.bytes;  // h.mem frees the buffer here, outside the lock
  }

  c10::Allocator* next_;
  static inline c10::DeleterFnPtr next_raw_ = nullptr;  // the wrapped allocator's raw deleter
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
size_t live_shared_bucket_bytes() { return g_live_bytes.load(); }

}  // namespace gz::python
