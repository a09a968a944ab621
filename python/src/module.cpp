// guozhuang._C: the "gz" process group and its creator for torch.distributed, the launcher
// environment as torch's env:// expects it, and the Horovod-mode core (horovod.cpp).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>  // c10::intrusive_ptr as a pybind11 holder

#include <map>
#include <tuple>

#include "bucket_allocator.h"
#include "gz/comm/factory.h"
#include "gz/core/env.h"
#include "gz/store/rendezvous.h"
#include "gz_store.h"
#include "horovod.h"
#include "process_group.h"
#include "recovery.h"

namespace py = pybind11;
using gz::python::GzBackendBase;
using gz::python::GzGroupOptions;
using gz::python::ProcessGroupGz;

namespace {

// torch's env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT only. Under mpirun or srun
// the launcher names them differently: what our rendezvous detects, under torch's names.
std::map<std::string, std::string> launcher_env() {
  const gz::WorldInfo w = gz::detect_world(gz::Env::from_process());
  std::map<std::string, std::string> env;
  if (w.launcher == "single") return env;
  env["RANK"] = std::to_string(w.rank);
  env["WORLD_SIZE"] = std::to_string(w.world_size);
  env["LOCAL_RANK"] = std::to_string(w.local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(w.local_world_size);
  env["MASTER_ADDR"] = w.master_addr;
  if (w.master_port > 0) env["MASTER_PORT"] = std::to_string(w.master_port);
  env["GZ_DETECTED_LAUNCHER"] = w.launcher;
  return env;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() =
      "Guozhuang's torch.distributed backend \"gz\" (CPU tensors over gz::comm::Communicator) and the "
      "Horovod-mode core of guozhuang.torch";
  // The c10d base classes (ProcessGroup / Backend, Store, Work) are registered by torch.
  py::module::import("torch.distributed");

  // gz::Error and its subclasses derive from std::runtime_error: pybind11 raises them as
  // RuntimeError with our message; PeerError, TimeoutError and Aborted from _C's own functions as
  // its subclass HorovodInternalError (recovery.cpp). torch's Work.wait() raises RuntimeError.
  py::class_<ProcessGroupGz, GzBackendBase, c10::intrusive_ptr<ProcessGroupGz>>(m, "ProcessGroupGz")
      .def(py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& backend) {
             GzGroupOptions o;
             o.backend = backend;
             if (timeout.count() > 0) o.timeout = timeout;
             return c10::make_intrusive<ProcessGroupGz>(store, rank, size, o);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("backend") = "auto", py::call_guard<py::gil_scoped_release>(),
           "Collective over `size` ranks: rendezvous through torch's store and connect our communicator.")
      .def_property_readonly("comm_backend", &ProcessGroupGz::commBackend,
                             "The communicator's backend: shm, gloo, mpi, hier(shm+gloo), ...")
      .def_property_readonly("timeout", &ProcessGroupGz::timeout, "Default per-op timeout of the group.")
      .def("abort", &ProcessGroupGz::abortGroup, py::arg("reason") = "aborted by the user",
           py::call_guard<py::gil_scoped_release>(),
           "Fail every queued and running op (gz::Aborted) and every later one.");

  py::class_<gz::python::GzC10dStore, ::c10d::Store, c10::intrusive_ptr<gz::python::GzC10dStore>>(
      m, "Store",
      "Guozhuang's rendezvous store as a torch.distributed Store (init_process_group(store=...)).");
  m.def(
      "rendezvous_store",
      [](const std::string& init_method, std::chrono::milliseconds timeout) {
        auto r = gz::python::rendezvous_store(init_method, timeout);
        return std::make_tuple(r.store, r.rank, r.world_size);  // converted once the GIL is back
      },
      py::arg("init_method") = "env://", py::arg("timeout") = std::chrono::milliseconds(0),
      py::call_guard<py::gil_scoped_release>(),
      "(store, rank, world_size) by Guozhuang's rendezvous rules: gzrun's store, torchrun (MASTER_PORT+1), "
      "OpenMPI, PMI, SLURM, tcp://host:port, file:///path.");
  m.def("available_backends", &gz::comm::available_backends, "Communicator backends compiled in.");
  m.def("launcher_env", &launcher_env,
        "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR[, MASTER_PORT] as detected from gzrun, "
        "torchrun, OpenMPI, PMI or SLURM variables (empty for a lone process).");
  m.def(
      "_bucket_scope_enter",
      [](ProcessGroupGz& pg, size_t min_bytes) {
        gz::python::install_bucket_allocator();
        gz::python::set_bucket_scope(pg.communicator(), min_bytes);
      },
      py::arg("group"), py::arg("min_bytes"),
      "On this thread, CPU allocations of at least min_bytes come from the group's shared buffers "
      "(collective: open it around the same allocations on every rank).");
  m.def("_bucket_scope_exit", [] { gz::python::set_bucket_scope(nullptr, 0); });
  m.def("_shared_bucket_bytes", &gz::python::shared_bucket_bytes,
        "Bytes of DDP buckets placed in the groups' shared buffers so far.");
  m.attr("torch_backend_api") = gz::python::kTorchBackendApi;
  gz::python::bind_horovod(m);
  gz::python::bind_recovery(m);
}
