// Row-sparse gradients: the non-zero-row scan, the row exchange against a dense reference (sums,
// divisor, fallback, the same bits on every rank), DDP and the Horovod mode on a model with an
// embedding table against one process on the whole batch, and DDP's bucket caps.
#include <algorithm>

#include "gz/core/error.h"
#include "gz/torch/collectives.h"
#include "gz/torch/compression.h"
#include "gz/torch/ddp.h"
#include "gz/torch/distributed_optimizer.h"
#include "gz/torch/row_sparse.h"
#include "gz/torch/tensor_adapter.h"
#include "torch/support/torch_test_util.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_row_sparse {

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

TEST(RowSparse, NonzeroRowsFindsEveryTouchedRow) {
  // Row widths below one 32-byte word, exactly one, and one plus a tail; the non-zero element sits
  // at the very end of its row so a scan that stops early misses it.
  for (int64_t cols : {3, 8, 9, 64}) {
    auto t = torch::zeros({10, cols});
    t[1][cols - 1] = 1.0f;
    t[4][0] = -2.0f;
    t[7][cols / 2] = 3.0f;
    t[9][cols - 1] = -0.0f;  // -0.0 has a bit set: sent, so every rank ends with the same bits
    EXPECT_EQ(nonzero_rows(t), (std::vector<int64_t>{1, 4, 7, 9})) << cols << " columns";
  }
  EXPECT_TRUE(nonzero_rows(torch::zeros({5, 4}, torch::kDouble)).empty());
  EXPECT_THROW(nonzero_rows(torch::zeros({4, 4}).t()), InvalidArgument);  // not contiguous
}

TEST(RowSparse, CandidatesAreMostlyZeroFloatingTables) {
  RowSparseOptions o;
  o.min_rows = 8;
  auto sparse = torch::zeros({40, 4});
  sparse[3].fill_(1);
  EXPECT_TRUE(is_row_sparse_candidate(sparse, o));
  EXPECT_FALSE(is_row_sparse_candidate(torch::ones({40, 4}), o));     // dense
  EXPECT_FALSE(is_row_sparse_candidate(torch::zeros({4, 4}), o));     // too few rows
  EXPECT_FALSE(is_row_sparse_candidate(torch::zeros({40}), o));       // 1-D
  EXPECT_FALSE(is_row_sparse_candidate(sparse.to(torch::kLong), o));  // not floating point
  o.enabled = false;
  EXPECT_FALSE(is_row_sparse_candidate(sparse, o));
}

// Rank r's gradient: `rows` x `cols`, rows i with i % 11 == r or i % 13 == 2r % 13 touched (they
// overlap across ranks), plus row 0 everywhere; or every row touched (`dense`).
torch::Tensor rank_grad(int r, int64_t rows, int64_t cols, bool dense) {
  torch::manual_seed(100 + r);
  if (dense) return torch::randn({rows, cols});
  auto g = torch::zeros({rows, cols});
  for (int64_t i = 0; i < rows; ++i)
    if (i == 0 || i % 11 == r || i % 13 == (2 * r) % 13) g[i] = torch::randn({cols});
  return g;
}

// A sparse gradient is never "bound" to a dense slot, and asking must not throw: LibTorch 2.x
// throws on a sparse tensor's data_ptr() (the Horovod mode's arena asked it on every step).
// Mutation check: dropping the layout test in is_bound_to fails this on LibTorch 2.6.
TEST(RowSparse, ASparseGradientIsNeverBoundToASlot) {
  auto dense = torch::zeros({6, 4});
  auto sparse = dense.clone();
  sparse[2].fill_(1);
  sparse = sparse.to_sparse();
  EXPECT_FALSE(is_bound_to(sparse, dense));
  EXPECT_TRUE(is_bound_to(dense, dense));
  EXPECT_FALSE(is_bound_to(torch::Tensor(), dense));
}

class RowSparseWorld : public ::testing::TestWithParam<int> {};

TEST_P(RowSparseWorld, ExchangeEqualsTheDenseAverageWithTheSameBitsEverywhere) {
  const int world = GetParam();
  const int64_t rows = 300, cols = 16;
  for (bool dense : {false, true}) {
    auto want = torch::zeros({rows, cols}, torch::kDouble);
    for (int r = 0; r < world; ++r) want += rank_grad(r, rows, cols, dense).to(torch::kDouble);
    want /= world;
    std::vector<torch::Tensor> got(world);
    for (int r = 0; r < world; ++r) got[r] = rank_grad(r, rows, cols, dense);  // the RNG is global: here
    std::vector<int> sparse_path(world, -1);
    std::vector<int64_t> exchanged(world, 0);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto grad = got[r];
      RowSparseState st;
      sparse_path[r] = allreduce_row_sparse(*g, grad, world, st, RowSparseOptions()) ? 1 : 0;
      exchanged[r] = st.last_rows;
    });
    for (int r = 0; r < world; ++r) {
      // Touched rows were sent (sparse) unless the dense all-reduce is cheaper (every row touched)
      // or there is no one to send them to.
      EXPECT_EQ(sparse_path[r], dense || world == 1 ? 0 : 1) << "rank " << r;
      EXPECT_TRUE(torch::allclose(got[r].to(torch::kDouble), want, 1e-6, 1e-6))
          << "rank " << r << " dense " << dense;
      EXPECT_TRUE(torch::equal(got[r], got[0])) << "rank " << r << " differs from rank 0 in some bit";
    }
    if (!dense && world > 1) {
      int64_t sent = 0;
      for (int r = 0; r < world; ++r)
        sent += static_cast<int64_t>(nonzero_rows(rank_grad(r, rows, cols, false)).size());
      EXPECT_EQ(exchanged[0], sent);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(World, RowSparseWorld, ::testing::Values(1, 2, 3, 4));

TEST(RowSparse, DivisorAndEmptyRanks) {
  // Under DDP join() the divisor is the number of active ranks; a joined rank contributes no rows.
  const int world = 3;
  const int64_t rows = 300, cols = 16;
  std::vector<torch::Tensor> got(world);
  for (int r = 0; r < world; ++r)
    got[r] = r == 2 ? torch::zeros({rows, cols}) : rank_grad(r, rows, cols, false);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    RowSparseState st;
    EXPECT_TRUE(allreduce_row_sparse(*g, got[r], 2.0, st, RowSparseOptions()));
  });
  auto want = (rank_grad(0, rows, cols, false) + rank_grad(1, rows, cols, false)) / 2;
  for (int r = 0; r < world; ++r) EXPECT_TRUE(torch::allclose(got[r], want, 1e-6, 1e-7)) << "rank " << r;
}

// An embedding table (vocab 256 x 8, padding row 0) and a linear head: each step touches at most
// world x 4 x 5 of the 256 rows.
constexpr int64_t kVocab = 256, kB = 4, kSeq = 5;

struct EmbedNetImpl : torch::nn::Module {
  explicit EmbedNetImpl(bool sparse) {
    torch::manual_seed(4321);
    emb = register_module(
        "emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(kVocab, 8).padding_idx(0).sparse(sparse)));
    head = register_module("head", torch::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    return head->forward(torch::tanh(emb->forward(ids).mean(1)));
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(EmbedNet);

struct Tokens {
  std::vector<torch::Tensor> ids, y;
};
Tokens make_tokens(int steps, int64_t rows) {
  torch::manual_seed(77);
  Tokens t;
  for (int s = 0; s < steps; ++s) {
    t.ids.push_back(torch::randint(0, kVocab, {rows, kSeq}, torch::kLong));
    t.y.push_back(torch::randn({rows, 4}));
  }
  return t;
}

std::shared_ptr<torch::optim::Optimizer> make_opt(torch::nn::Module& m, bool adam) {
  if (!adam) return std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.5));
  return std::make_shared<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
}

// One process on the whole batch, dense embedding gradient.
EmbedNet train_reference(const Tokens& t, int steps, bool adam) {
  EmbedNet m(false);
  auto opt = make_opt(*m, adam);
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    torch::mse_loss(m->forward(t.ids[s]), t.y[s]).backward();
    opt->step();
  }
  return m;
}

struct Case {
  int world;
  bool adam;
  bool sparse_module;  // nn::Embedding sparse(true): gradients arrive as sparse tensors
};

class RowSparseDDP : public ::testing::TestWithParam<Case> {};

TEST_P(RowSparseDDP, MatchesOneProcessOnTheWholeBatch) {
  const auto c = GetParam();
  const int steps = 6;
  auto t = make_tokens(steps, c.world * kB);
  auto ref = train_reference(t, steps, c.adam);
  std::vector<EmbedNet> models;  // made here: the RNG is global
  for (int r = 0; r < c.world; ++r) models.emplace_back(c.sparse_module);
  run_ranks(c.world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, c.world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g);
    auto& red = ddp.reducer();
    const auto& names = red.param_names();
    const size_t emb =
        static_cast<size_t>(std::find(names.begin(), names.end(), "emb.weight") - names.begin());
    ASSERT_LT(emb, names.size());
    auto opt = make_opt(*m, c.adam);
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      auto out = ddp.forward([&] { return m->forward(shard(t.ids[s], r, kB)); });
      torch::mse_loss(out, shard(t.y[s], r, kB)).backward();
      EXPECT_FALSE(m->emb->weight.grad().is_sparse());  // the optimizer sees the dense average
      opt->step();
      if (s == 0) continue;  // the first step decides; rows travel from the second on
      EXPECT_TRUE(red.row_sparse(emb));
      // Its own bucket; every touched row (at most world x kB x kSeq) counted once per rank.
      for (const auto& b : red.bucket_layout())
        if (std::find(b.begin(), b.end(), emb) != b.end()) EXPECT_EQ(b.size(), 1u);
      const auto rows = red.last_rows_exchanged(emb);
      EXPECT_GT(rows, 0);
      EXPECT_LE(rows, c.world * kB * kSeq);
    }
    EXPECT_FALSE(red.row_sparse(
        static_cast<size_t>(std::find(names.begin(), names.end(), "head.weight") - names.begin())));
    EXPECT_LE(max_rel_diff(*m, *ref), c.adam ? 1e-4 : 1e-5) << "rank " << r;
  });
}

INSTANTIATE_TEST_SUITE_P(Cases, RowSparseDDP,
                         ::testing::Values(Case{2, false, false}, Case{3, true, false}, Case{2, true, true},
                                           Case{3, false, true}));

// The compressing hooks (PowerSGD, int8, top-k) leave a row-sparse bucket to the row exchange,
// uncompressed (its rows are few): they used to compress the embedding table like any bucket.
TEST(RowSparse, CompressingHooksExchangeRowsUncompressed) {
  const int world = 2, steps = 4;
  auto t = make_tokens(steps, world * kB);
  for (auto method : {Compression::powersgd, Compression::int8, Compression::topk}) {
    std::vector<EmbedNet> models;
    for (int r = 0; r < world; ++r) models.emplace_back(false);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      CompressionOptions co;
      co.method = method;
      // One uncompressed step first: the row-sparse choice reads its exact average (int8's
      // dequantised zeros are not zero, which would keep the table dense).
      co.start_step = 1;
      DDPOptions o;
      o.comm_hook = make_comm_hook(co);
      DistributedDataParallel ddp(m.ptr(), g, o);
      auto& red = ddp.reducer();
      const auto& names = red.param_names();
      const size_t emb =
          static_cast<size_t>(std::find(names.begin(), names.end(), "emb.weight") - names.begin());
      ASSERT_LT(emb, names.size());
      torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.5));
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        auto out = ddp.forward([&] { return m->forward(shard(t.ids[s], r, kB)); });
        torch::mse_loss(out, shard(t.y[s], r, kB)).backward();
        if (s > 0) {  // row-sparse from the second step on
          ASSERT_TRUE(red.row_sparse(emb));
          EXPECT_GT(red.last_rows_exchanged(emb), 0) << to_string(method) << " step " << s;
          // Exact: the gradient is the same on every rank, bit for bit (a compressed one is not
          // guaranteed to be, and an uncompressed average of few rows has no error to feed back).
          auto grads = torch::zeros({world, kVocab, 8});
          grads[r].copy_(m->emb->weight.grad());
          gz::allreduce(grads, comm::ReduceOp::sum, g);
          EXPECT_TRUE(torch::equal(grads[0], grads[1])) << to_string(method) << " step " << s;
        }
        opt.step();
      }
    });
  }
}

TEST(RowSparse, HorovodModeMatchesOneProcessOnTheWholeBatch) {
  for (bool sparse_module : {false, true}) {
    const int world = 3, steps = 6;
    auto t = make_tokens(steps, world * kB);
    auto ref = train_reference(t, steps, /*adam=*/true);
    std::vector<EmbedNet> models;
    for (int r = 0; r < world; ++r) models.emplace_back(sparse_module);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      NamedParameters named;
      for (auto& it : m->named_parameters()) named.emplace_back(it.key(), it.value());
      DistributedOptimizer opt(make_opt(*m, true), named, DistributedOptimizerOptions(), g);
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        torch::mse_loss(m->forward(shard(t.ids[s], r, kB)), shard(t.y[s], r, kB)).backward();
        opt.step();
        EXPECT_EQ(opt.row_sparse("emb.weight"), true);  // decided after the first step
        if (s > 0) {
          EXPECT_GT(opt.last_rows_exchanged("emb.weight"), 0);
          EXPECT_LE(opt.last_rows_exchanged("emb.weight"), world * kB * kSeq);
        }
      }
      EXPECT_FALSE(opt.row_sparse("head.weight"));
      EXPECT_LE(max_rel_diff(*m, *ref), 1e-4) << "rank " << r << " sparse module " << sparse_module;
    });
  }
}

TEST(RowSparse, OffMeansDense) {
  const int world = 2, steps = 3;
  auto t = make_tokens(steps, world * kB);
  std::vector<EmbedNet> models;
  for (int r = 0; r < world; ++r) models.emplace_back(false);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DDPOptions o;
    o.row_sparse.enabled = false;
    DistributedDataParallel ddp(m.ptr(), g, o);
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.5));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(ddp.forward([&] { return m->forward(shard(t.ids[s], r, kB)); }), shard(t.y[s], r, kB))
          .backward();
      opt.step();
    }
    for (size_t i = 0; i < ddp.reducer().params().size(); ++i) EXPECT_FALSE(ddp.reducer().row_sparse(i));
  });
}

// Parameter sizes (bytes) in backward order: c.bias 32, c.weight 256, big.bias 128, big.weight
// 4096, a.bias 32, a.weight 256.
struct ThreeImpl : torch::nn::Module {
  ThreeImpl() {
    torch::manual_seed(5);
    a = register_module("a", torch::nn::Linear(8, 8));
    big = register_module("big", torch::nn::Linear(32, 32));
    c = register_module("c", torch::nn::Linear(8, 8));
  }
  torch::nn::Linear a{nullptr}, big{nullptr}, c{nullptr};
};
TORCH_MODULE(Three);

TEST(DDPBuckets, ABucketOverflowsItsCapOnlyWithOneGradient) {
  // A gradient that would overflow the open bucket starts the next one, so a big gradient that
  // becomes ready late never holds back the small ones before it.
  run_ranks(1, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, 1, store);
    Three m;
    DDPOptions o;
    o.first_bucket_bytes = 64;
    o.bucket_bytes = 1024;
    DistributedDataParallel ddp(m.ptr(), g, o);
    auto& red = ddp.reducer();
    const auto layout = red.bucket_layout();
    ASSERT_GE(layout.size(), 3u);
    for (size_t b = 0; b < layout.size(); ++b) {
      size_t bytes = 0;
      for (size_t i : layout[b]) bytes += red.params()[i].numel() * red.params()[i].element_size();
      const size_t cap = b == 0 ? o.first_bucket_bytes : o.bucket_bytes;
      if (layout[b].size() > 1)
        EXPECT_LE(bytes, cap) << "bucket " << b << " holds " << layout[b].size() << " gradients";
    }
    const auto& names = red.param_names();
    for (const auto& b : layout)
      for (size_t i : b)
        if (names[i] == "big.weight") EXPECT_EQ(b.size(), 1u);
  });
}

TEST(DDPBuckets, TheCapShrinksToGiveAtLeastMinBuckets) {
  // 16 layers of 1 KiB + 16 B each under the default 25 MiB cap: one bucket after the first unless
  // the cap shrinks.
  struct Stack : torch::nn::Module {
    Stack() {
      for (int i = 0; i < 16; ++i) register_module("l" + std::to_string(i), torch::nn::Linear(16, 16));
    }
  };
  run_ranks(1, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, 1, store);
    auto m = std::make_shared<Stack>();
    for (size_t min_buckets : {size_t(1), size_t(8)}) {
      DDPOptions o;
      o.first_bucket_bytes = 64;
      o.min_buckets = min_buckets;
      DistributedDataParallel ddp(m, g, o);
      const auto n = ddp.reducer().bucket_layout().size();
      if (min_buckets == 1)
        EXPECT_EQ(n, 2u);
      else
        EXPECT_GE(n, 8u);
    }
  });
}

}  // namespace

}  // namespace test_row_sparse
