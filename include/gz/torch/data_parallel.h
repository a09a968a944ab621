// Single-process data parallelism over several devices (CPU replicas allowed) with persistent
// replicas: cloned once, re-synchronised by copying parameters, never re-cloned.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

namespace gz {

/// @brief Options of DataParallel.
struct DataParallelOptions {
  /// @brief One replica per device; devices[0] holds the master module (and the gathered output).
  /// Empty = two CPU replicas.
  std::vector<torch::Device> devices;
  /// @brief Batch dimension to scatter along and gather on.
  int64_t dim = 0;
};

/// @brief Runs one module on several devices in parallel threads of one process.
///
/// Replica 0 is the master module itself; the others are made once by the clone function. Each
/// forward() copies the master's parameters and buffers into the replicas (cheap, no re-clone),
/// scatters the batch, runs the replicas in parallel threads and gathers the outputs. After
/// loss.backward(), reduce_gradients() adds the replicas' gradients into the master's, so the
/// master's optimizer steps exactly like single-process training on the whole batch.
/// @code
///   gz::DataParallel dp(net.ptr(), [](const torch::nn::Module& m, torch::Device d) { ... clone ... },
///                       [](torch::nn::Module& m, const torch::Tensor& x) { return static_cast<Net&>(m).forward(x); });
///   auto loss = loss_fn(dp.forward(x), y); loss.backward(); dp.reduce_gradients(); opt.step();
/// @endcode
class DataParallel {
 public:
  using CloneFn = std::function<std::shared_ptr<torch::nn::Module>(const torch::nn::Module& master,
                                                                    const torch::Device& device)>;
  using ForwardFn = std::function<torch::Tensor(torch::nn::Module& replica, const torch::Tensor& input)>;

  /// @brief An empty clone function uses torch::nn::Module::clone(device) (Cloneable modules).
  DataParallel(std::shared_ptr<torch::nn::Module> module, CloneFn clone, ForwardFn forward,
               DataParallelOptions options = {});
  ~DataParallel();

  /// @brief Scatter, run every replica in its own thread, gather on devices[0].
  torch::Tensor forward(const torch::Tensor& input);
  /// @brief Add every replica's gradients into the master's and zero the replicas' gradients.
  void reduce_gradients();
  /// @brief Copy the master's parameters and buffers into the replicas (forward() does it too).
  void sync_replicas();

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  size_t num_replicas() const { return replicas_.size(); }
  /// @brief Replica i (0 = master).
  const std::shared_ptr<torch::nn::Module>& replica(size_t i) const { return replicas_.at(i); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  ForwardFn forward_;
  DataParallelOptions options_;
  std::vector<std::shared_ptr<torch::nn::Module>> replicas_;
  std::vector<std::vector<torch::Tensor>> params_;   // per replica, same order
  std::vector<std::vector<torch::Tensor>> buffers_;  // per replica, same order
};

}  // namespace gz
