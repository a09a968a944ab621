// Classifier models the trainer and the benchmarks drive through one interface.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

namespace gz::train {

/// @brief Hyper-parameters of the built-in models (each model reads the fields it needs).
struct ModelOptions {
  std::string net_type = "cnn";  ///< cnn, resnet18, resnet34, resnet50, mobilenet_v2, bert_small, mlp
  int64_t num_classes = 10;
  int64_t in_channels = 1;   ///< image models
  int64_t input_size = 28;   ///< image side (image models) or sequence length (text models)
  double dropout = 0.1;
  /// @brief gz's fused kernels where a model has a matching block: gz::fused_dropout (bert_small),
  /// gz::max_pool2d_relu (cnn). Same distributions and gradients; false = LibTorch's own ops.
  bool fused_kernels = true;
  // BERT-style encoder (hidden and layers: also the mlp's width and hidden layers)
  int64_t vocab_size = 30522;
  int64_t hidden = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t ffn = 1024;
};

/// @brief A classifier: forward(input) -> logits [N, num_classes]. Images are float [N, C, H, W];
/// token models take int64 ids [N, T] with 0 as padding.
class ModelImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor input) = 0;
  /// @brief Deep copy with equal parameters and buffers (DP replicas, tests).
  virtual std::shared_ptr<ModelImpl> clone_model() const = 0;
};
using ModelPtr = std::shared_ptr<ModelImpl>;

/// @brief Build a model by options.net_type; unknown names throw gz::InvalidArgument listing the known.
ModelPtr create_model(const ModelOptions& options);
/// @brief Names accepted by create_model.
std::vector<std::string> model_names();

}  // namespace gz::train
