// A set of tensors (a model's parameters and floating-point buffers) packed into one flat buffer
// per dtype, so averaging them is one all-reduce per dtype.
#pragma once

#include <torch/types.h>

#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/comm_stats.h"

namespace gz::averaging {

/// @brief The tensors to average: `params`, then the floating-point ones of `buffers` when
/// `with_buffers`. Parameters that are not floating-point are refused (gz::InvalidArgument).
std::vector<torch::Tensor> averaged_tensors(const std::vector<torch::Tensor>& params,
                                            const std::vector<torch::Tensor>& buffers, bool with_buffers);

class FlatTensors {
 public:
  /// @brief Collective: the flat buffers come from group.alloc_buffer (every rank, same sizes).
  FlatTensors(std::vector<torch::Tensor> tensors, comm::Communicator& group);

  /// @brief Copy the tensors into the flat buffers.
  void pack();
  /// @brief Copy the flat buffers back into the tensors.
  void unpack();
  /// @brief tensors += flat, tensor by tensor (flat holding a correction).
  void add_to_tensors();
  /// @brief In place: every flat buffer becomes its average over the group (one all-reduce each).
  void allreduce_avg(comm::Communicator& group, CommStats* stats);

  const std::vector<torch::Tensor>& flats() const { return flats_; }

 private:
  struct Entry {
    torch::Tensor tensor;
    size_t flat;
    int64_t offset;
  };
  std::vector<Entry> entries_;
  std::vector<torch::Tensor> flats_;
};

}  // namespace gz::averaging
