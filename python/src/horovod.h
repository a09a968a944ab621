// guozhuang._C's Horovod-mode bindings (see horovod.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace gz::python {

/// @brief Add the hvd_* functions, _Handle and _GradientAverager to the module.
void bind_horovod(pybind11::module& m);

}  // namespace gz::python
