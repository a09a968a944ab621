// Transitional: the reduce functions moved to comm/reduce/reduce.h (shared by every backend).
// Only hierarchical.cpp still includes this file; it is being changed on a parallel branch, so it
// keeps its include until that merges. Then switch it to comm/reduce/reduce.h and delete this.
#pragma once

#include "comm/reduce/reduce.h"

namespace gz::comm::gloo_impl {
using reduce::divide_in_place;
using reduce::make_reduce_fn;
}  // namespace gz::comm::gloo_impl
