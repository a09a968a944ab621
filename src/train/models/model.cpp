// create_model / model_names: the registry of built-in models.
#include "gz/train/models/model.h"

#include <torch/torch.h>

#include <functional>
#include <utility>

#include "gz/core/error.h"
#include "gz/train/models/bert.h"
#include "gz/train/models/cnn.h"
#include "gz/train/models/mlp.h"
#include "gz/train/models/mobilenet_v2.h"
#include "gz/train/models/resnet.h"

namespace gz::train {
namespace {

using Factory = std::function<ModelPtr(const ModelOptions&)>;

const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> models = {
      {"cnn", [](const ModelOptions& o) { return std::make_shared<CnnImpl>(o); }},
      {"resnet18", [](const ModelOptions& o) { return std::make_shared<ResNetImpl>(o, 18); }},
      {"resnet34", [](const ModelOptions& o) { return std::make_shared<ResNetImpl>(o, 34); }},
      {"resnet50", [](const ModelOptions& o) { return std::make_shared<ResNetImpl>(o, 50); }},
      {"mobilenet_v2", [](const ModelOptions& o) { return std::make_shared<MobileNetV2Impl>(o); }},
      {"bert_small", [](const ModelOptions& o) { return std::make_shared<BertClassifierImpl>(o); }},
      {"mlp", [](const ModelOptions& o) { return std::make_shared<MlpImpl>(o); }},
  };
  return models;
}

}  // namespace

ModelPtr create_model(const ModelOptions& options) {
  for (const auto& [name, factory] : registry())
    if (name == options.net_type) return factory(options);
  std::string known;
  for (const auto& name : model_names()) known += (known.empty() ? "" : ", ") + name;
  GZ_THROW(InvalidArgument, "unknown model '", options.net_type, "' (known: ", known, ")");
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

}  // namespace gz::train
