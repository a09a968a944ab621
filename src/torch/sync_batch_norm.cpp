#include "gz/torch/sync_batch_norm.h"

#include <torch/autograd.h>

#include "gz/core/error.h"
#include "gz/torch/process_group.h"
#include "gz/torch/tensor_adapter.h"

namespace gz {

namespace {

// All-reduce (sum) a small contiguous tensor in place.
void allreduce_sum(comm::Communicator& g, torch::Tensor& t) {
  g.allreduce(t.data_ptr(), static_cast<size_t>(t.numel()), to_dtype(t.scalar_type(), "SyncBatchNorm"),
              comm::ReduceOp::sum);
}

// Reduce dims: all but channel dim 1; shape to broadcast a [C] vector over the input.
std::vector<int64_t> reduce_dims(const torch::Tensor& x) {
  std::vector<int64_t> d{0};
  for (int64_t i = 2; i < x.dim(); ++i) d.push_back(i);
  return d;
}
std::vector<int64_t> bshape(const torch::Tensor& x) {
  std::vector<int64_t> s(x.dim(), 1);
  s[1] = x.size(1);
  return s;
}

// Normalisation with global statistics; backward all-reduces sum(dy) and sum(dy * xhat).
class SyncBNFunction : public torch::autograd::Function<SyncBNFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               torch::Tensor bias, torch::Tensor mean, torch::Tensor invstd, double count,
                               int64_t group_ptr) {
    auto bs = bshape(x);
    auto xhat = (x - mean.view(bs)) * invstd.view(bs);
    auto y = weight.defined() && weight.numel() ? xhat * weight.view(bs) + bias.view(bs) : xhat;
    ctx->save_for_backward({xhat, invstd, weight});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = group_ptr;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto xhat = saved[0], invstd = saved[1], weight = saved[2];
    const double count = ctx->saved_data["count"].toDouble();
    auto* g = reinterpret_cast<comm::Communicator*>(ctx->saved_data["group"].toInt());
    auto dy = grads[0].contiguous();
    auto dims = reduce_dims(dy);
    auto bs = bshape(dy);
    const int64_t c = dy.size(1);
    auto local_dbias = dy.sum(dims);
    auto local_dweight = (dy * xhat).sum(dims);
    auto sums = torch::cat({local_dbias, local_dweight}).to(torch::kDouble).contiguous();
    allreduce_sum(*g, sums);
    auto sum_dy = sums.narrow(0, 0, c).to(dy.scalar_type());
    auto sum_dy_xhat = sums.narrow(0, c, c).to(dy.scalar_type());
    const bool affine = weight.defined() && weight.numel();
    auto w = affine ? weight : torch::ones({c}, dy.options());
    auto dx = (dy - (sum_dy / count).view(bs) - xhat * (sum_dy_xhat / count).view(bs)) * (invstd * w).view(bs);
    // Weight and bias gradients are local: DDP averages them like any other parameter's.
    return {dx, affine ? local_dweight : torch::Tensor(), affine ? local_dbias : torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_, comm::CommPtr group_)
    : options(options_), group(std::move(group_)) {
  reset();
}

void SyncBatchNormImpl::reset() {
  GZ_CHECK_ARG(options.num_features > 0, "num_features = ", options.num_features);
  if (options.affine) {
    weight = register_parameter("weight", torch::ones({options.num_features}));
    bias = register_parameter("bias", torch::zeros({options.num_features}));
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", torch::zeros({options.num_features}));
    running_var = register_buffer("running_var", torch::ones({options.num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  }
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features)
    GZ_THROW(InvalidArgument, "SyncBatchNorm: expected input [N, ", options.num_features, ", ...], got ",
             input.sizes());
  if (!is_training() && options.track_running_stats)
    return torch::batch_norm(input, weight, bias, running_mean, running_var, false, 0.0, options.eps, false);
  auto g = resolve_group(group);
  const int64_t c = options.num_features;
  auto dims = reduce_dims(input);
  torch::Tensor mean, var, invstd;
  double total = 0;
  {
    torch::NoGradGuard no_grad;
    // One all-reduce of [sum, sum of squares, count] in double (stable for large counts).
    auto x = input.to(torch::kDouble);
    auto local = torch::cat({x.sum(dims), (x * x).sum(dims),
                             torch::full({1}, static_cast<double>(input.numel() / c), x.options())})
                     .contiguous();
    allreduce_sum(*g, local);
    total = local[2 * c].item<double>();
    if (total < 1) GZ_THROW(InvalidArgument, "SyncBatchNorm: empty batch on every rank");
    auto m = local.narrow(0, 0, c) / total;
    auto v = (local.narrow(0, c, c) / total - m * m).clamp_min(0);
    if (options.track_running_stats) {
      const double unbias = total > 1 ? total / (total - 1) : 1.0;
      running_mean.mul_(1 - options.momentum).add_(m.to(running_mean.scalar_type()), options.momentum);
      running_var.mul_(1 - options.momentum).add_((v * unbias).to(running_var.scalar_type()), options.momentum);
      num_batches_tracked.add_(1);
    }
    mean = m.to(input.scalar_type());
    invstd = (v + options.eps).rsqrt().to(input.scalar_type());
  }
  torch::Tensor w = options.affine ? weight : torch::Tensor();
  torch::Tensor b = options.affine ? bias : torch::Tensor();
  return SyncBNFunction::apply(input, w, b, mean, invstd, total, reinterpret_cast<int64_t>(g.get()));
}

std::shared_ptr<SyncBatchNormImpl> SyncBatchNormImpl::from_batch_norm(const torch::nn::BatchNorm2dImpl& bn,
                                                                      comm::CommPtr group) {
  SyncBatchNormOptions o(bn.options.num_features());
  o.eps = bn.options.eps();
  o.momentum = bn.options.momentum().value_or(0.1);
  o.affine = bn.options.affine();
  o.track_running_stats = bn.options.track_running_stats();
  auto s = std::make_shared<SyncBatchNormImpl>(o, std::move(group));
  torch::NoGradGuard no_grad;
  if (o.affine) {
    s->weight.copy_(bn.weight);
    s->bias.copy_(bn.bias);
  }
  if (o.track_running_stats) {
    s->running_mean.copy_(bn.running_mean);
    s->running_var.copy_(bn.running_var);
    s->num_batches_tracked.copy_(bn.num_batches_tracked);
  }
  s->train(bn.is_training());
  return s;
}

torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& seq, comm::CommPtr group) {
  torch::nn::Sequential out;
  auto names = seq->named_children().keys();  // registration order = the AnyModules' order
  size_t i = 0;
  for (const auto& any : *seq) {
    auto child = any.ptr();
    const std::string name = i < names.size() ? names[i] : std::to_string(i);
    ++i;
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(child)) {
      out->push_back(name, SyncBatchNormImpl::from_batch_norm(*bn, group));
    } else {
      out->push_back(name, any);  // the same module object, with its forward
    }
  }
  return out;
}

}  // namespace gz
