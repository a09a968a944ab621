#include "sparse_allreduce.h"

#include <c10/util/Exception.h>

#include "process_group_util.h"

namespace gz::python {

at::Tensor sparse_allreduce_sum(comm::Communicator& c, const at::Tensor& t, const comm::OpOptions& o) {
  const int w = c.size();
  at::Tensor in = t.coalesce();
  at::Tensor idx = in._indices().contiguous();  // [sparse_dim, nnz] int64
  at::Tensor val = in._values().contiguous();   // [nnz, dense dims...]
  const int64_t sparse_dim = idx.size(0);
  const int64_t row = val.numel() / std::max<int64_t>(val.size(0), 1);  // elements per value row
  // Every rank's nnz, then its indices and values (as bytes, any value dtype).
  int64_t nnz = in._nnz();
  std::vector<int64_t> all_nnz(w);
  c.allgather(&nnz, all_nnz.data(), 1, DType::i64, o);
  std::vector<size_t> idx_bytes(w), val_bytes(w);
  int64_t total = 0;
  for (int r = 0; r < w; ++r) {
    idx_bytes[r] = static_cast<size_t>(all_nnz[r] * sparse_dim) * sizeof(int64_t);
    val_bytes[r] = static_cast<size_t>(all_nnz[r] * row) * val.element_size();
    total += all_nnz[r];
  }
  // Indices are gathered rank-major ([nnz_r, sparse_dim] blocks), so transpose them first.
  at::Tensor idx_t = idx.t().contiguous();
  at::Tensor all_idx = at::empty({total, sparse_dim}, idx.options());
  at::Tensor all_val = at::empty({total, row}, val.options());
  c.allgatherv(idx_t.data_ptr(), all_idx.data_ptr(), idx_bytes, kBytes, o);
  c.allgatherv(val.data_ptr(), all_val.data_ptr(), val_bytes, kBytes, o);
  std::vector<int64_t> val_shape = val.sizes().vec();
  val_shape[0] = total;
  return at::sparse_coo_tensor(all_idx.t(), all_val.view(val_shape), in.sizes(), in.options()).coalesce();
}

}  // namespace gz::python
