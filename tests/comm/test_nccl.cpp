// NCCL backend. Host-only parts (device choice, p2p header, tag mailbox, "no GPU" error) run
// everywhere; the rest runs N ranks as threads, one CUDA device each, and skips with a message
// when fewer devices are visible (this test binary is built wherever CUDA + NCCL are installed,
// GPU or not).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_support.h"
#include "gz/comm/nccl.h"
#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "support/run_ranks.h"

namespace gz::comm {
namespace {

using nccl_detail::choose_cuda_device;
using std::chrono::milliseconds;

Env env_of(std::map<std::string, std::string> vars) { return Env(std::move(vars)); }

// ---------------------------------------------------------------------------------------------
// Host-only
// ---------------------------------------------------------------------------------------------

TEST(NcclDeviceChoice, ExplicitLocalRankAndFallbacks) {
  Env none;
  EXPECT_EQ(choose_cuda_device(3, none, 0, 8), 3);
  EXPECT_EQ(choose_cuda_device(-1, env_of({{"LOCAL_RANK", "5"}}), 13, 8), 5);
  EXPECT_EQ(choose_cuda_device(-1, env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}), 9, 4), 2);
  EXPECT_EQ(choose_cuda_device(-1, env_of({{"LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}), 0, 4), 1);
  EXPECT_EQ(choose_cuda_device(-1, none, 6, 4), 2);  // rank % count
  // One visible device (CUDA_VISIBLE_DEVICES per rank): always device 0, whatever LOCAL_RANK says.
  EXPECT_EQ(choose_cuda_device(-1, env_of({{"LOCAL_RANK", "3"}}), 3, 1), 0);
}

TEST(NcclDeviceChoice, ClearErrors) {
  try {
    choose_cuda_device(-1, env_of({{"LOCAL_RANK", "4"}}), 4, 2);
    FAIL() << "LOCAL_RANK beyond the device count accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("LOCAL_RANK=4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(choose_cuda_device(2, Env(), 0, 2), InvalidArgument);
  try {
    choose_cuda_device(-1, Env(), 0, 0);
    FAIL() << "zero devices accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(choose_cuda_device(-1, env_of({{"LOCAL_RANK", "x"}}), 0, 2), InvalidArgument);
}

TEST(NcclP2pHeader, ChecksMagicAndSequence) {
  auto h = nccl_detail::make_p2p_header(7, 4096, 3);
  EXPECT_EQ(h.tag, 7);
  EXPECT_EQ(h.bytes, 4096u);
  EXPECT_NO_THROW(nccl_detail::check_p2p_header(h, 3, 1, 0));
  try {
    nccl_detail::check_p2p_header(h, 4, 1, 0);
    FAIL();
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("expected message #4 from rank 1"), std::string::npos) << e.what();
  }
  nccl_detail::P2pHeader junk;
  junk.magic = 0x3f800000;  // 1.0f: a payload read as a header
  EXPECT_THROW(nccl_detail::check_p2p_header(junk, 0, 1, 0), PeerError);
}

TEST(NcclTagMailbox, FifoPerTag) {
  nccl_detail::TagMailbox<std::string> box;
  EXPECT_FALSE(box.take(1));
  box.put(1, 10, "a");
  box.put(2, 20, "b");
  box.put(1, 30, "c");
  EXPECT_EQ(box.count(), 3u);
  EXPECT_EQ(box.bytes(), 60u);
  EXPECT_EQ(box.describe(), "tag 1 x2 (40 bytes), tag 2 x1 (20 bytes)");
  auto m = box.take(1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first, 10u);
  EXPECT_EQ(m->second, "a");
  EXPECT_EQ(box.take(1)->second, "c");
  EXPECT_FALSE(box.take(1));
  EXPECT_EQ(box.take(2)->second, "b");
  EXPECT_EQ(box.count(), 0u);
  EXPECT_EQ(box.describe(), "none");
}

// ---------------------------------------------------------------------------------------------
// GPU helpers
// ---------------------------------------------------------------------------------------------

std::string cuda_status_;

int visible_gpus() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_status_ = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return 0;
  }
  cuda_status_ = std::to_string(n) + " device(s)";
  return n;
}

#define GZ_REQUIRE_GPUS(n)                                                                            \
  do {                                                                                                \
    const int have_ = visible_gpus();                                                                 \
    if (have_ < (n))                                                                                  \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), " << have_ << " visible (cudaGetDeviceCount: " \
                   << cuda_status_ << ")";                                                            \
  } while (0)

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Device memory of the calling thread's current device, filled from / read into host vectors.
template <typename T>
class DevVec {
 public:
  explicit DevVec(size_t n) : n_(n) {
    ck(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    ck(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)), "cudaMemset");
  }
  explicit DevVec(const std::vector<T>& h) : DevVec(h.size()) { upload(h); }
  ~DevVec() { cudaFree(p_); }
  DevVec(const DevVec&) = delete;
  void upload(const std::vector<T>& h) {
    ck(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    ck(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
  T* get() { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_;
};

/// Rank r's communicator on device r (threads of one process, one GPU each).
CommPtr make_comm(int rank, int world, std::shared_ptr<Store> store, milliseconds timeout = milliseconds(60000)) {
  ck(cudaSetDevice(rank), "cudaSetDevice");
  NcclOptions o;
  o.timeout = timeout;
  o.device = rank;
  return create_nccl_communicator(rank, world, std::move(store), o);
}

// Small values so sums and products are exact in every dtype up to 7 ranks.
int value(int rank, size_t i) { return 1 + static_cast<int>((rank + i) % 3); }

template <typename T>
std::vector<T> input(int rank, size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value(rank, i));
  return v;
}

template <typename T>
T reference(ReduceOp op, int world, size_t i) {
  double acc = value(0, i);
  for (int r = 1; r < world; ++r) {
    const double x = value(r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += x; break;
      case ReduceOp::prod: acc *= x; break;
      case ReduceOp::min: acc = std::min(acc, x); break;
      case ReduceOp::max: acc = std::max(acc, x); break;
    }
  }
  if (op == ReduceOp::avg) {
    if (std::is_integral<T>::value) return static_cast<T>(static_cast<long long>(acc) / world);
    return static_cast<T>(acc / world);
  }
  return static_cast<T>(acc);
}

template <typename T>
void expect_near_vec(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::is_floating_point<T>::value)
      ASSERT_NEAR(static_cast<double>(got[i]), static_cast<double>(want[i]), 1e-5) << what << " at " << i;
    else
      ASSERT_EQ(got[i], want[i]) << what << " at " << i;
  }
}

template <typename T>
void check_allreduce(Communicator& c, DType dt, size_t n) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
    DevVec<T> d(input<T>(c.rank(), n));
    c.allreduce(d.get(), n, dt, op);
    std::vector<T> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = reference<T>(op, c.size(), i);
    expect_near_vec(d.download(), want, std::string("allreduce ") + reduce_op_name(op) + " " + dtype_name(dt));
  }
}

// ---------------------------------------------------------------------------------------------
// Every op against a reference, over world sizes
// ---------------------------------------------------------------------------------------------

class NcclWorld : public ::testing::TestWithParam<int> {};

TEST_P(NcclWorld, EveryOpMatchesReference) {
  const int world = GetParam();
  GZ_REQUIRE_GPUS(world);
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, world, store);
    EXPECT_EQ(c->backend(), "nccl");
    EXPECT_EQ(nccl_device(*c), rank);
    const size_t n = 1000;  // not a multiple of anything NCCL likes
    check_allreduce<float>(*c, DType::f32, n);
    check_allreduce<double>(*c, DType::f64, n);
    check_allreduce<int32_t>(*c, DType::i32, n);
    check_allreduce<int64_t>(*c, DType::i64, n);
    check_allreduce<uint8_t>(*c, DType::u8, 17);

    {  // broadcast from the last rank
      const int root = world - 1;
      DevVec<int64_t> d(input<int64_t>(rank, n));
      c->broadcast(d.get(), n, DType::i64, root);
      expect_near_vec(d.download(), input<int64_t>(root, n), "broadcast");
    }
    std::vector<double> gathered;
    for (int r = 0; r < world; ++r)
      for (double x : input<double>(r, n)) gathered.push_back(x);
    {  // allgather, out of place and in place
      DevVec<double> s(input<double>(rank, n));
      DevVec<double> r(n * world);
      c->allgather(s.get(), r.get(), n, DType::f64);
      expect_near_vec(r.download(), gathered, "allgather");
      std::vector<double> mine(n * world, -1.0);
      std::copy_n(input<double>(rank, n).begin(), n, mine.begin() + rank * n);
      DevVec<double> inplace(mine);
      c->allgather(inplace.get() + rank * n, inplace.get(), n, DType::f64);
      expect_near_vec(inplace.download(), gathered, "allgather in place");
    }
    {  // allgatherv with uneven counts, zero included
      std::vector<size_t> counts(world);
      std::vector<float> want;
      for (int r = 0; r < world; ++r) {
        counts[r] = static_cast<size_t>(r % 3) * 5;
        for (float x : input<float>(r, counts[r])) want.push_back(x);
      }
      DevVec<float> s(input<float>(rank, counts[rank]));
      DevVec<float> r(want.size());
      c->allgatherv(s.get(), r.get(), counts, DType::f32);
      expect_near_vec(r.download(), want, "allgatherv");
    }
    {  // reduce_scatter: block b of the sum goes to rank b
      DevVec<float> s(input<float>(rank, n * world));
      DevVec<float> r(n);
      c->reduce_scatter(s.get(), r.get(), n, DType::f32, ReduceOp::sum);
      std::vector<float> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = reference<float>(ReduceOp::sum, world, rank * n + i);
      expect_near_vec(r.download(), want, "reduce_scatter");
    }
    {  // reduce to rank 0
      DevVec<int32_t> d(input<int32_t>(rank, n));
      c->reduce(d.get(), n, DType::i32, ReduceOp::max, 0);
      if (rank == 0) {
        std::vector<int32_t> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = reference<int32_t>(ReduceOp::max, world, i);
        expect_near_vec(d.download(), want, "reduce");
      }
    }
    c->barrier();
    {  // async ops in order, then a sync op after them
      DevVec<float> a(input<float>(rank, n)), b(input<float>(rank, n));
      auto wa = c->allreduce_async(a.get(), n, DType::f32, ReduceOp::sum);
      auto wb = c->allreduce_async(b.get(), n, DType::f32, ReduceOp::max);
      wb->wait();
      wa->wait();
      std::vector<float> sum(n), mx(n);
      for (size_t i = 0; i < n; ++i) {
        sum[i] = reference<float>(ReduceOp::sum, world, i);
        mx[i] = reference<float>(ReduceOp::max, world, i);
      }
      expect_near_vec(a.download(), sum, "allreduce_async sum");
      expect_near_vec(b.download(), mx, "allreduce_async max");
    }
    c->barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, NcclWorld, ::testing::ValuesIn(test::world_sizes()),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(Nccl, SendRecvMatchesByTag) {
  GZ_REQUIRE_GPUS(2);
  test::run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, 2, store);
    auto fill = [](int tag, size_t n) {
      std::vector<int32_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = tag * 1000 + static_cast<int32_t>(i);
      return v;
    };
    if (rank == 0) {
      DevVec<int32_t> t1a(fill(1, 3)), t2(fill(2, 5)), t1b(fill(11, 2)), none(0);
      c->send(t1a.get(), 3, DType::i32, 1, 1);
      c->send(t2.get(), 5, DType::i32, 1, 2);
      c->send(t1b.get(), 2, DType::i32, 1, 1);
      c->send(none.get(), 0, DType::i32, 1, 3);
      DevVec<int32_t> back(4);
      c->recv(back.get(), 4, DType::i32, 1, 0);
      expect_near_vec(back.download(), fill(7, 4), "reply");
    } else {
      // Out of order: tag 2 first, then the zero-length tag 3, then both tag-1 messages in order.
      DevVec<int32_t> r2(5), r3(0), r1a(3), r1b(2);
      c->recv(r2.get(), 5, DType::i32, 0, 2);
      c->recv(r3.get(), 0, DType::i32, 0, 3);
      c->recv(r1a.get(), 3, DType::i32, 0, 1);
      c->recv(r1b.get(), 2, DType::i32, 0, 1);
      expect_near_vec(r2.download(), fill(2, 5), "tag 2");
      expect_near_vec(r1a.download(), fill(1, 3), "first tag 1");
      expect_near_vec(r1b.download(), fill(11, 2), "second tag 1");
      DevVec<int32_t> reply(fill(7, 4));
      c->send(reply.get(), 4, DType::i32, 0, 0);
    }
    c->barrier();
  });
}

TEST(Nccl, SendRecvSizeMismatchIsAPeerErrorAndKeepsThePairInStep) {
  GZ_REQUIRE_GPUS(2);
  test::run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, 2, store);
    DevVec<int32_t> buf(std::vector<int32_t>{1, 2, 3, 4});
    if (rank == 0) {
      c->send(buf.get(), 4, DType::i32, 1, 5);
      c->send(buf.get(), 2, DType::i32, 1, 6);
    } else {
      try {
        c->recv(buf.get(), 3, DType::i32, 0, 5);
        ADD_FAILURE() << "a 4-element send matched a 3-element recv";
      } catch (const PeerError& e) {
        EXPECT_NE(std::string(e.what()).find("sent 16 bytes with tag 5"), std::string::npos) << e.what();
      }
      DevVec<int32_t> two(2);
      c->recv(two.get(), 2, DType::i32, 0, 6);
      expect_near_vec(two.download(), std::vector<int32_t>{1, 2}, "after the mismatch");
    }
    c->barrier();
  });
}

TEST(Nccl, OrderedAfterTheCallersStreamAndDeviceRestored) {
  GZ_REQUIRE_GPUS(2);
  test::run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, 2, store);
    cudaStream_t s;
    ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    set_nccl_stream(*c, s);
    const size_t n = size_t(16) << 20;  // 64 MiB: the copy is still running when the op is issued
    std::vector<float> h(n, static_cast<float>(rank + 1));
    float* pinned = nullptr;
    ck(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)), "cudaMallocHost");
    std::copy(h.begin(), h.end(), pinned);
    DevVec<float> d(n);
    ck(cudaMemcpyAsync(d.get(), pinned, n * sizeof(float), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    c->allreduce(d.get(), n, DType::f32, ReduceOp::sum);
    // The caller's stream is ordered after the op: a copy back on it sees the result.
    ck(cudaMemcpyAsync(pinned, d.get(), n * sizeof(float), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync back");
    ck(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(pinned[i], 3.0f) << i;
    int cur = -1;
    ck(cudaGetDevice(&cur), "cudaGetDevice");
    EXPECT_EQ(cur, rank);  // the op's DeviceGuard restored this thread's device
    set_nccl_stream(*c, nullptr);
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
  });
}

TEST(Nccl, NewGroupOfEvenRanks) {
  GZ_REQUIRE_GPUS(3);
  const int world = std::min(visible_gpus(), 4);
  test::run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, world, store);
    std::vector<int> evens;
    for (int r = 0; r < world; r += 2) evens.push_back(r);
    auto g = c->new_group(evens);
    if (rank % 2) {
      EXPECT_EQ(g, nullptr);
    } else {
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->rank(), rank / 2);
      DevVec<int32_t> d(std::vector<int32_t>{rank});
      g->allreduce(d.get(), 1, DType::i32, ReduceOp::sum);
      int32_t want = 0;
      for (int r : evens) want += r;
      EXPECT_EQ(d.download()[0], want);
    }
    c->barrier();
  });
}

// ---------------------------------------------------------------------------------------------
// Failures: abort, timeouts, missing ranks
// ---------------------------------------------------------------------------------------------

TEST(Nccl, AbortDuringABlockedOpReturnsWithinOneSecond) {
  GZ_REQUIRE_GPUS(2);
  test::run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, 2, store, milliseconds(rank == 0 ? 60000 : 5000));
    c->barrier();  // connected
    if (rank == 1) {
      // Stays out of the next all-reduce; leaves after rank 0 has checked everything.
      store->get("rank0_done", Deadline::after(milliseconds(60000)));
      return;
    }
    DevVec<float> d(std::vector<float>(1024, 1.0f));
    std::atomic<int64_t> abort_at_ns{0};
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(300));
      abort_at_ns = std::chrono::steady_clock::now().time_since_epoch().count();
      c->abort("test: abort during a blocked all-reduce");
    });
    try {
      c->allreduce(d.get(), 1024, DType::f32, ReduceOp::sum);
      ADD_FAILURE() << "an all-reduce without its peer completed";
    } catch (const Aborted& e) {
      const auto returned = std::chrono::steady_clock::now().time_since_epoch().count();
      EXPECT_LT(returned - abort_at_ns.load(), int64_t(1000000000)) << "returned more than 1 s after abort()";
      EXPECT_NE(std::string(e.what()).find("test: abort during"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    }
    aborter.join();
    EXPECT_THROW(c->barrier(), Aborted);
    EXPECT_THROW(c->allreduce_async(d.get(), 1, DType::f32, ReduceOp::sum), Aborted);
    store->set("rank0_done", to_bytes("1"));
  });
}

TEST(Nccl, AbortFailsAQueuedAsyncOp) {
  GZ_REQUIRE_GPUS(2);
  test::run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, 2, store, milliseconds(rank == 0 ? 60000 : 5000));
    c->barrier();
    if (rank == 1) {
      store->get("rank0_done", Deadline::after(milliseconds(60000)));
      return;
    }
    DevVec<float> d(16);
    auto w = c->allreduce_async(d.get(), 16, DType::f32, ReduceOp::sum);
    std::this_thread::sleep_for(milliseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    c->abort("test: abort an async op");
    EXPECT_THROW(w->wait(Deadline::after(milliseconds(5000))), Aborted);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
    store->set("rank0_done", to_bytes("1"));
  });
}

TEST(Nccl, MissingRankTimesOutNamingOpSeqRankAndElapsed) {
  GZ_REQUIRE_GPUS(2);
  test::run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make_comm(rank, 2, store, milliseconds(rank == 0 ? 60000 : 5000));
    c->barrier();  // seq 0, with the generous timeout (first op connects)
    if (rank == 1) {
      store->get("rank0_done", Deadline::after(milliseconds(60000)));
      return;
    }
    DevVec<float> d(8);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->allreduce(d.get(), 8, DType::f32, ReduceOp::sum, comm::OpOptions::within(milliseconds(1000)));
      ADD_FAILURE() << "an all-reduce without its peer completed";
    } catch (const TimeoutError& e) {
      const auto took = std::chrono::steady_clock::now() - t0;
      EXPECT_GE(took, milliseconds(1000));
      EXPECT_LT(took, milliseconds(3500));
      const std::string m = e.what();
      for (const char* part : {"nccl allreduce #1", "rank 0/2", "failed after", "deadline passed", "aborted"})
        EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' missing from: " << m;
    }
    try {
      c->barrier();
      ADD_FAILURE() << "an op after the timeout ran";
    } catch (const Aborted& e) {
      EXPECT_NE(std::string(e.what()).find("deadline passed"), std::string::npos) << e.what();
    }
    store->set("rank0_done", to_bytes("1"));
  });
}

TEST(Nccl, InitTimesOutNamingTheMissingRank) {
  GZ_REQUIRE_GPUS(1);
  auto store = std::make_shared<MemStore>();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    make_comm(0, 2, store, milliseconds(1000));  // rank 1 never comes
    FAIL() << "init without rank 1 succeeded";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never joined: 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
}

TEST(Nccl, UniqueIdTimeoutNamesRankZero) {
  GZ_REQUIRE_GPUS(1);
  auto store = std::make_shared<MemStore>();
  ck(cudaSetDevice(0), "cudaSetDevice");
  NcclOptions o;
  o.timeout = milliseconds(500);
  o.device = 0;
  try {
    create_nccl_communicator(1, 2, store, o);  // rank 0 never publishes the id
    FAIL() << "init without rank 0 succeeded";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 did not publish"), std::string::npos) << e.what();
  }
}

TEST(Nccl, NoGpuIsAClearError) {
  if (visible_gpus() > 0) GTEST_SKIP() << "a CUDA device is visible (" << cuda_status_ << ")";
  try {
    create_nccl_communicator(0, 1, std::make_shared<MemStore>(), milliseconds(1000));
    FAIL() << "an NCCL communicator without a GPU";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gz::comm
