// guozhuang._C: the process group class and its creator for torch.distributed.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>  // c10::intrusive_ptr as a pybind11 holder

#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "process_group.h"

namespace py = pybind11;
using gz::python::GzBackendBase;
using gz::python::GzGroupOptions;
using gz::python::ProcessGroupGz;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Guozhuang's torch.distributed backend \"gz\" (CPU tensors over gz::comm::Communicator)";
  // The c10d base classes (ProcessGroup / Backend, Store) are registered by torch.
  py::module::import("torch.distributed");

  // gz::Error and subclasses (TimeoutError, PeerError, Aborted, ...) derive from
  // std::runtime_error: pybind11 raises them as RuntimeError with our message.
  py::class_<ProcessGroupGz, GzBackendBase, c10::intrusive_ptr<ProcessGroupGz>>(m, "ProcessGroupGz")
      .def(py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& backend) {
             GzGroupOptions o;
             o.backend = backend;
             if (timeout.count() > 0) o.timeout = timeout;
             return c10::make_intrusive<ProcessGroupGz>(store, rank, size, o);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("backend") = "auto",
           py::call_guard<py::gil_scoped_release>(),
           "Collective over `size` ranks: rendezvous through torch's store and connect our communicator.")
      .def_property_readonly("comm_backend", &ProcessGroupGz::commBackend,
                             "The communicator's backend: shm, gloo, mpi, hier(shm+gloo), ...")
      .def("abort", &ProcessGroupGz::abortGroup, py::arg("reason") = "aborted by the user",
           py::call_guard<py::gil_scoped_release>(),
           "Fail every queued and running op (gz::Aborted) and every later one.");

  m.def("available_backends", &gz::comm::available_backends, "Communicator backends compiled in.");
  m.attr("torch_backend_api") = gz::python::kTorchBackendApi;
}
