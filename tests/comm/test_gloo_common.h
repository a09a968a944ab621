// Reference checks of every collective x dtype x reduce op, shared by the gloo, hierarchical,
// factory and MPI tests. Inputs are small integers, so every backend's result is exact (or within
// one 16-bit rounding) whatever its reduction order, and the reference is computed here in double.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/core/dtype.h"

namespace gz::test {

using comm::Communicator;
using comm::ReduceOp;

inline std::vector<DType> all_dtypes() {
  return {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i8, DType::u8, DType::i32, DType::i64};
}
inline std::vector<ReduceOp> all_reduce_ops() {
  return {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod};
}
inline bool is_float(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

inline void store_as(DType t, void* p, size_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}

inline double load_as(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::i8: return static_cast<const int8_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<const int64_t*>(p)[i];
  }
  return 0;
}

/// Input of `rank` at index i: small integers that never overflow any dtype when reduced over
/// up to 8 ranks (prod uses {-1, 1, 2} on at most 6 ranks; unsigned types get no negatives).
inline double input_value(int rank, size_t i, DType t, ReduceOp op, int salt = 0) {
  double v;
  if (op == ReduceOp::prod) {
    int k = static_cast<int>((rank + i + salt) % 3);
    v = rank >= 6 ? 1 : (k == 0 ? 2 : (k == 1 ? 1 : -1));
  } else {
    v = static_cast<double>(static_cast<int>((rank * 7 + i * 3 + salt) % 7) - 3);
  }
  if (t == DType::u8) v = std::fabs(v);
  return v;
}

/// Reference reduction over ranks [0, world) at index i, rounded like the backends round.
inline double reference_value(int world, size_t i, DType t, ReduceOp op, int salt = 0) {
  double acc = input_value(0, i, t, op, salt);
  for (int r = 1; r < world; ++r) {
    double v = input_value(r, i, t, op, salt);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += v; break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::avg) {
    if (is_float(t)) {
      // Backends divide in the element type (f32 for 16-bit types): round the same way.
      if (t == DType::f64) return acc / world;
      float q = static_cast<float>(acc) / static_cast<float>(world);
      if (t == DType::f16) return half_to_float(float_to_half(q));
      if (t == DType::bf16) return bf16_to_float(float_to_bf16(q));
      return q;
    }
    return std::trunc(acc / world);
  }
  return acc;
}

inline std::string what(const char* op, DType t, size_t count, const std::string& extra = "") {
  return std::string(op) + " dtype=" + dtype_name(t) + " count=" + std::to_string(count) + extra;
}

#define GZ_EXPECT_VALUE(got, want, t, ctx)                                              \
  do {                                                                                  \
    double g_ = (got), w_ = (want);                                                     \
    double tol_ = (t == DType::f16 || t == DType::bf16) ? 1e-2 * std::max(1.0, std::fabs(w_)) \
                  : is_float(t) ? 1e-6 * std::max(1.0, std::fabs(w_)) : 0.0;           \
    if (!(std::fabs(g_ - w_) <= tol_)) {                                                \
      ADD_FAILURE() << ctx << ": got " << g_ << " want " << w_;                         \
      return;                                                                           \
    }                                                                                   \
  } while (0)

inline void check_allreduce(Communicator& c, DType t, ReduceOp op, size_t count) {
  const size_t es = dtype_size(t);
  std::vector<uint8_t> buf(count * es + 1);
  for (size_t i = 0; i < count; ++i) store_as(t, buf.data(), i, input_value(c.rank(), i, t, op));
  c.allreduce(count ? buf.data() : nullptr, count, t, op);
  auto ctx = what("allreduce", t, count, std::string(" op=") + comm::reduce_op_name(op) +
                                             " rank=" + std::to_string(c.rank()));
  for (size_t i = 0; i < count; ++i)
    GZ_EXPECT_VALUE(load_as(t, buf.data(), i), reference_value(c.size(), i, t, op), t, ctx << " i=" << i);
}

inline void check_broadcast(Communicator& c, DType t, size_t count, int root) {
  const size_t es = dtype_size(t);
  std::vector<uint8_t> buf(count * es + 1, 0);
  for (size_t i = 0; i < count; ++i)
    store_as(t, buf.data(), i, input_value(c.rank() == root ? root : 100, i, t, ReduceOp::sum));
  c.broadcast(count ? buf.data() : nullptr, count, t, root);
  auto ctx = what("broadcast", t, count, " root=" + std::to_string(root) + " rank=" + std::to_string(c.rank()));
  for (size_t i = 0; i < count; ++i)
    GZ_EXPECT_VALUE(load_as(t, buf.data(), i), input_value(root, i, t, ReduceOp::sum), t, ctx << " i=" << i);
}

inline void check_allgatherv(Communicator& c, DType t, const std::vector<size_t>& counts, bool in_place) {
  const size_t es = dtype_size(t);
  size_t total = 0, offset = 0;
  for (int r = 0; r < c.size(); ++r) {
    if (r < c.rank()) offset += counts[r];
    total += counts[r];
  }
  std::vector<uint8_t> recv(total * es + 1, 0xEE), send(counts[c.rank()] * es + 1);
  uint8_t* sp = send.data();
  if (in_place) sp = recv.data() + offset * es;
  for (size_t i = 0; i < counts[c.rank()]; ++i) store_as(t, sp, i, input_value(c.rank(), i, t, ReduceOp::sum, 1));
  bool equal = true;
  for (size_t n : counts) equal = equal && n == counts[0];
  if (equal)
    c.allgather(sp, recv.data(), counts[0], t);
  else
    c.allgatherv(sp, recv.data(), counts, t);
  auto ctx = what(equal ? "allgather" : "allgatherv", t, counts[c.rank()],
                  std::string(in_place ? " in-place" : "") + " rank=" + std::to_string(c.rank()));
  size_t k = 0;
  for (int r = 0; r < c.size(); ++r)
    for (size_t i = 0; i < counts[r]; ++i, ++k)
      GZ_EXPECT_VALUE(load_as(t, recv.data(), k), input_value(r, i, t, ReduceOp::sum, 1), t,
                      ctx << " from rank " << r << " i=" << i);
}

inline void check_reduce_scatter(Communicator& c, DType t, ReduceOp op, size_t recv_count) {
  const size_t es = dtype_size(t);
  const size_t n = recv_count * c.size();
  std::vector<uint8_t> send(n * es + 1), recv(recv_count * es + 1);
  for (size_t i = 0; i < n; ++i) store_as(t, send.data(), i, input_value(c.rank(), i, t, op));
  c.reduce_scatter(send.data(), recv.data(), recv_count, t, op);
  auto ctx = what("reduce_scatter", t, recv_count, std::string(" op=") + comm::reduce_op_name(op) +
                                                        " rank=" + std::to_string(c.rank()));
  for (size_t i = 0; i < recv_count; ++i)
    GZ_EXPECT_VALUE(load_as(t, recv.data(), i),
                    reference_value(c.size(), c.rank() * recv_count + i, t, op), t, ctx << " i=" << i);
}

inline void check_reduce(Communicator& c, DType t, ReduceOp op, size_t count, int root) {
  const size_t es = dtype_size(t);
  std::vector<uint8_t> buf(count * es + 1);
  for (size_t i = 0; i < count; ++i) store_as(t, buf.data(), i, input_value(c.rank(), i, t, op, 2));
  c.reduce(buf.data(), count, t, op, root);
  if (c.rank() != root) return;
  auto ctx = what("reduce", t, count, std::string(" op=") + comm::reduce_op_name(op) + " root=" + std::to_string(root));
  for (size_t i = 0; i < count; ++i)
    GZ_EXPECT_VALUE(load_as(t, buf.data(), i), reference_value(c.size(), i, t, op, 2), t, ctx << " i=" << i);
}

/// Pairwise exchange (0<->1, 2<->3, ...), two tags in order, plus an empty message.
inline void check_send_recv(Communicator& c, DType t, size_t count) {
  int peer = c.rank() ^ 1;
  if (peer >= c.size()) return;
  const size_t es = dtype_size(t);
  std::vector<uint8_t> a(count * es + 1), b(count * es + 1), in1(count * es + 1), in2(count * es + 1);
  for (size_t i = 0; i < count; ++i) {
    store_as(t, a.data(), i, input_value(c.rank(), i, t, ReduceOp::sum, 3));
    store_as(t, b.data(), i, input_value(c.rank(), i, t, ReduceOp::sum, 4));
  }
  uint8_t dummy = 0;
  auto sends = [&] {
    c.send(a.data(), count, t, peer, 3);
    c.send(b.data(), count, t, peer, 4);
    c.send(&dummy, 0, t, peer, 9);
  };
  auto recvs = [&] {
    c.recv(in1.data(), count, t, peer, 3);
    c.recv(in2.data(), count, t, peer, 4);
    c.recv(&dummy, 0, t, peer, 9);
  };
  if (c.rank() < peer) {
    sends();
    recvs();
  } else {
    recvs();
    sends();
  }
  auto ctx = what("send/recv", t, count, " rank=" + std::to_string(c.rank()));
  for (size_t i = 0; i < count; ++i) {
    GZ_EXPECT_VALUE(load_as(t, in1.data(), i), input_value(peer, i, t, ReduceOp::sum, 3), t, ctx << " tag 3 i=" << i);
    GZ_EXPECT_VALUE(load_as(t, in2.data(), i), input_value(peer, i, t, ReduceOp::sum, 4), t, ctx << " tag 4 i=" << i);
  }
}

/// Every op x dtype on one communicator. `full` adds the slower combinations.
inline void check_all_collectives(Communicator& c, bool full = true, bool p2p = true) {
  const int n = c.size();
  std::vector<size_t> counts = {0, 1, 2, 13, 1031};
  for (DType t : all_dtypes())
    for (ReduceOp op : all_reduce_ops())
      for (size_t count : counts) check_allreduce(c, t, op, count);
  // Large: multi-segment paths of the ring (and of the shm chunks under hierarchical).
  check_allreduce(c, DType::f32, ReduceOp::sum, full ? 262147 : 65537);
  check_allreduce(c, DType::bf16, ReduceOp::avg, 65537);
  for (DType t : all_dtypes()) {
    for (int root = 0; root < n; root += (full ? 1 : std::max(1, n - 1))) check_broadcast(c, t, 13, root);
    check_broadcast(c, t, 0, 0);
    check_broadcast(c, t, 1031, n - 1);
    for (size_t k : {size_t{0}, size_t{1}, size_t{17}}) {
      check_allgatherv(c, t, std::vector<size_t>(n, k), false);
      check_allgatherv(c, t, std::vector<size_t>(n, k), true);
    }
    std::vector<size_t> v(n);
    for (int r = 0; r < n; ++r) v[r] = (r % 3 == 1) ? 0 : static_cast<size_t>(r * 5 + 2);
    check_allgatherv(c, t, v, false);
    check_allgatherv(c, t, v, true);
    for (ReduceOp op : all_reduce_ops()) {
      check_reduce_scatter(c, t, op, 7);
      check_reduce(c, t, op, 13, n - 1);
    }
    check_reduce_scatter(c, t, ReduceOp::sum, 0);
    check_reduce_scatter(c, t, ReduceOp::sum, 1);
    check_reduce(c, t, ReduceOp::sum, 0, 0);
    check_reduce(c, t, ReduceOp::max, 1031, 0);
    if (p2p) {
      check_send_recv(c, t, 1);
      check_send_recv(c, t, 1031);
    }
  }
  c.barrier();
  c.barrier();
}

}  // namespace gz::test
