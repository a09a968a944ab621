#include "gz/train/models/bert.h"

#include <torch/torch.h>

#include <cmath>

#include "gz/core/error.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/fused_dropout.h"
#include "train/models/copy_state.h"

namespace gz::train {
namespace {

// Additive mask value for padding keys: far below any real score, yet finite in half precision
// (so an all-padding row gives a uniform softmax instead of NaN).
constexpr double kMaskedScore = -1e4;

// Dropout through gz's fused kernel (one pass, mask recomputed in backward); same distribution as
// torch::nn::Dropout, which stays registered for its options and train()/eval() state.
torch::Tensor dropout(torch::nn::Dropout& d, bool fused, const torch::Tensor& x) {
  return fused ? fused_dropout(x, d->options.p(), d->is_training()) : d->forward(x);
}

void init_linear(torch::nn::Linear& l) {
  torch::nn::init::normal_(l->weight, 0.0, 0.02);  // BERT's initializer range
  if (l->bias.defined()) torch::nn::init::zeros_(l->bias);
}

}  // namespace

BertLayerImpl::BertLayerImpl(int64_t hidden, int64_t heads, int64_t ffn, double dropout, bool fused_dropout)
    : heads_(heads), fused_(fused_dropout) {
  qkv_ = register_module("qkv", torch::nn::Linear(hidden, 3 * hidden));
  out_ = register_module("out", torch::nn::Linear(hidden, hidden));
  norm1_ = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}).eps(1e-12)));
  ffn_in_ = register_module("ffn_in", torch::nn::Linear(hidden, ffn));
  ffn_out_ = register_module("ffn_out", torch::nn::Linear(ffn, hidden));
  norm2_ = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}).eps(1e-12)));
  drop_ = register_module("drop", torch::nn::Dropout(dropout));
  for (auto* l : {&qkv_, &out_, &ffn_in_, &ffn_out_}) init_linear(*l);
}

torch::Tensor BertLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& key_bias) {
  const int64_t n = x.size(0), t = x.size(1), h = x.size(2), d = h / heads_;
  // [N, T, 3H] -> 3 x [N, heads, T, d]
  auto qkv = qkv_->forward(x).view({n, t, 3, heads_, d}).permute({2, 0, 3, 1, 4});
  auto q = qkv[0], k = qkv[1], v = qkv[2];
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
  auto probs = dropout(drop_, fused_, torch::softmax(scores + key_bias, -1));
  auto ctx = torch::matmul(probs, v).transpose(1, 2).reshape({n, t, h});
  auto y = norm1_->forward(x + dropout(drop_, fused_, out_->forward(ctx)));
  auto f = ffn_out_->forward(torch::gelu(ffn_in_->forward(y)));
  return norm2_->forward(y + dropout(drop_, fused_, f));
}

BertClassifierImpl::BertClassifierImpl(const ModelOptions& o) : options_(o) {
  GZ_CHECK_ARG(o.vocab_size > 1 && o.hidden > 0 && o.layers >= 0 && o.heads > 0 && o.ffn > 0,
               "bert_small: vocab ", o.vocab_size, ", hidden ", o.hidden, ", layers ", o.layers, ", heads ",
               o.heads, ", ffn ", o.ffn);
  GZ_CHECK_ARG(o.hidden % o.heads == 0, "bert_small: hidden ", o.hidden, " not divisible by heads ", o.heads);
  GZ_CHECK_ARG(o.input_size > 0 && o.num_classes > 0, "bert_small: input_size (sequence length) ",
               o.input_size, ", num_classes ", o.num_classes);
  GZ_CHECK_ARG(o.dropout >= 0 && o.dropout < 1, "bert_small: dropout ", o.dropout);
  tokens_ = register_module(
      "tokens", torch::nn::Embedding(torch::nn::EmbeddingOptions(o.vocab_size, o.hidden).padding_idx(0)));
  positions_ = register_module("positions", torch::nn::Embedding(o.input_size, o.hidden));
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(1e-12)));
  drop_ = register_module("drop", torch::nn::Dropout(o.dropout));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i)
    blocks_->push_back(BertLayer(o.hidden, o.heads, o.ffn, o.dropout, o.fused_kernels));
  pooler_ = register_module("pooler", torch::nn::Linear(o.hidden, o.hidden));
  classifier_ = register_module("classifier", torch::nn::Linear(o.hidden, o.num_classes));
  {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(tokens_->weight, 0.0, 0.02);
    tokens_->weight[0].zero_();
    torch::nn::init::normal_(positions_->weight, 0.0, 0.02);
  }
  init_linear(pooler_);
  init_linear(classifier_);
}

torch::Tensor BertClassifierImpl::forward(torch::Tensor ids) {
  if (ids.dim() != 2 || ids.scalar_type() != torch::kLong)
    GZ_THROW(InvalidArgument, "bert_small: expected int64 ids [N, T], got ", ids.scalar_type(), " ",
             ids.sizes());
  const int64_t t = ids.size(1);
  if (t > options_.input_size)
    GZ_THROW(InvalidArgument, "bert_small: sequence length ", t, " > input_size ", options_.input_size);
  auto keep = ids.ne(0);  // [N, T]
  auto pos = torch::arange(t, ids.options());
  auto x = tokens_->forward(ids) + positions_->forward(pos).unsqueeze(0);
  x = dropout(drop_, options_.fused_kernels, norm_->forward(x));
  auto key_bias = torch::zeros(keep.sizes(), x.options()).masked_fill(keep.logical_not(), kMaskedScore);
  key_bias = key_bias.view({keep.size(0), 1, 1, t});
  for (const auto& block : *blocks_) {
    auto* layer = block->as<BertLayerImpl>();
    x = run_unit(*layer, [&] { return layer->forward(x, key_bias); });  // a unit when fully sharded
  }
  // Mean over real tokens; an all-padding row pools to zeros instead of dividing by zero.
  auto w = keep.to(x.scalar_type()).unsqueeze(-1);
  auto pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0);
  pooled = torch::tanh(pooler_->forward(pooled));
  return classifier_->forward(dropout(drop_, options_.fused_kernels, pooled));
}

std::vector<std::shared_ptr<torch::nn::Module>> BertClassifierImpl::shard_units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (size_t i = 0; i < blocks_->size(); ++i) out.push_back(blocks_->ptr(i));
  return out;
}

std::shared_ptr<ModelImpl> BertClassifierImpl::clone_model() const {
  auto copy = std::make_shared<BertClassifierImpl>(options_);
  model_detail::copy_state(*this, *copy);
  return copy;
}

}  // namespace gz::train
