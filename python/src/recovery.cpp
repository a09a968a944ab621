// guozhuang._C's part for in-place recovery (gzrun --recovery in-place): the errors that mean
// "a peer is lost" get a Python class of their own, so guozhuang.torch.elastic can tell them from
// every other failure, and the default group can be replaced by its next generation.
#include "recovery.h"

#include <pybind11/stl.h>

#include <exception>
#include <string>
#include <utility>

#include "gz/core/error.h"
#include "gz/torch/process_group.h"

namespace py = pybind11;

namespace gz::python {

void bind_recovery(py::module& m) {
  // Horovod's name, so `except hvd.HorovodInternalError` scripts work; a RuntimeError subclass,
  // so code that caught RuntimeError (what pybind11 raised for every gz::Error) still does.
  // Never freed: its Python object must outlive every translation, also at interpreter exit.
  static auto* lost = new py::exception<Error>(m, "HorovodInternalError", PyExc_RuntimeError);
  lost->doc() =
      "A peer was lost: gz::PeerError (it died), gz::TimeoutError (it stopped answering) or "
      "gz::Aborted (a survivor aborted the group). Under gzrun --recovery in-place, "
      "hvd.elastic.run recovers from it in place.";
  // The same three the C++ Trainer recovers from (src/train/recovery/in_place_recovery.cpp).
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PeerError& e) {
      (*lost)(e.what());
    } catch (const TimeoutError& e) {
      (*lost)(e.what());
    } catch (const Aborted& e) {
      (*lost)(e.what());
    }
  });
  // A rank that gzrun committed to a move while it withdrew from moves (gz::MovedError): never a
  // lost peer to recover from, and never the end of the job (hvd.elastic.run lets it through).
  static auto* moved = new py::exception<MovedError>(m, "MovedError", PyExc_RuntimeError);
  moved->doc() =
      "gzrun moved this rank to a new round (an elastic job's node lost or admitted) as it withdrew "
      "from moves (hvd_accept_moves(False)): it cannot follow the move and must fail, not exit 0.";
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const MovedError& e) {
      (*moved)(e.what());
    }
  });
  m.def("hvd_can_regroup", &can_regroup,
        "Whether hvd_regroup() can replace the default group (hvd.init() under gzrun --recovery "
        "in-place).");
  m.def(
      "hvd_accept_moves",
      [](bool on) {
        py::gil_scoped_release release;  // a withdrawal waits for gzrun's claim (the group's timeout)
        return accept_moves(on);
      },
      py::arg("on"),
      "Whether this process adopts a new rank and size when gzrun moves an elastic in-place job to "
      "a new round (gz::accept_moves): hvd.elastic.run says yes while it runs. False when the "
      "default group does not follow moves. hvd_accept_moves(False) may wait up to the group's "
      "timeout for gzrun's claim on this rank; raises MovedError when gzrun moved it meanwhile.");
  m.def(
      "hvd_regroup",
      [](const std::string& why) {
        py::gil_scoped_release release;  // waits for the replacements to start and join
        comm::CommPtr group = regroup(why);
        return std::make_pair(group->rank(), group->size());
      },
      py::arg("why"),
      "Abort the default group and join its next generation with the other survivors and the "
      "launcher's replacements (collective; the group's timeout). Returns (rank, size).");
}

}  // namespace gz::python
