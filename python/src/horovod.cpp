// guozhuang._C's Horovod-mode part: the default group (gz::init), asynchronous tensor collectives
// with handles, and the gradient averager behind guozhuang.torch.DistributedOptimizer (our
// gz::DistributedOptimizer without an optimizer: the Python optimizer steps itself).
#include "horovod.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor <-> torch.Tensor

#include <memory>

#include "gz/comm/types.h"
#include "gz/core/error.h"
#include "gz/torch/collectives.h"
#include "gz/torch/distributed_optimizer.h"
#include "gz/torch/process_group.h"

namespace py = pybind11;

namespace gz::python {

namespace {

/// An asynchronous op of the default group and the tensor it produces.
struct Handle {
  comm::WorkPtr work;
  std::shared_ptr<at::Tensor> result;
  /// Blocks (without the GIL) until the op finished; rethrows its failure.
  at::Tensor wait() {
    {
      py::gil_scoped_release release;
      work->wait();
    }
    return *result;
  }
  bool done() const { return work->is_completed(); }
};

Compression parse_compression(const std::string& c) {
  if (c == "none") return Compression::none;
  if (c == "fp16") return Compression::fp16;
  if (c == "bf16") return Compression::bf16;
  GZ_THROW(InvalidArgument, "guozhuang.torch: unknown compression '", c, "' (none, fp16, bf16)");
}

std::unique_ptr<DistributedOptimizer> make_averager(
    const std::vector<std::pair<std::string, at::Tensor>>& named, const std::string& compression,
    int backward_passes_per_step) {
  NamedParameters params(named.begin(), named.end());
  DistributedOptimizerOptions o;
  o.compression = parse_compression(compression);
  o.backward_passes_per_step = backward_passes_per_step;
  py::gil_scoped_release release;  // collective: allocates the shared fusion buffer and arena
  return std::make_unique<DistributedOptimizer>(nullptr, std::move(params), o);
}

}  // namespace

void bind_horovod(py::module& m) {
  m.def(
      "hvd_init",
      [](const std::string& backend, double timeout_s) {
        if (is_initialized()) return false;
        ProcessGroupOptions o;
        o.backend = backend;
        if (timeout_s > 0)
          o.timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout_s));
        py::gil_scoped_release release;
        init(o);
        return true;
      },
      py::arg("backend") = "auto", py::arg("timeout_s") = 0.0,
      "Rendezvous from the launcher's environment and build the default group; False if it exists.");
  m.def("hvd_shutdown", [] {
    py::gil_scoped_release release;
    shutdown();
  });
  m.def("hvd_is_initialized", &is_initialized);
  m.def("hvd_rank", [] { return rank(); });
  m.def("hvd_size", [] { return size(); });
  m.def("hvd_local_rank", [] { return local_rank(); });
  m.def("hvd_local_size", [] { return local_size(); });
  m.def("hvd_comm_backend", [] { return default_group()->backend(); });

  py::class_<Handle>(m, "_Handle", "An asynchronous op of the default group (Horovod's handle).")
      .def("wait", &Handle::wait, "Block until done; the result tensor. Rethrows the op's failure.")
      .def("done", &Handle::done, "Whether the op finished (never blocks).");

  m.def(
      "hvd_allreduce_async",
      [](const at::Tensor& t, const std::string& op) {
        auto h = Handle{allreduce_async(t, comm::parse_reduce_op(op)), std::make_shared<at::Tensor>(t)};
        return h;
      },
      py::arg("tensor"), py::arg("op"), "In place on `tensor` (CPU): sum, avg, min, max or prod over ranks.");
  m.def(
      "hvd_broadcast_async",
      [](const at::Tensor& t, int root) {
        return Handle{broadcast_async(t, root), std::make_shared<at::Tensor>(t)};
      },
      py::arg("tensor"), py::arg("root"), "In place on `tensor`: every rank gets root's.");
  m.def(
      "hvd_allgather_async",
      [](const at::Tensor& t) {
        auto g = default_group();
        auto out = std::make_shared<at::Tensor>();
        auto work = g->submit([t, out, g] { *out = allgather_cat(t, g); });
        return Handle{work, out};
      },
      py::arg("tensor"), "Every rank's tensor concatenated along dim 0 (dim 0 may differ between ranks).");
  m.def(
      "hvd_barrier",
      [] {
        py::gil_scoped_release release;
        barrier();
      },
      "Every rank of the default group waits for every other.");

  py::class_<DistributedOptimizer>(
      m, "_GradientAverager", "Averages gradients by name as backward produces them (Horovod mode core).")
      .def(py::init(&make_averager), py::arg("named_parameters"), py::arg("compression") = "none",
           py::arg("backward_passes_per_step") = 1)
      .def("synchronize", &DistributedOptimizer::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Wait until every gradient of this step is averaged.")
      .def("submit_zeros", &DistributedOptimizer::submit_zeros, py::call_guard<py::gil_scoped_release>(),
           "This rank has no batch this step (join): zero gradients, submitted now.")
      .def_property_readonly("last_step_replayed", &DistributedOptimizer::last_step_replayed)
      .def_property_readonly("last_cycles", &DistributedOptimizer::last_cycles);
}

}  // namespace gz::python
