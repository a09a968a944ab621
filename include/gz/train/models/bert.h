// Small BERT-style encoder for sequence classification ("bert_small").
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "gz/train/models/model.h"
#include "gz/train/models/shard_units.h"

namespace gz::train {

/// @brief One post-LayerNorm encoder block: multi-head self-attention with a key padding mask,
/// then a GELU feed-forward network, each followed by dropout, residual add and LayerNorm.
class BertLayerImpl : public torch::nn::Module {
 public:
  /// @brief fused_dropout: use gz::fused_dropout instead of torch::dropout (same distribution).
  BertLayerImpl(int64_t hidden, int64_t heads, int64_t ffn, double dropout, bool fused_dropout = true);
  /// @brief x [N, T, H]; key_bias [N, 1, 1, T] additive (0 for tokens, large negative for padding).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_bias);

 private:
  int64_t heads_;
  bool fused_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr}, ffn_in_{nullptr}, ffn_out_{nullptr};
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(BertLayer);

/// @brief Token + position embeddings, LayerNorm, dropout, `layers` BertLayers, masked mean pool
/// over non-padding tokens, tanh pooler and a linear classifier. Input: int64 ids [N, T], T <=
/// input_size, id 0 = padding. Defaults: vocab 30522, hidden 256, 4 layers, 4 heads, FFN 1024.
class BertClassifierImpl : public ModelImpl, public ShardUnits {
 public:
  explicit BertClassifierImpl(const ModelOptions& options);
  torch::Tensor forward(torch::Tensor ids) override;
  std::shared_ptr<ModelImpl> clone_model() const override;
  /// @brief The encoder blocks.
  std::vector<std::shared_ptr<torch::nn::Module>> shard_units() const override;

 private:
  ModelOptions options_;
  torch::nn::Embedding tokens_{nullptr}, positions_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Dropout drop_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::Linear pooler_{nullptr}, classifier_{nullptr};
};

}  // namespace gz::train
