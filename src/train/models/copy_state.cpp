#include "train/models/copy_state.h"

#include <torch/torch.h>

#include "gz/core/error.h"

namespace gz::train::model_detail {
namespace {

void copy_dict(const torch::OrderedDict<std::string, torch::Tensor>& from,
               torch::OrderedDict<std::string, torch::Tensor>& to, const char* what) {
  if (from.size() != to.size())
    GZ_THROW(InvalidArgument, "clone_model: ", what, " count differs (", from.size(), " vs ", to.size(), ")");
  for (const auto& item : from) {
    torch::Tensor* dst = to.find(item.key());
    if (dst == nullptr) GZ_THROW(InvalidArgument, "clone_model: ", what, " '", item.key(), "' missing in copy");
    if (!item.value().defined()) continue;
    if (dst->sizes() != item.value().sizes())
      GZ_THROW(InvalidArgument, "clone_model: ", what, " '", item.key(), "' shape ", item.value().sizes(),
               " vs ", dst->sizes());
    // set_data keeps the copy's Variable (registered in its module) but gives it fresh storage on
    // the source's device and dtype.
    dst->set_data(item.value().detach().clone());
  }
}

}  // namespace

void copy_state(const torch::nn::Module& src, torch::nn::Module& dst) {
  torch::NoGradGuard no_grad;
  auto dst_params = dst.named_parameters(true);
  copy_dict(src.named_parameters(true), dst_params, "parameter");
  for (const auto& item : src.named_parameters(true))
    dst_params[item.key()].set_requires_grad(item.value().requires_grad());
  auto dst_buffers = dst.named_buffers(true);
  copy_dict(src.named_buffers(true), dst_buffers, "buffer");
  dst.train(src.is_training());
}

}  // namespace gz::train::model_detail
