#include "gz/torch/fused_dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>

#include "gz/core/error.h"
#include "torch/fused/kernels.h"

namespace gz {
namespace {

uint64_t draw_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

// Applies the (seed, p) mask to a contiguous float tensor: forward on the input, backward on the
// incoming gradient (d(x * mask * scale)/dx = mask * scale).
torch::Tensor apply_mask(const torch::Tensor& x, uint64_t seed, uint32_t threshold, float scale) {
  auto in = x.contiguous();
  auto out = torch::empty_like(in, torch::MemoryFormat::Contiguous);
  const float* ip = in.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, in.numel(), 1 << 16, [&](int64_t b, int64_t e) {
    fused::dropout_f32(ip + b, op + b, static_cast<size_t>(e - b), static_cast<uint64_t>(b), seed, threshold,
                       scale);
  });
  return out;
}

struct FusedDropoutFn : public torch::autograd::Function<FusedDropoutFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, double p) {
    const uint64_t seed = draw_seed();
    const auto threshold = static_cast<uint32_t>(std::llround(p * double(1 << 24)));
    const auto scale = static_cast<float>(1.0 / (1.0 - p));
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["threshold"] = static_cast<int64_t>(threshold);
    ctx->saved_data["scale"] = static_cast<double>(scale);
    return apply_mask(x, seed, threshold, scale);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const auto threshold = static_cast<uint32_t>(ctx->saved_data["threshold"].toInt());
    const auto scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    return {apply_mask(grads[0], seed, threshold, scale), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_dropout(const torch::Tensor& input, double p, bool training) {
  GZ_CHECK_ARG(p >= 0 && p <= 1, "fused_dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0) return input;
  if (p == 1 || input.scalar_type() != torch::kFloat || !input.device().is_cpu() ||
      input.layout() != torch::kStrided)
    return torch::dropout(input, p, training);
  return FusedDropoutFn::apply(input, p);
}

}  // namespace gz
