// Tensor collectives over a group (nullptr = the default group of gz::init()).
#pragma once

#include <torch/types.h>

#include <vector>

#include "gz/comm/communicator.h"
#include "gz/comm/types.h"

namespace gz {

/// @brief In place: tensor becomes the reduction over the group's ranks.
void allreduce(const torch::Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::sum,
               const comm::CommPtr& group = nullptr);
/// @brief In place: every rank gets root's tensor.
void broadcast(const torch::Tensor& tensor, int root = 0, const comm::CommPtr& group = nullptr);
/// @brief One tensor per rank, in rank order (every rank passes the same shape).
std::vector<torch::Tensor> allgather(const torch::Tensor& tensor, const comm::CommPtr& group = nullptr);
/// @brief Every rank's tensor concatenated along dim 0 (shapes may differ in dim 0 only).
torch::Tensor allgather_cat(const torch::Tensor& tensor, const comm::CommPtr& group = nullptr);
/// @brief input's dim 0 is split into size() equal blocks; rank r gets the reduction of block r.
torch::Tensor reduce_scatter(const torch::Tensor& input, comm::ReduceOp op = comm::ReduceOp::sum,
                             const comm::CommPtr& group = nullptr);
/// @brief Every rank waits for every other.
void barrier(const comm::CommPtr& group = nullptr);

/// @brief Asynchronous forms: run in issue order on the group's progress thread; the tensors are
/// kept alive until the op completes. Results of allgather/reduce_scatter go into `out`.
comm::WorkPtr allreduce_async(const torch::Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::sum,
                              const comm::CommPtr& group = nullptr);
comm::WorkPtr broadcast_async(const torch::Tensor& tensor, int root = 0, const comm::CommPtr& group = nullptr);
/// @brief out must hold size() * tensor.numel() elements of tensor's dtype (dim 0 = ranks).
comm::WorkPtr allgather_async(const torch::Tensor& tensor, const torch::Tensor& out,
                              const comm::CommPtr& group = nullptr);
/// @brief out must hold input.numel() / size() elements.
comm::WorkPtr reduce_scatter_async(const torch::Tensor& input, const torch::Tensor& out,
                                   comm::ReduceOp op = comm::ReduceOp::sum,
                                   const comm::CommPtr& group = nullptr);

}  // namespace gz
