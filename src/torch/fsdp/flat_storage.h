// A unit's flat buffer gives its memory back while the views into it (the model's parameters,
// tensors autograd saved) stay valid objects: the storage itself is emptied and refilled, as
// PyTorch's FSDP does with storage().resize_(0). The StorageImpl calls are the same in LibTorch
// 1.13 and 2.x (see torch_compat.h).
#pragma once

#include <c10/core/StorageImpl.h>
#include <torch/types.h>

#include <cstddef>

namespace gz::fsdp {

/// @brief Bytes of memory `t`'s storage holds now.
inline size_t storage_bytes(const torch::Tensor& t) { return t.storage().nbytes(); }

/// @brief Give `t`'s storage `bytes` of fresh, uninitialised memory (0: none), without copying;
/// every view of the storage sees the new memory. Nothing may read a view while the storage holds
/// less than the view spans.
inline void set_storage_bytes(const torch::Tensor& t, size_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(bytes ? s->allocator()->allocate(bytes) : c10::DataPtr(nullptr, t.device()));
  s->set_nbytes(bytes);
}

}  // namespace gz::fsdp
