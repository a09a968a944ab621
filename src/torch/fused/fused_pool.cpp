#include "gz/torch/fused_pool.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "torch/fused/kernels.h"

namespace gz {
namespace {

struct MaxPoolReluFn : public torch::autograd::Function<MaxPoolReluFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    auto in = x.contiguous();
    const int64_t h = in.size(-2), w = in.size(-1);
    const int64_t planes = h * w == 0 ? 0 : in.numel() / (h * w);
    auto out_sizes = in.sizes().vec();
    out_sizes[out_sizes.size() - 2] = h / 2;
    out_sizes[out_sizes.size() - 1] = w / 2;
    auto y = torch::empty(out_sizes, in.options());
    auto arg = torch::empty(out_sizes, in.options().dtype(torch::kUInt8));
    const float* xp = in.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    uint8_t* ap = arg.data_ptr<uint8_t>();
    const int64_t out_plane = (h / 2) * (w / 2);
    // Grain: enough planes for ~64 Ki input elements per task.
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, h * w));
    at::parallel_for(0, planes, grain, [&](int64_t b, int64_t e) {
      fused::maxpool2x2_relu_fwd(xp + b * h * w, yp + b * out_plane, ap + b * out_plane,
                                 static_cast<size_t>(e - b), static_cast<size_t>(h), static_cast<size_t>(w));
    });
    ctx->save_for_backward({arg});
    ctx->saved_data["sizes"] = in.sizes();
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto arg = ctx->get_saved_variables()[0];
    auto sizes = ctx->saved_data["sizes"].toIntVector();
    auto gy = grads[0].contiguous();
    auto gx = torch::empty(sizes, gy.options());
    const int64_t h = sizes[sizes.size() - 2], w = sizes[sizes.size() - 1];
    const int64_t planes = h * w == 0 ? 0 : gx.numel() / (h * w);
    const int64_t out_plane = (h / 2) * (w / 2);
    const float* gyp = gy.data_ptr<float>();
    const uint8_t* ap = arg.data_ptr<uint8_t>();
    float* gxp = gx.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, h * w));
    at::parallel_for(0, planes, grain, [&](int64_t b, int64_t e) {
      fused::maxpool2x2_relu_bwd(gyp + b * out_plane, ap + b * out_plane, gxp + b * h * w,
                                 static_cast<size_t>(e - b), static_cast<size_t>(h), static_cast<size_t>(w));
    });
    return {gx};
  }
};

}  // namespace

torch::Tensor max_pool2d_relu(const torch::Tensor& x) {
  const bool fused = x.scalar_type() == torch::kFloat && x.device().is_cpu() &&
                     x.layout() == torch::kStrided && (x.dim() == 3 || x.dim() == 4) && x.size(-2) >= 2 &&
                     x.size(-1) >= 2;
  if (!fused) return torch::relu(torch::max_pool2d(x, 2));
  return MaxPoolReluFn::apply(x);
}

}  // namespace gz
