#include "process_group.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>  // the interpreter lock, released while tearing down

#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "process_group_util.h"
#include "reduce_plan.h"
#include "sparse_allreduce.h"
#include "store_adapter.h"

namespace gz::python {

using ::c10d::OpType;
using gz::comm::Communicator;
using gz::comm::OpOptions;
using WorkRef = c10::intrusive_ptr<::c10d::Work>;

namespace {
// torch's own backends and launchers say "Timed out" (gloo, TCPStore, torchelastic), and scripts
// and tools look for it; our timeouts say which rank was missing and how long was waited.
std::exception_ptr for_torch(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const gz::TimeoutError& t) {
    return std::make_exception_ptr(
        gz::TimeoutError(std::string("gz backend: Timed out (") + t.what() + ")", t.peer(), e));
  } catch (...) {
    return e;
  }
}
}  // namespace

// ---- GzWork ----

GzWork::GzWork(int rank, OpType type, const char* profiling_title, std::vector<at::Tensor> outputs)
    : ::c10d::Work(rank, type, profiling_title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool GzWork::complete(std::exception_ptr error) {
  if (completed_.exchange(true)) return false;
  finish(error);  // c10d's own state; ends the profiler range opened by the constructor
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
  return true;
}

bool GzWork::isCompleted() { return work_ ? work_->is_completed() : completed_.load(); }

bool GzWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr GzWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

bool GzWork::wait(std::chrono::milliseconds timeout) {
  try {
    if (timeout.count() > 0)
      work_->wait(Deadline::after(std::chrono::duration_cast<Duration>(timeout)));
    else
      work_->wait();
  } catch (const gz::TimeoutError& e) {
    if (std::string(e.what()).rfind("gz backend: Timed out", 0) == 0) throw;
    std::rethrow_exception(for_torch(std::current_exception()));
  }
  return true;
}

void GzWork::abort() {
  TORCH_CHECK(false,
              "gz backend: Work.abort() is not supported; every op ends by its own deadline "
              "(guozhuang.abort(group) aborts a whole group)");
}

int GzWork::sourceRank() const {
  TORCH_CHECK(source_rank_ >= 0, "gz backend: sourceRank() is only defined for recv");
  return source_rank_;
}

// ---- ProcessGroupGz ----

ProcessGroupGz::ProcessGroupGz(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                               GzGroupOptions options)
    : GzBackendBase(rank, size), options_(std::move(options)) {
  TORCH_CHECK(store, "gz backend: no store");
  gz::comm::CommOptions co;
  co.backend = options_.backend;
  co.rank = rank;
  co.size = size;
  co.timeout = std::chrono::duration_cast<Duration>(options_.timeout);
  store_ = std::make_shared<C10dStoreAdapter>(store);
  store_->set_timeout(co.timeout);
  co.store = store_;
  comm_ = gz::comm::create_communicator(co);
  links_ = std::make_unique<P2PLinks>(store_, rank, options_.backend, co.timeout);
}

ProcessGroupGz::~ProcessGroupGz() {
  // Destroying the links and the communicator aborts what is still pending and joins their
  // threads; ops dropped from a queue fail their futures (see enqueue), so nothing waits forever.
  // Those threads may free the last reference to a Python tensor, which takes the interpreter
  // lock: never join them while holding it (torch drops groups with it held).
  auto teardown = [this] {
    links_.reset();
    comm_.reset();
  };
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    teardown();
  } else {
    teardown();
  }
}

void ProcessGroupGz::abortGroup(const std::string& reason) {
  links_->abort(reason);
  comm_->abort(reason);
}

OpOptions ProcessGroupGz::issue(std::chrono::milliseconds timeout, int tag) const {
  OpOptions o;
  // c10d's options say "unset" with a negative timeout (kUnsetTimeout); zero is a real one.
  o.deadline = Deadline::after(timeout.count() >= 0 ? std::chrono::duration_cast<Duration>(timeout)
                                                    : comm_->timeout());
  o.tag = tag;
  return o;
}

namespace {
// Held by a queued op: when the op is dropped without running (its group aborted or destroyed),
// the last copy's destructor fails the future, so DDP's reducer and fut.wait() never hang.
struct DropGuard {
  explicit DropGuard(c10::intrusive_ptr<GzWork> w) : work(std::move(w)) {}
  DropGuard(const DropGuard&) = delete;
  DropGuard& operator=(const DropGuard&) = delete;
  c10::intrusive_ptr<GzWork> work;
  ~DropGuard() {
    work->complete(std::make_exception_ptr(
        gz::Aborted("gz backend: op dropped before it ran (its process group was aborted or destroyed)")));
  }
};
}  // namespace

c10::intrusive_ptr<GzWork> ProcessGroupGz::enqueue(OpType type, const char* title,
                                                   std::vector<at::Tensor> outputs, const OpOptions& o,
                                                   Body body, int p2p_peer, bool sending) {
  auto work = c10::make_intrusive<GzWork>(getRank(), type, title, std::move(outputs));
  auto guard = std::make_shared<DropGuard>(work);
  auto run = [body = std::move(body), guard](Communicator& c, const OpOptions& opts) {
    try {
      body(c, opts);
    } catch (...) {
      auto e = for_torch(std::current_exception());
      guard->work->complete(e);
      std::rethrow_exception(e);  // our Work fails too: wait() rethrows it
    }
    guard->work->complete(nullptr);
  };
  if (p2p_peer >= 0) {
    work->work_ = links_->submit(p2p_peer, sending, o, std::move(run));
  } else {
    ++seq_;  // at issue, in the caller's order: the order every rank issues collectives in
    Communicator* c = comm_.get();
    work->work_ = comm_->submit([c, o, run = std::move(run)] { run(*c, o); }, o);
  }
  return work;
}

WorkRef ProcessGroupGz::broadcast(std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "gz backend: broadcast root ", opts.rootRank,
              " out of range [0, ", getSize(), ")");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::BROADCAST, "gz:broadcast", tensors, issue(opts.timeout),
                 [t, root](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor buf = dense(t);
                   c.broadcast(buf.data_ptr(), nbytes(buf), kBytes, root, o);
                   write_back(t, buf);
                 });
}

WorkRef ProcessGroupGz::allreduce(std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "gz backend: allreduce takes exactly one tensor per process (got ",
              tensors.size(), ")");
  if (tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse(tensors, opts);
  check_one(tensors, "allreduce");
  const ReducePlan plan = plan_reduction(tensors[0], opts.reduceOp, "allreduce");
  at::Tensor t = tensors[0];
  return enqueue(OpType::ALLREDUCE, "gz:all_reduce", tensors, issue(opts.timeout),
                 [t, plan](Communicator& c, const OpOptions& o) mutable {
                   // DDP's buckets are contiguous: reduced where they are, no copies.
                   at::Tensor buf = dense(t);
                   allreduce_planned(c, buf, plan, o);
                   write_back(t, buf);
                 });
}

WorkRef ProcessGroupGz::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                         const ::c10d::AllreduceOptions& opts) {
  at::Tensor t = tensors[0];
  TORCH_CHECK(t.device().is_cpu(), "gz backend: allreduce supports CPU tensors only, got a tensor on ",
              t.device());
  TORCH_CHECK(t.layout() == at::kSparse,
              "gz backend: allreduce supports dense and sparse COO tensors, got layout ", t.layout());
  TORCH_CHECK(static_cast<c10d::ReduceOp::RedOpType>(opts.reduceOp.op_) == c10d::ReduceOp::SUM,
              "gz backend: allreduce of sparse tensors supports ReduceOp.SUM only (as Gloo)");
  // The result has its own indices: it replaces the input (in place for the caller, and as the
  // future's value, which DDP's reducer takes for sparse gradients).
  auto work = enqueue(OpType::ALLREDUCE, "gz:all_reduce", tensors, issue(opts.timeout),
                      [t](Communicator& c, const OpOptions& o) mutable {
                        at::Tensor sum = sparse_allreduce_sum(c, t, o);
                        t.copy_(sum);
                      });
  return work;
}

WorkRef ProcessGroupGz::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                            const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "gz backend: allreduce_coalesced needs at least one tensor");
  check_same_dtype(tensors, "allreduce_coalesced");
  const ReducePlan plan = plan_reduction(tensors[0], opts.reduceOp, "allreduce_coalesced");
  std::vector<at::Tensor> ts = tensors;
  return enqueue(OpType::ALLREDUCE_COALESCED, "gz:all_reduce_coalesced", tensors, issue(opts.timeout),
                 [ts, plan](Communicator& c, const OpOptions& o) mutable {
                   // One all-reduce of the concatenation instead of one per tensor.
                   std::vector<at::Tensor> flat;
                   for (auto& t : ts) flat.push_back(t.reshape({-1}));
                   at::Tensor buf = at::cat(flat);
                   allreduce_planned(c, buf, plan, o);
                   int64_t off = 0;
                   for (auto& t : ts) {
                     t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
                     off += t.numel();
                   }
                 });
}

WorkRef ProcessGroupGz::reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "gz backend: reduce root ", opts.rootRank,
              " out of range [0, ", getSize(), ")");
  const ReducePlan plan = plan_reduction(tensors[0], opts.reduceOp, "reduce");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  return enqueue(OpType::REDUCE, "gz:reduce", tensors, issue(opts.timeout),
                 [t, plan, root, is_root](Communicator& c, const OpOptions& o) mutable {
                   // Our reduce leaves non-root buffers unspecified; torch's callers keep their input.
                   at::Tensor buf = is_root ? dense(t) : t.contiguous().clone();
                   reduce_planned(c, buf, plan, root, o);
                   if (is_root) write_back(t, buf);
                 });
}

WorkRef ProcessGroupGz::barrier(const ::c10d::BarrierOptions& opts) {
  return enqueue(OpType::BARRIER, "gz:barrier", {}, issue(opts.timeout),
                 [](Communicator& c, const OpOptions& o) { c.barrier(o); });
}

void ProcessGroupGz::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool /*waitAllRanks*/) {
  // A barrier within opts.timeout; its error names the (first) rank that did not arrive, in
  // Gloo's words. (torch 1.13's dist.monitored_barrier() accepts gloo groups only; this serves
  // group.monitored_barrier() and later torch versions.)
  Stopwatch sw;
  auto work = barrier(opts);
  try {
    work->wait();
  } catch (const gz::Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(sw.elapsed()).count();
    if (getRank() == 0 && e.peer() > 0)
      TORCH_CHECK(false, "Rank ", e.peer(), " failed to pass monitoredBarrier in ", ms, " ms (", e.what(),
                  ")");
    TORCH_CHECK(false, "Rank ", getRank(), " timed out in monitoredBarrier after ", ms, " ms (", e.what(),
                ")");
  }
}

WorkRef ProcessGroupGz::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  check_one(tensors, "send");
  TORCH_CHECK(dstRank >= 0 && dstRank < getSize() && dstRank != getRank(),
              "gz backend: send to invalid rank ", dstRank, " from rank ", getRank(), " of ", getSize());
  at::Tensor t = tensors[0];
  // On the link to dstRank, whose rank 1 is the receiver.
  return enqueue(
      OpType::SEND, "gz:send", tensors, issue(::c10d::kUnsetTimeout, tag),
      [t](Communicator& c, const OpOptions& o) {
        at::Tensor buf = dense(t);
        c.send(buf.data_ptr(), nbytes(buf), kBytes, 1, o);
      },
      dstRank, /*sending=*/true);
}

WorkRef ProcessGroupGz::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  check_one(tensors, "recv");
  TORCH_CHECK(srcRank >= 0 && srcRank < getSize() && srcRank != getRank(),
              "gz backend: recv from invalid rank ", srcRank, " on rank ", getRank(), " of ", getSize());
  at::Tensor t = tensors[0];
  // On the link from srcRank, whose rank 0 is the sender.
  auto work = enqueue(
      OpType::RECV, "gz:recv", tensors, issue(::c10d::kUnsetTimeout, tag),
      [t](Communicator& c, const OpOptions& o) mutable {
        at::Tensor buf = dense(t);
        c.recv(buf.data_ptr(), nbytes(buf), kBytes, 0, o);
        write_back(t, buf);
      },
      srcRank, /*sending=*/false);
  work->source_rank_ = srcRank;
  return work;
}

WorkRef ProcessGroupGz::recvAnysource(std::vector<at::Tensor>& /*tensors*/, int /*tag*/) {
  TORCH_CHECK(false,
              "gz backend: recv without a source rank is not supported: our point-to-point channels "
              "match sends by (source, tag) in order; pass src=");
}

}  // namespace gz::python
