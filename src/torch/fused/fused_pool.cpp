#include "gz/torch/fused_pool.h"

#include <ATen/Parallel.h>
#include <c10/util/accumulate.h>
#include <torch/torch.h>

#include "torch/fused/kernels.h"

namespace gz {
namespace {

// An input of `sizes` seen as planes of h x w, each pooled to (h/2) x (w/2); `fn(first, count)`
// runs over ranges of planes on LibTorch's intra-op threads, ~64 Ki input elements per task.
struct Planes {
  int64_t h, w, count, out;
  explicit Planes(c10::IntArrayRef sizes)
      : h(sizes[sizes.size() - 2]),
        w(sizes[sizes.size() - 1]),
        count(h * w == 0 ? 0 : c10::multiply_integers(sizes) / (h * w)),
        out((h / 2) * (w / 2)) {}
  template <typename Fn>
  void parallel(Fn&& fn) const {
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, h * w));
    at::parallel_for(0, count, grain, [&](int64_t b, int64_t e) { fn(b, static_cast<size_t>(e - b)); });
  }
};

struct MaxPoolReluFn : public torch::autograd::Function<MaxPoolReluFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    auto in = x.contiguous();
    const Planes pl(in.sizes());
    auto out_sizes = in.sizes().vec();
    out_sizes[out_sizes.size() - 2] = pl.h / 2;
    out_sizes[out_sizes.size() - 1] = pl.w / 2;
    auto y = torch::empty(out_sizes, in.options());
    auto arg = torch::empty(out_sizes, in.options().dtype(torch::kUInt8));
    const float* xp = in.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    uint8_t* ap = arg.data_ptr<uint8_t>();
    pl.parallel([&](int64_t b, size_t n) {
      fused::maxpool2x2_relu_fwd(xp + b * pl.h * pl.w, yp + b * pl.out, ap + b * pl.out, n, pl.h, pl.w);
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
    const Planes pl(sizes);
    const float* gyp = gy.data_ptr<float>();
    const uint8_t* ap = arg.data_ptr<uint8_t>();
    float* gxp = gx.data_ptr<float>();
    pl.parallel([&](int64_t b, size_t n) {
      fused::maxpool2x2_relu_bwd(gyp + b * pl.out, ap + b * pl.out, gxp + b * pl.h * pl.w, n, pl.h, pl.w);
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
