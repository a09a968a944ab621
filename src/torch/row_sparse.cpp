#include "gz/torch/row_sparse.h"

#include <algorithm>
#include <cstring>

#include "gz/core/error.h"
#include "gz/torch/tensor_adapter.h"

namespace gz {

namespace {

bool any_nonzero(const uint8_t* p, size_t n) {
  size_t i = 0;
  // Four words per test: a touched row usually fails at the first, an untouched one is read once.
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, sizeof w);
    if (w[0] | w[1] | w[2] | w[3]) return true;
  }
  for (; i < n; ++i)
    if (p[i]) return true;
  return false;
}

size_t round8(size_t b) { return (b + 7) / 8 * 8; }

void check_grad(const torch::Tensor& g, const char* op) {
  GZ_CHECK_ARG(g.defined() && g.is_cpu() && g.is_contiguous() && !g.is_sparse() && g.dim() >= 1, op,
               ": needs a contiguous dense CPU tensor with dim >= 1");
}

// The dense path, as the default DDP hook: the backend's avg when every rank contributes.
void allreduce_dense(comm::Communicator& group, const torch::Tensor& grad, double divisor) {
  const bool avg = divisor == group.size();
  group.allreduce(grad.data_ptr(), static_cast<size_t>(grad.numel()), to_dtype(grad.scalar_type()),
                  avg ? comm::ReduceOp::avg : comm::ReduceOp::sum);
  if (!avg && divisor != 1) grad.div_(divisor);
}

}  // namespace

std::vector<int64_t> nonzero_rows(const torch::Tensor& t) {
  check_grad(t, "nonzero_rows");
  const int64_t rows = t.size(0);
  std::vector<int64_t> out;
  if (rows == 0 || t.numel() == 0) return out;
  const size_t rb = static_cast<size_t>(t.numel() / rows) * t.element_size();
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  for (int64_t r = 0; r < rows; ++r)
    if (any_nonzero(p + static_cast<size_t>(r) * rb, rb)) out.push_back(r);
  return out;
}

bool is_row_sparse_candidate(const torch::Tensor& grad, const RowSparseOptions& options) {
  if (!options.enabled || !grad.defined() || !grad.is_cpu() || grad.is_sparse() || !grad.is_contiguous() ||
      grad.dim() < 2 || !c10::isFloatingType(grad.scalar_type()) || grad.size(0) < options.min_rows ||
      grad.numel() == 0)
    return false;
  return static_cast<double>(nonzero_rows(grad).size()) <=
         options.max_candidate_density * static_cast<double>(grad.size(0));
}

namespace {
// Every rank's row count (st.counts), checked; returns their sum.
int64_t gather_counts(comm::Communicator& group, int64_t k, int64_t rows, RowSparseState& st) {
  const int n = group.size();
  st.counts.assign(static_cast<size_t>(n), 0);
  group.allgather(&k, st.counts.data(), 1, DType::i64);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    if (st.counts[r] < 0 || st.counts[r] > rows)
      GZ_THROW(PeerError, "allreduce_row_sparse: rank ", group.rank(), ": rank ", r, " reports ",
               st.counts[r], " rows of a ", rows, "-row gradient (ranks disagree on the parameter)");
    total += st.counts[r];
  }
  return total;
}

// Every rank sums the same gathered blocks in rank order from zero, so all end with the same bits:
// clear this rank's rows (the others are zero already), then add rank 0's rows, rank 1's, ...
// Returns which rows any rank touched.
std::vector<uint8_t> sum_blocks(comm::Communicator& group, const torch::Tensor& grad,
                                const RowSparseState& st, const std::vector<int64_t>& mine,
                                const std::vector<size_t>& bytes, size_t rb) {
  const int64_t rows = grad.size(0);
  auto* base = static_cast<uint8_t*>(grad.data_ptr());
  for (int64_t r : mine) std::memset(base + static_cast<size_t>(r) * rb, 0, rb);
  std::vector<uint8_t> hit(static_cast<size_t>(rows), 0);
  auto row_shape = grad.sizes().vec();
  size_t off = 0;
  for (int r = 0; r < group.size(); ++r) {
    const int64_t kr = st.counts[r];
    if (kr > 0) {
      auto* idx = reinterpret_cast<const int64_t*>(st.recv.data() + off);
      for (int64_t i = 0; i < kr; ++i) {
        if (idx[i] < 0 || idx[i] >= rows)
          GZ_THROW(PeerError, "allreduce_row_sparse: rank ", group.rank(), ": row index ", idx[i],
                   " from rank ", r, " outside [0, ", rows, ")");
        hit[static_cast<size_t>(idx[i])] = 1;
      }
      row_shape[0] = kr;
      auto index = torch::from_blob(const_cast<int64_t*>(idx), {kr}, torch::kLong);
      auto src = torch::from_blob(const_cast<uint8_t*>(st.recv.data()) + off + kr * sizeof(int64_t),
                                  row_shape, grad.options());
      grad.index_add_(0, index, src);
    }
    off += bytes[r];
  }
  return hit;
}

// Divide the touched rows (the others are zero).
void divide_rows(const torch::Tensor& grad, const std::vector<uint8_t>& hit, double divisor) {
  if (divisor == 1) return;
  std::vector<int64_t> touched;
  for (size_t r = 0; r < hit.size(); ++r)
    if (hit[r]) touched.push_back(static_cast<int64_t>(r));
  if (touched.empty()) return;
  auto u = torch::from_blob(touched.data(), {static_cast<int64_t>(touched.size())}, torch::kLong);
  grad.index_copy_(0, u, grad.index_select(0, u).div_(divisor));
}
}  // namespace

bool allreduce_row_sparse(comm::Communicator& group, const torch::Tensor& grad, double divisor,
                          RowSparseState& st, const RowSparseOptions& options) {
  check_grad(grad, "allreduce_row_sparse");
  GZ_CHECK_ARG(c10::isFloatingType(grad.scalar_type()),
               "allreduce_row_sparse: floating-point gradients only, got ", grad.scalar_type());
  const int n = group.size();
  if (!options.enabled || n == 1) {
    allreduce_dense(group, grad, divisor);
    st.last_rows = -1;
    return false;
  }
  torch::NoGradGuard no_grad;
  const int64_t rows = grad.size(0);
  const size_t rb = rows ? static_cast<size_t>(grad.numel() / rows) * grad.element_size() : 0;
  auto mine = nonzero_rows(grad);
  const int64_t k = static_cast<int64_t>(mine.size());
  const int64_t total = gather_counts(group, k, rows, st);
  const double wire = static_cast<double>(total) * static_cast<double>(rb + sizeof(int64_t));
  const double dense = static_cast<double>(grad.numel()) * static_cast<double>(grad.element_size());
  if (wire > options.max_wire_ratio * dense) {
    allreduce_dense(group, grad, divisor);
    st.last_rows = -1;
    return false;
  }
  // Each rank's block: k indices (int64), then k rows, padded to 8 bytes so every block's indices
  // stay aligned in the gathered buffer.
  auto block = [&](int64_t kr) {
    return static_cast<size_t>(kr) * sizeof(int64_t) + round8(static_cast<size_t>(kr) * rb);
  };
  const auto* base = static_cast<const uint8_t*>(grad.data_ptr());
  // Never empty: a rank without rows still hands the collective a valid pointer (to 0 bytes), and
  // memcpy from an empty vector's null data() is undefined.
  st.send.assign(std::max<size_t>(block(k), 8), 0);
  if (k > 0) std::memcpy(st.send.data(), mine.data(), mine.size() * sizeof(int64_t));
  for (int64_t i = 0; i < k; ++i)
    std::memcpy(st.send.data() + k * sizeof(int64_t) + i * rb, base + static_cast<size_t>(mine[i]) * rb, rb);
  std::vector<size_t> bytes(static_cast<size_t>(n));
  size_t all = 0;
  for (int r = 0; r < n; ++r) all += bytes[r] = block(st.counts[r]);
  st.recv.resize(std::max<size_t>(all, 8));  // valid even when no rank has a row
  group.allgatherv(st.send.data(), st.recv.data(), bytes, DType::u8);
  divide_rows(grad, sum_blocks(group, grad, st, mine, bytes, rb), divisor);
  st.last_rows = total;
  return true;
}

}  // namespace gz
