// Zero-copy gradient buckets for PyTorch's own DDP on "gz". torch's Reducer allocates its buckets
// itself (at::empty); our shm engine all-reduces memory from Communicator::alloc_buffer() straight
// between the ranks' copies (two passes over memory instead of four through the shared slots).
// While a scope is open on a thread, the CPU allocations of at least `min_bytes` made on that thread
// come from the group's alloc_buffer(). guozhuang opens one around the Reducer's construction and
// its bucket rebuild, which allocate the same buckets in the same order on every rank, as the
// collective alloc_buffer() requires. Everything else goes to the allocator installed before ours.
#pragma once

#include <cstddef>
#include <memory>

#include "gz/comm/communicator.h"

namespace gz::python {

/// @brief Make ours the CPU allocator (once; it forwards to the previous one outside scopes).
void install_bucket_allocator();

/// @brief Open (or, with a null group, close) this thread's shared-bucket scope.
void set_bucket_scope(std::shared_ptr<comm::Communicator> group, size_t min_bytes);

/// @brief Bytes handed out from alloc_buffer() by scopes so far (tests, benchmarks).
size_t shared_bucket_bytes();
/// @brief Bytes handed out from alloc_buffer() by scopes and not freed yet (tests).
size_t live_shared_bucket_bytes();

}  // namespace gz::python
