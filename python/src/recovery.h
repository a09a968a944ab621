// guozhuang._C's part for in-place recovery (see recovery.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace gz::python {

/// @brief Add HorovodInternalError (gz::PeerError, TimeoutError and Aborted raised from _C),
/// MovedError (gz::MovedError), hvd_can_regroup, hvd_accept_moves and hvd_regroup to the module.
void bind_recovery(pybind11::module& m);

}  // namespace gz::python
