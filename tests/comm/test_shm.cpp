// Tests of the shm backend: every op x dtype x world size against a reference computed here,
// plus ordering, mismatch detection, abort, timeouts, sub-groups and point-to-point.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "gz/comm/shm.h"
#include "gz/core/dtype.h"
#include "gz/core/error.h"
#include "support/run_ranks.h"

using namespace gz;
using namespace gz::comm;

namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

const DType kAllTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                           DType::i8,  DType::u8,  DType::i32, DType::i64};
const ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod};

// ---- scalar reference: same semantics as the backend (f16/bf16 accumulate in f32, ints wrap) ----

bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

// Value of element i on rank r as a double that every dtype represents exactly.
double input_value(int r, size_t i, ReduceOp op, DType t) {
  if (op == ReduceOp::prod) {
    static const double f[] = {1, -1, 2, 1, 0.5, -2, 1};
    double v = f[(r * 3 + i * 5) % 7];
    if (!is_float(t) && v == 0.5) v = 1;
    if (t == DType::u8 && v < 0) v = 1;
    return v;
  }
  double v = static_cast<double>(static_cast<int>((r * 7 + i * 3) % 17) - 8);
  if (t == DType::u8) v += 8;
  if (is_float(t)) v *= 0.5;
  return v;
}

void store_value(DType t, void* p, size_t i, double v) {
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

template <typename T>
T wrap_op(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case ReduceOp::prod: return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    case ReduceOp::min: return b < a ? b : a;
    case ReduceOp::max: return a < b ? b : a;
  }
  return a;
}

template <typename A>
A float_op(A a, A b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::min: return b < a ? b : a;
    case ReduceOp::max: return a < b ? b : a;
  }
  return a;
}

template <typename T>
void ref_int(const std::vector<const void*>& in, void* out, size_t count, ReduceOp op) {
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(in[0])[i];
    for (int q = 1; q < n; ++q) acc = wrap_op<T>(acc, static_cast<const T*>(in[q])[i], op);
    if (op == ReduceOp::avg) acc = static_cast<T>(acc / static_cast<T>(n));
    static_cast<T*>(out)[i] = acc;
  }
}

template <typename T, typename A, typename To, typename From>
void ref_float(const std::vector<const void*>& in, void* out, size_t count, ReduceOp op, To to, From from) {
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    A acc = to(static_cast<const T*>(in[0])[i]);
    for (int q = 1; q < n; ++q) acc = float_op<A>(acc, to(static_cast<const T*>(in[q])[i]), op);
    if (op == ReduceOp::avg) acc = acc / static_cast<A>(n);
    static_cast<T*>(out)[i] = from(acc);
  }
}

// out = reduction of in[0..n) in rank order.
void reference(DType t, const std::vector<const void*>& in, void* out, size_t count, ReduceOp op) {
  auto id_f = [](float x) { return x; };
  auto id_d = [](double x) { return x; };
  switch (t) {
    case DType::f32: return ref_float<float, float>(in, out, count, op, id_f, id_f);
    case DType::f64: return ref_float<double, double>(in, out, count, op, id_d, id_d);
    case DType::f16: return ref_float<uint16_t, float>(in, out, count, op, half_to_float, float_to_half);
    case DType::bf16: return ref_float<uint16_t, float>(in, out, count, op, bf16_to_float, float_to_bf16);
    case DType::i8: return ref_int<int8_t>(in, out, count, op);
    case DType::u8: return ref_int<uint8_t>(in, out, count, op);
    case DType::i32: return ref_int<int32_t>(in, out, count, op);
    case DType::i64: return ref_int<int64_t>(in, out, count, op);
  }
}

using Buf = std::vector<uint8_t>;

Buf make_input(DType t, int r, size_t count, ReduceOp op, size_t salt = 0) {
  Buf b(count * dtype_size(t) + 1);  // +1: never a zero-sized buffer (data() may be null)
  for (size_t i = 0; i < count; ++i) store_value(t, b.data(), i, input_value(r, i + salt, op, t));
  return b;
}

void expect_bytes(const void* got, const void* want, size_t bytes, const std::string& what) {
  if (bytes == 0 || std::memcmp(got, want, bytes) == 0) return;
  size_t i = 0;
  while (static_cast<const uint8_t*>(got)[i] == static_cast<const uint8_t*>(want)[i]) ++i;
  GZ_THROW(Error, what, ": first differing byte ", i, " of ", bytes, " (got ",
           int(static_cast<const uint8_t*>(got)[i]), ", want ", int(static_cast<const uint8_t*>(want)[i]), ")");
}

std::string ctx(const char* op, int world, int rank, DType t, size_t count, const char* extra = "") {
  std::ostringstream os;
  os << op << " world " << world << " rank " << rank << " " << dtype_name(t) << " x " << count << " " << extra;
  return os.str();
}

ShmOptions small_chunks(size_t chunk = 512, int timeout_s = 30) {
  ShmOptions o;
  o.chunk_bytes = chunk;
  o.timeout = std::chrono::seconds(timeout_s);
  return o;
}

// Every collective for one (dtype, count) on an existing communicator.
void check_all_ops(Communicator& c, DType t, size_t count) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtype_size(t);
  for (ReduceOp op : kAllOps) {
    std::vector<Buf> ins;
    std::vector<const void*> ptrs;
    for (int q = 0; q < n; ++q) ins.push_back(make_input(t, q, count, op));
    for (auto& b : ins) ptrs.push_back(b.data());
    Buf want(count * es + 1);
    reference(t, ptrs, want.data(), count, op);

    Buf data = ins[r];
    c.allreduce(data.data(), count, t, op);
    expect_bytes(data.data(), want.data(), count * es, ctx("allreduce", n, r, t, count, reduce_op_name(op)));

    const int root = static_cast<int>(count % n);
    data = ins[r];
    c.reduce(data.data(), count, t, op, root);
    if (r == root) expect_bytes(data.data(), want.data(), count * es, ctx("reduce", n, r, t, count, reduce_op_name(op)));

    // reduce_scatter: rank q's send is the concatenation of n blocks of `count`.
    std::vector<Buf> rs_in;
    std::vector<const void*> rs_ptrs;
    for (int q = 0; q < n; ++q) rs_in.push_back(make_input(t, q, count * n, op, 11));
    Buf rs_out(count * es + 1), rs_want(count * es + 1);
    for (int q = 0; q < n; ++q) rs_ptrs.push_back(rs_in[q].data() + r * count * es);
    reference(t, rs_ptrs, rs_want.data(), count, op);
    c.reduce_scatter(rs_in[r].data(), rs_out.data(), count, t, op);
    expect_bytes(rs_out.data(), rs_want.data(), count * es, ctx("reduce_scatter", n, r, t, count, reduce_op_name(op)));
    if (op == ReduceOp::sum) {  // in place: recv inside send at block r
      Buf inplace = rs_in[r];
      c.reduce_scatter(inplace.data(), inplace.data() + r * count * es, count, t, op);
      expect_bytes(inplace.data() + r * count * es, rs_want.data(), count * es, ctx("reduce_scatter in place", n, r, t, count));
    }
  }
  // broadcast from every root
  for (int root = 0; root < n; ++root) {
    Buf want = make_input(t, root, count, ReduceOp::sum, 3);
    Buf data = r == root ? want : Buf(count * es + 1, 0xAB);
    c.broadcast(data.data(), count, t, root);
    expect_bytes(data.data(), want.data(), count * es, ctx("broadcast", n, r, t, count));
  }
  // allgather, out of place and in place
  Buf gather_want(n * count * es + 1);
  for (int q = 0; q < n; ++q) {
    Buf b = make_input(t, q, count, ReduceOp::sum, 5);
    std::memcpy(gather_want.data() + q * count * es, b.data(), count * es);
  }
  Buf mine = make_input(t, r, count, ReduceOp::sum, 5);
  Buf out(n * count * es + 1, 0xCD);
  c.allgather(mine.data(), out.data(), count, t);
  expect_bytes(out.data(), gather_want.data(), n * count * es, ctx("allgather", n, r, t, count));
  Buf inplace(n * count * es + 1, 0xCD);
  std::memcpy(inplace.data() + r * count * es, mine.data(), count * es);
  c.allgather(inplace.data() + r * count * es, inplace.data(), count, t);
  expect_bytes(inplace.data(), gather_want.data(), n * count * es, ctx("allgather in place", n, r, t, count));
  // allgatherv with uneven counts (some zero)
  std::vector<size_t> counts(n);
  size_t total = 0;
  for (int q = 0; q < n; ++q) total += counts[q] = (q % 3 == 1) ? 0 : count + q;
  Buf v_want(total * es + 1);
  size_t off = 0;
  for (int q = 0; q < n; ++q) {
    Buf b = make_input(t, q, counts[q], ReduceOp::sum, 9);
    std::memcpy(v_want.data() + off * es, b.data(), counts[q] * es);
    off += counts[q];
  }
  Buf v_mine = make_input(t, r, counts[r], ReduceOp::sum, 9);
  Buf v_out(total * es + 1, 0xEF);
  c.allgatherv(v_mine.data(), v_out.data(), counts, t);
  expect_bytes(v_out.data(), v_want.data(), total * es, ctx("allgatherv", n, r, t, count));
  c.barrier();
  // point to point around the ring
  if (n > 1) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    Buf s = make_input(t, r, count, ReduceOp::sum, 13);
    Buf want_p = make_input(t, prev, count, ReduceOp::sum, 13);
    Buf got(count * es + 1, 0);
    if (r % 2 == 0) {
      c.send(s.data(), count, t, next, 7);
      c.recv(got.data(), count, t, prev, 7);
    } else {
      c.recv(got.data(), count, t, prev, 7);
      c.send(s.data(), count, t, next, 7);
    }
    expect_bytes(got.data(), want_p.data(), count * es, ctx("send/recv", n, r, t, count));
  }
}

class ShmWorld : public ::testing::TestWithParam<int> {};

TEST_P(ShmWorld, EveryOpEveryDtypeSmallChunks) {
  const int world = GetParam();
  // 512-byte slots: 1031 and 3001 elements take many pipeline chunks; 0, 1, 7 take the latency path.
  std::vector<size_t> counts = {0, 1, 7, 1031, 3001};
  // More ranks than the CI's 2 cores: every pipeline step needs every rank scheduled, so keep the
  // step count down (1031 elements still span many 512-byte chunks for every dtype).
  if (world > 3 || (kSanitized && world > 2)) counts = {0, 1, 7, 1031};
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks());
    EXPECT_EQ(c->backend(), "shm");
    EXPECT_EQ(c->size(), world);
    EXPECT_EQ(c->rank(), rank);
    for (DType t : kAllTypes)
      for (size_t count : counts) check_all_ops(*c, t, count);
  });
}

TEST_P(ShmWorld, DefaultChunksLargeMessages) {
  const int world = GetParam();
  // Larger than one default (256 KiB) slot and not a multiple of anything.
  const size_t count = kSanitized ? 70001 : 200003;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    ShmOptions o;
    o.timeout = std::chrono::seconds(60);
    auto c = create_shm_communicator(rank, world, store, o);
    for (DType t : {DType::f32, DType::bf16, DType::i64}) {
      std::vector<Buf> ins;
      std::vector<const void*> ptrs;
      for (int q = 0; q < world; ++q) ins.push_back(make_input(t, q, count, ReduceOp::sum));
      for (auto& b : ins) ptrs.push_back(b.data());
      Buf want(count * dtype_size(t) + 1);
      reference(t, ptrs, want.data(), count, ReduceOp::sum);
      Buf data = ins[rank];
      c->allreduce(data.data(), count, t, ReduceOp::sum);
      expect_bytes(data.data(), want.data(), count * dtype_size(t), ctx("allreduce", world, rank, t, count));
      Buf b = rank == 0 ? ins[0] : Buf(ins[0].size());
      c->broadcast(b.data(), count, t, 0);
      expect_bytes(b.data(), ins[0].data(), count * dtype_size(t), ctx("broadcast", world, rank, t, count));
    }
  });
}

// alloc_buffer blocks: the all-reduce reads and writes the peers' blocks directly. Sub-ranges at
// odd offsets, every op, several dtypes; bytes outside the range stay as they were.
TEST_P(ShmWorld, AllocBufferAllreduceInPlace) {
  const int world = GetParam();
  const size_t count = kSanitized ? 9001 : 50001;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    std::shared_ptr<void> outlives;  // freed after the communicator: the deleter must cope
    auto c = create_shm_communicator(rank, world, store, small_chunks(4096));
    for (DType t : {DType::f32, DType::bf16, DType::i64}) {
      const size_t es = dtype_size(t);
      const size_t bytes = (count + 40) * es;
      auto mem = c->alloc_buffer(bytes);
      auto* base = static_cast<uint8_t*>(mem.get());
      ASSERT_EQ(reinterpret_cast<uintptr_t>(base) % 64, 0u);
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(base[i], 0) << "alloc_buffer memory is zero-filled";
      for (ReduceOp op : kAllOps)
        for (size_t skip : {size_t(0), size_t(3), size_t(37)}) {
          const size_t n = count - skip;
          std::vector<Buf> ins;
          std::vector<const void*> ptrs;
          for (int q = 0; q < world; ++q) ins.push_back(make_input(t, q, n, op, skip));
          for (auto& b : ins) ptrs.push_back(b.data());
          Buf want(n * es + 1);
          reference(t, ptrs, want.data(), n, op);
          std::memset(base, 0xA5, bytes);
          std::memcpy(base + skip * es, ins[rank].data(), n * es);
          c->barrier();  // peers write into this block: nobody may start before everyone has filled
          c->allreduce(base + skip * es, n, t, op);
          expect_bytes(base + skip * es, want.data(), n * es,
                       ctx("allreduce of alloc_buffer memory", world, rank, t, n, reduce_op_name(op)));
          for (size_t i = 0; i < skip * es; ++i)
            ASSERT_EQ(base[i], 0xA5) << "byte " << i << " before the range";
          for (size_t i = (skip + n) * es; i < bytes; ++i)
            ASSERT_EQ(base[i], 0xA5) << "byte " << i << " after";
          c->barrier();  // and nobody refills before everyone has checked
        }
      outlives = mem;
    }
  });
}

// alloc_buffer blocks, reduce-scatter and all-gather: each rank reads its block of every rank's
// input, and the peers' pieces out of their outputs, directly. Odd offsets, in place and not,
// every op; bytes outside the ranges stay as they were.
TEST_P(ShmWorld, AllocBufferReduceScatterAndAllgather) {
  const int world = GetParam();
  const size_t count = kSanitized ? 3001 : 20001;  // per rank
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(4096));
    for (DType t : {DType::f32, DType::bf16, DType::i64}) {
      const size_t es = dtype_size(t), total = count * world;
      const size_t bytes = (total + 40) * es;
      auto mem = c->alloc_buffer(bytes);
      auto* base = static_cast<uint8_t*>(mem.get());
      for (ReduceOp op : kAllOps)
        for (size_t skip : {size_t(0), size_t(37)}) {
          const size_t n = count - skip;  // per rank
          uint8_t* send = base + skip * es;
          std::vector<Buf> ins;
          std::vector<const void*> ptrs;
          for (int q = 0; q < world; ++q) ins.push_back(make_input(t, q, n * world, op, 11));
          for (int q = 0; q < world; ++q) ptrs.push_back(ins[q].data() + rank * n * es);
          Buf want(n * es + 1);
          reference(t, ptrs, want.data(), n, op);
          std::memset(base, 0xA5, bytes);
          std::memcpy(send, ins[rank].data(), n * world * es);
          Buf out(n * es + 1);
          c->reduce_scatter(send, out.data(), n, t, op);
          expect_bytes(out.data(), want.data(), n * es,
                       ctx("reduce_scatter of alloc_buffer memory", world, rank, t, n, reduce_op_name(op)));
          for (size_t i = 0; i < n * world * es; ++i)
            ASSERT_EQ(send[i], ins[rank][i]) << "the input changed at byte " << i;
          // In place: the result lands in this rank's block of its own input.
          c->reduce_scatter(send, send + rank * n * es, n, t, op);
          expect_bytes(send + rank * n * es, want.data(), n * es,
                       ctx("reduce_scatter in place", world, rank, t, n));
          // All-gather into the block (the next op's input is the gathered output), in place.
          c->allgather(send + rank * n * es, send, n, t);
          for (int q = 0; q < world; ++q) {
            std::vector<const void*> qp;
            for (int k = 0; k < world; ++k) qp.push_back(ins[k].data() + q * n * es);
            Buf wq(n * es + 1);
            reference(t, qp, wq.data(), n, op);
            expect_bytes(send + q * n * es, wq.data(), n * es,
                         ctx("allgather of alloc_buffer memory", world, rank, t, n));
          }
          for (size_t i = 0; i < skip * es; ++i)
            ASSERT_EQ(base[i], 0xA5) << "byte " << i << " before the range";
          for (size_t i = (skip + n * world) * es; i < bytes; ++i)
            ASSERT_EQ(base[i], 0xA5) << "byte " << i << " after";
          // Out of place: from ordinary memory into the block.
          Buf mine = make_input(t, rank, n, ReduceOp::sum, 5);
          c->allgather(mine.data(), send, n, t);
          for (int q = 0; q < world; ++q) {
            Buf b = make_input(t, q, n, ReduceOp::sum, 5);
            expect_bytes(send + q * n * es, b.data(), n * es,
                         ctx("allgather out of place", world, rank, t, n));
          }
          c->barrier();  // nobody refills before everyone has checked
        }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmWorld, ::testing::ValuesIn(test::world_sizes()),
                         [](const ::testing::TestParamInfo<int>& i) { return "n" + std::to_string(i.param); });

TEST(Shm, StreamingStoresForLargeOutputs) {
  // Force the non-temporal copy path (normally >= 16 MiB) on buffers aligned to the element only.
  setenv("GZ_SHM_STREAM_BYTES", "4096", 1);
  const int world = 3;
  const size_t count = 50001;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(8192));
    for (DType t : {DType::f32, DType::u8}) {
      const size_t es = dtype_size(t);
      std::vector<Buf> ins;
      std::vector<const void*> ptrs;
      for (int q = 0; q < world; ++q) ins.push_back(make_input(t, q, count, ReduceOp::sum));
      for (auto& b : ins) ptrs.push_back(b.data());
      Buf want(count * es + 1);
      reference(t, ptrs, want.data(), count, ReduceOp::sum);
      const size_t skew = es == 1 ? 3 : es;  // not 16-byte aligned, yet aligned for the element type
      Buf data(count * es + 8);
      std::memcpy(data.data() + skew, ins[rank].data(), count * es);
      c->allreduce(data.data() + skew, count, t, ReduceOp::sum);
      expect_bytes(data.data() + skew, want.data(), count * es, ctx("allreduce streaming", world, rank, t, count));
      Buf out(world * count * es + 8);
      c->allgather(ins[rank].data(), out.data() + skew, count, t);
      for (int q = 0; q < world; ++q)
        expect_bytes(out.data() + skew + q * count * es, ins[q].data(), count * es,
                     ctx("allgather streaming", world, rank, t, count));
      Buf b = rank == 1 ? ins[1] : Buf(ins[1].size());
      c->broadcast(b.data(), count, t, 1);
      expect_bytes(b.data(), ins[1].data(), count * es, ctx("broadcast streaming", world, rank, t, count));
      // alloc_buffer memory: the result leaves a scratch piece by streaming stores into every block.
      auto mem = c->alloc_buffer(count * es + 64);
      auto* blk = static_cast<uint8_t*>(mem.get());
      std::memcpy(blk + skew, ins[rank].data(), count * es);
      c->barrier();
      c->allreduce(blk + skew, count, t, ReduceOp::sum);
      expect_bytes(blk + skew, want.data(), count * es,
                   ctx("allreduce streaming, alloc_buffer", world, rank, t, count));
      c->barrier();
    }
  });
  unsetenv("GZ_SHM_STREAM_BYTES");
}

TEST(Shm, ManySmallAllreduces) {
  const int iters = kSanitized ? 300 : 2000;
  for (int world : {2, 4}) {
    test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
      auto c = create_shm_communicator(rank, world, store, small_chunks(4096));
      for (int it = 0; it < iters; ++it) {
        const size_t count = 1 + it % 13;
        std::vector<int32_t> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = rank * 1000 + it + static_cast<int>(i);
        c->allreduce(v.data(), count, DType::i32, ReduceOp::sum);
        for (size_t i = 0; i < count; ++i) {
          int32_t want = 1000 * world * (world - 1) / 2 + world * (it + static_cast<int>(i));
          if (v[i] != want) GZ_THROW(Error, "iteration ", it, " element ", i, ": got ", v[i], " want ", want);
        }
      }
    });
  }
}

TEST(Shm, AsyncOpsRunInIssueOrder) {
  const int world = 3;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(1024));
    std::vector<std::vector<float>> bufs(8);
    std::vector<WorkPtr> works;
    for (int k = 0; k < 8; ++k) {
      bufs[k].assign(100 + k * 50, static_cast<float>(rank + k));
      works.push_back(c->allreduce_async(bufs[k].data(), bufs[k].size(), DType::f32, ReduceOp::sum));
    }
    // A synchronous op waits for the async ones issued before it.
    float x = static_cast<float>(rank);
    c->allreduce(&x, 1, DType::f32, ReduceOp::max);
    EXPECT_EQ(x, world - 1);
    for (int k = 0; k < 8; ++k) {
      works[k]->wait();
      const float want = static_cast<float>(world * (world - 1) / 2 + world * k);
      for (float v : bufs[k]) ASSERT_EQ(v, want) << "buffer " << k;
    }
    EXPECT_EQ(c->sequence(), 9u);
  });
}

TEST(Shm, MismatchIsDetectedOnEveryRank) {
  const int world = 3;
  std::atomic<int> caught{0};
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(512, 10));
    std::vector<float> v(200, 1.0f);
    try {
      c->allreduce(v.data(), rank == 1 ? 100 : 200, DType::f32, ReduceOp::sum);
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("collective mismatch at seq 0"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 0 allreduce(f32 x 200, sum) vs rank 1 allreduce(f32 x 100, sum)"), std::string::npos) << m;
      ++caught;
    }
    try {  // kind mismatch
      if (rank == 2) c->broadcast(v.data(), 10, DType::f32, 0);
      else c->allreduce(v.data(), 10, DType::f32, ReduceOp::sum);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("vs rank 2 broadcast(f32 x 10, root 0)"), std::string::npos) << e.what();
      ++caught;
    }
    // The group stays usable after a detected mismatch.
    std::vector<double> d(1000, rank + 1.0);
    c->allreduce(d.data(), d.size(), DType::f64, ReduceOp::sum);
    for (double x : d) ASSERT_EQ(x, 6.0);
  });
  EXPECT_EQ(caught.load(), 2 * world);
}

TEST(Shm, AllocBufferRanksMustPassTheSameRange) {
  const int world = 3;
  std::atomic<int> caught{0};
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(512, 10));
    auto mem = c->alloc_buffer(64 << 10);
    auto* f = static_cast<float*>(mem.get());
    std::vector<float> plain(16384, 1.0f);
    for (int k = 0; k < 2; ++k) {
      try {
        // First rank 1 passes another offset of the block, then rank 2 ordinary memory.
        float* p = k == 0 && rank == 1 ? f + 16 : k == 1 && rank == 2 ? plain.data() : f;
        c->allreduce(p, 8192, DType::f32, ReduceOp::sum);
      } catch (const InvalidArgument& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("rank 0 allreduce(f32 x 8192, sum, alloc_buffer block 0 at byte 0) vs rank " +
                         std::string(k == 0 ? "1 allreduce(f32 x 8192, sum, alloc_buffer block 0 at byte 64)"
                                            : "2 allreduce(f32 x 8192, sum)")),
                  std::string::npos)
            << m;
        ++caught;
      }
    }
    // Still usable, and a second block gets the next number.
    auto mem2 = c->alloc_buffer(64 << 10);
    auto* g = static_cast<float*>(mem2.get());
    for (int i = 0; i < 8192; ++i) g[i] = static_cast<float>(rank + i);
    c->barrier();
    c->allreduce(g, 8192, DType::f32, ReduceOp::sum);
    for (int i = 0; i < 8192; ++i) ASSERT_EQ(g[i], 3.0f + 3.0f * i);
  });
  EXPECT_EQ(caught.load(), 2 * world);
}

TEST(Shm, AllocBufferReduceScatterRanksMustAgree) {
  const int world = 2;
  std::atomic<int> caught{0};
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(512, 10));
    auto mem = c->alloc_buffer(64 << 10);
    auto* f = static_cast<float*>(mem.get());
    std::vector<float> plain(16384, 1.0f), out(8192);
    try {
      c->reduce_scatter(rank == 1 ? plain.data() : f, out.data(), 8192, DType::f32, ReduceOp::sum);
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("rank 0 reduce_scatter(f32 x 8192, sum, alloc_buffer block 0 at byte 0) vs rank 1 "
                       "reduce_scatter(f32 x 8192, sum)"),
                std::string::npos)
          << m;
      ++caught;
    }
  });
  EXPECT_EQ(caught.load(), world);
}

TEST(Shm, AllocBufferFallsBackWhenOneRankCannotShare) {
  const int world = 3;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    ShmOptions o = small_chunks(512, 10);
    o.zero_copy = rank != 1;  // as if rank 1's /dev/shm were full
    auto c = create_shm_communicator(rank, world, store, o);
    auto mem = c->alloc_buffer(64 << 10);
    // Ordinary memory everywhere now: different offsets on different ranks are fine.
    auto* f = static_cast<float*>(mem.get()) + rank * 16;
    for (int i = 0; i < 8192; ++i) f[i] = static_cast<float>(rank);
    c->allreduce(f, 8192, DType::f32, ReduceOp::sum);
    for (int i = 0; i < 8192; ++i) ASSERT_EQ(f[i], 3.0f);
  });
}

TEST(Shm, AbortWakesBlockedPeers) {
  const int world = 3;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    ShmOptions o = small_chunks(512, 30);
    o.spin_us = 10;
    auto c = create_shm_communicator(rank, world, store, o);
    c->barrier();
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      c->abort("test abort");
      EXPECT_THROW(c->barrier(), Aborted);
      return;
    }
    Stopwatch sw;
    std::vector<float> v(5000, 1.0f);
    try {
      c->allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
      ADD_FAILURE() << "allreduce should have been aborted";
    } catch (const Aborted& e) {
      EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("aborted by rank 0"), std::string::npos) << e.what();
    }
    EXPECT_LT(sw.seconds(), 5.0);
    EXPECT_THROW(c->barrier(), Aborted);
  });
}

TEST(Shm, TimeoutNamesTheMissingRank) {
  const int world = 3;
  std::atomic<int> done{0};
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    ShmOptions o = small_chunks(512, 1);
    auto c = create_shm_communicator(rank, world, store, o);
    if (rank == 2) {  // never calls, but keeps its communicator open (closing it is a PeerError)
      while (done.load() < world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    struct Done {
      std::atomic<int>& n;
      ~Done() { ++n; }
    } mark_done{done};
    Stopwatch sw;
    float x = 1;
    try {
      c->allreduce(&x, 1, DType::f32, ReduceOp::sum);
      ADD_FAILURE() << "expected a timeout";
    } catch (const TimeoutError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("rank(s) 2 "), std::string::npos) << m;
      EXPECT_NE(m.find("allreduce"), std::string::npos) << m;
      EXPECT_NE(m.find("allreduce #0 on rank"), std::string::npos) << m;
      EXPECT_EQ(e.peer(), 2) << "the one rank missing";
    }
    EXPECT_GE(sw.seconds(), 0.9);
    EXPECT_LT(sw.seconds(), 3.0);
    // The communicator is unusable afterwards: later ops fail at once instead of desynchronising.
    EXPECT_THROW(c->barrier(), TimeoutError);
  });
}

// A rank that closes its communicator will never take part again: the others fail at once with
// gz::PeerError saying so, instead of waiting out the timeout.
TEST(Shm, ClosedCommunicatorIsAPeerErrorOnTheOthers) {
  const int world = 3;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(512, 20));
    if (rank == 2) return;
    Stopwatch sw;
    float x = 1;
    try {
      c->allreduce(&x, 1, DType::f32, ReduceOp::sum);
      ADD_FAILURE() << "expected a PeerError";
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("peer rank 2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("closed its communicator"), std::string::npos) << e.what();
    }
    EXPECT_LT(sw.seconds(), 5.0);
  });
}

TEST(Shm, SubGroups) {
  const int world = 4;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(1024));
    auto odd = c->new_group({1, 3});
    auto first3 = c->new_group({0, 1, 2});
    EXPECT_EQ(odd == nullptr, rank % 2 == 0);
    EXPECT_EQ(first3 == nullptr, rank == 3);
    std::vector<int64_t> v(777, rank);
    if (odd) {
      EXPECT_EQ(odd->size(), 2);
      EXPECT_EQ(odd->rank(), rank / 2);
      odd->allreduce(v.data(), v.size(), DType::i64, ReduceOp::sum);
      for (auto x : v) ASSERT_EQ(x, 4);
    }
    if (first3) {
      std::vector<int64_t> w(3001, rank);
      first3->allreduce(w.data(), w.size(), DType::i64, ReduceOp::max);
      for (auto x : w) ASSERT_EQ(x, 2);
      auto nested = first3->new_group({0, 2});  // ranks 0 and 2 of first3
      if (rank == 0 || rank == 2) {
        ASSERT_NE(nested, nullptr);
        int64_t y = rank;
        nested->allreduce(&y, 1, DType::i64, ReduceOp::sum);
        EXPECT_EQ(y, 2);
      } else {
        EXPECT_EQ(nested, nullptr);
      }
    }
    c->barrier();  // the parent still works
    EXPECT_THROW(c->new_group({2, 1}), InvalidArgument);
  });
}

TEST(Shm, PointToPointMultiChunkAndMismatch) {
  const int world = 2;
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = create_shm_communicator(rank, world, store, small_chunks(256, 5));
    // Many messages in a row, larger than the channel: the sender must wait for the receiver.
    for (int k = 0; k < 20; ++k) {
      std::vector<int32_t> v(1000 + k);
      if (rank == 0) {
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 3 + k);
        c->send(v.data(), v.size(), DType::i32, 1, k);
      } else {
        c->recv(v.data(), v.size(), DType::i32, 0, k);
        for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<int32_t>(i * 3 + k));
      }
    }
    int32_t x = 5;
    if (rank == 0) {
      c->send(&x, 1, DType::i32, 1, 1);
    } else {
      try {
        c->recv(&x, 1, DType::i32, 0, 2);
        ADD_FAILURE() << "tag mismatch not detected";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("message mismatch"), std::string::npos) << e.what();
      }
    }
  });
}

TEST(Shm, BadArguments) {
  auto store = std::make_shared<MemStore>();
  EXPECT_THROW(create_shm_communicator(2, 2, store), InvalidArgument);
  EXPECT_THROW(create_shm_communicator(0, 0, store), InvalidArgument);
  EXPECT_THROW(create_shm_communicator(0, 1, nullptr), InvalidArgument);
  auto c = create_shm_communicator(0, 1, store);
  EXPECT_THROW(c->allreduce(nullptr, 3, DType::f32, ReduceOp::sum), InvalidArgument);
  EXPECT_THROW(c->new_group({1}), InvalidArgument);
  float x = 2;
  c->allreduce(&x, 1, DType::f32, ReduceOp::avg);
  EXPECT_EQ(x, 2);
}

}  // namespace
