// The one place that knows which c10d base class a plugin backend derives from.
//
// LibTorch 1.x: torch.distributed's plugin creator returns a c10d::ProcessGroup, and
// ProcessGroup is the class with the virtual collectives.
// LibTorch 2.x: ProcessGroup became a dispatcher over c10d::Backend objects; a plugin creator
// returns a c10d::Backend (same virtuals, same Work/Options types), which torch wraps.
// Everything else in this package is written against GzBackendBase and compiles for both.
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
namespace gz::python {
using GzBackendBase = ::c10d::Backend;
inline constexpr bool kTorchBackendApi = true;  // creator returns c10d::Backend
}  // namespace gz::python
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
namespace gz::python {
using GzBackendBase = ::c10d::ProcessGroup;
inline constexpr bool kTorchBackendApi = false;  // creator returns c10d::ProcessGroup
}  // namespace gz::python
#endif
