// All-reduce (sum) of sparse COO tensors, as Gloo offers it (DDP with sparse embedding gradients).
#pragma once

#include <ATen/ATen.h>

#include "gz/comm/communicator.h"

namespace gz::python {

/// @brief The sum over ranks of every rank's sparse COO tensor `t` (same sizes everywhere),
/// coalesced: each rank's indices and values are all-gathered and summed locally.
at::Tensor sparse_allreduce_sum(comm::Communicator& c, const at::Tensor& t, const comm::OpOptions& o);

}  // namespace gz::python
