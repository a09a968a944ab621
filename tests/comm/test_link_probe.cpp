// The link probe: its rounds, its measures over a real transport (shm ranks as threads), and the
// judgement that names a slow node, with one rank's sends and receives slowed by a wrapper
// communicator (a slow NIC without a network).
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "gz/comm/link_probe.h"
#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "support/run_ranks.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;
using comm::LinkMeasure;

// Forwards every op to `inner`; point-to-point traffic to or from rank `slow` is paced at
// `bytes_per_s`, as through a slow network card.
class SlowLinkComm : public comm::Communicator {
 public:
  SlowLinkComm(comm::CommPtr inner, int slow, double slow_bps, double fast_bps)
      : Communicator(inner->timeout()), inner_(std::move(inner)), slow_(slow), slow_bps_(slow_bps),
        fast_bps_(fast_bps) {}
  ~SlowLinkComm() override { shutdown_executor(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "slow(" + inner_->backend() + ")"; }

 protected:
  std::shared_ptr<Communicator> do_new_group(const std::vector<int>&) override {
    GZ_THROW(InvalidArgument, "not in this test");
  }
  void do_allreduce(void* d, size_t n, DType t, comm::ReduceOp op) override {
    inner_->allreduce(d, n, t, op);
  }
  void do_broadcast(void* d, size_t n, DType t, int root) override { inner_->broadcast(d, n, t, root); }
  void do_allgather(const void* s, void* r, size_t n, DType t) override { inner_->allgather(s, r, n, t); }
  void do_allgatherv(const void* s, void* r, const std::vector<size_t>& c, DType t) override {
    inner_->allgatherv(s, r, c, t);
  }
  void do_reduce_scatter(const void* s, void* r, size_t n, DType t, comm::ReduceOp op) override {
    inner_->reduce_scatter(s, r, n, t, op);
  }
  void do_reduce(void* d, size_t n, DType t, comm::ReduceOp op, int root) override {
    inner_->reduce(d, n, t, op, root);
  }
  void do_barrier() override { inner_->barrier(); }
  void do_send(const void* d, size_t n, DType t, int peer, int tag) override {
    pace(n * dtype_size(t), peer);
    inner_->send(d, n, t, peer, options(tag));
  }
  void do_recv(void* d, size_t n, DType t, int peer, int tag) override {
    inner_->recv(d, n, t, peer, options(tag));
  }
  void do_abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  comm::OpOptions options(int tag) const {
    comm::OpOptions o = comm::OpOptions::until(op_deadline());
    o.tag = tag;
    return o;
  }
  // Every link is paced, not only the slow one: an unpaced shm link is so fast that one preemption
  // of its timed transfer (TSan, two cores shared with other tests) drops it below half the median.
  void pace(size_t bytes, int peer) {
    const double bps = (rank() == slow_ || peer == slow_) ? slow_bps_ : fast_bps_;
    std::this_thread::sleep_for(std::chrono::duration<double>(static_cast<double>(bytes) / bps));
  }
  comm::CommPtr inner_;
  int slow_;
  double slow_bps_;
  double fast_bps_;
};

TEST(LinkProbe, RoundsNeverUseARankTwiceAndKeepEveryPairOnce) {
  const std::vector<std::pair<int, int>> pairs{{0, 1}, {1, 2}, {2, 3}, {3, 0}, {0, 2}, {1, 3}, {2, 1}};
  const auto rounds = comm::link_probe_rounds(pairs);
  std::set<std::pair<int, int>> seen;
  for (const auto& round : rounds) {
    std::set<int> used;
    for (auto [a, b] : round) {
      EXPECT_LT(a, b);
      EXPECT_TRUE(used.insert(a).second && used.insert(b).second) << a << "-" << b;
      EXPECT_TRUE(seen.insert({a, b}).second) << "pair twice: " << a << "-" << b;
    }
  }
  EXPECT_EQ(seen.size(), 6u);    // (2, 1) is (1, 2)
  EXPECT_EQ(rounds.size(), 3u);  // a 4-cycle plus its diagonals: three perfect matchings
  EXPECT_THROW(comm::link_probe_rounds({{1, 1}}), InvalidArgument);
  EXPECT_THROW(comm::link_probe_rounds({{-1, 2}}), InvalidArgument);
}

TEST(LinkProbe, JudgementNamesTheNodeWhoseEveryLinkIsSlow) {
  // Ring of 4 nodes plus both diagonals; node 2's NIC is slow: all of its three links are.
  const double fast = 100e6, slow = 10e6;
  std::vector<LinkMeasure> m{{0, 1, 50, fast}, {1, 2, 50, slow}, {2, 3, 50, slow},
                             {0, 3, 50, fast}, {0, 2, 50, slow}, {1, 3, 50, fast * 1.1}};
  auto j = comm::judge_links(4, m);
  EXPECT_EQ(j.slow_nodes, std::vector<int>{2});
  EXPECT_EQ(j.slow_links, (std::vector<size_t>{1, 2, 4}));
  // A ring of three: two of three links are slow, the median link is slow, yet the node is named.
  auto j3 = comm::judge_links(3, {{0, 1, 50, fast}, {1, 2, 50, slow}, {0, 2, 50, slow}});
  EXPECT_EQ(j3.slow_nodes, std::vector<int>{2});
  // Two nodes, one link: nobody can be blamed.
  EXPECT_TRUE(comm::judge_links(2, {{0, 1, 50, slow}}).slow_nodes.empty());
  // A healthy spread names nobody.
  EXPECT_TRUE(comm::judge_links(
                  4, {{0, 1, 50, fast}, {1, 2, 50, 0.7 * fast}, {2, 3, 50, fast}, {0, 3, 50, 0.8 * fast}})
                  .slow_nodes.empty());
  EXPECT_THROW(comm::judge_links(2, {{0, 2, 50, fast}}), InvalidArgument);
  EXPECT_EQ(comm::format_rate(11.8e6), "11.8 MB/s");
}

// Four ranks over real shared-memory send/recv; rank 2's links paced at 10 MB/s, the others at 100. Every pair is
// measured once (by its smaller rank), and the judgement of all measures names rank 2 alone.
// Mutation check: a probe that times the untimed warm-up instead of the bandwidth exchange (or
// reports the responder's times) makes node 2 look as fast as the others.
TEST(LinkProbe, FindsTheSlowRankOverARealTransport) {
  const std::vector<std::pair<int, int>> pairs{{0, 1}, {1, 2}, {2, 3}, {0, 3}, {0, 2}, {1, 3}};
  std::vector<std::vector<LinkMeasure>> got(4);
  run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
    comm::ShmOptions so;
    so.timeout = 20s;
    auto inner = comm::create_shm_communicator(rank, 4, store, so);
    SlowLinkComm c(inner, 2, 10e6, 100e6);
    comm::LinkProbeOptions po;
    po.bytes = 512 * 1024;
    po.pings = 3;
    // Best of 5: four rank threads share 2 cores with other tests; one clean try per pair suffices.
    po.repeats = 5;
    got[static_cast<size_t>(rank)] = comm::probe_links(c, pairs, po);
  });
  std::vector<LinkMeasure> all;
  for (int r = 0; r < 4; ++r)
    for (const auto& m : got[static_cast<size_t>(r)]) {
      EXPECT_EQ(m.a, r) << "a measure is reported by the pair's smaller rank";
      EXPECT_GT(m.bytes_per_s, 0);
      EXPECT_GT(m.rtt_us, 0);
      all.push_back(m);
    }
  ASSERT_EQ(all.size(), pairs.size());
  for (const auto& m : all)
    if (m.a == 2 || m.b == 2) EXPECT_LT(m.bytes_per_s, 12.5e6) << m.a << "-" << m.b;  // paced at 10 MB/s
  const auto j = comm::judge_links(4, all);
  EXPECT_EQ(j.slow_nodes, std::vector<int>{2});
}

TEST(LinkProbe, RejectsBadOptions) {
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_shm_communicator(rank, 2, store);
    comm::LinkProbeOptions po;
    po.bytes = 10;
    EXPECT_THROW(comm::probe_links(*c, {{0, 1}}, po), InvalidArgument);
    EXPECT_THROW(comm::probe_links(*c, {{0, 5}}), InvalidArgument);
  });
}

}  // namespace
}  // namespace gz::test
