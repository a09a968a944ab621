#include "gz/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gz/comm/flight_dump.h"
#include "gz/core/error.h"
#include "gz/core/log.h"

namespace gz::comm {

namespace {
void check_buf(const void* p, size_t count, const char* op, const char* name) {
  if (count > 0 && p == nullptr) GZ_THROW(InvalidArgument, op, ": ", name, " is null with count ", count);
}

OpInfo op_info(OpKind kind, DType dtype, ReduceOp reduce, size_t count, int root, int tag) {
  OpInfo i;
  i.kind = kind;
  i.dtype = dtype;
  i.reduce = reduce;
  i.count = count;
  i.root = root;
  i.tag = tag;
  return i;
}

OpInfo task_info() {
  OpInfo i;
  i.task = true;
  return i;
}
}  // namespace

// ---------------------------------------------------------------- flight recorder

FlightRecorder* Communicator::init_flight_recorder() noexcept {
  std::lock_guard<std::mutex> lock(fr_mu_);
  if (fr_state_.load() == 0) {
    int8_t state = 2;
    try {
      const size_t cap =
          fr_capacity_ >= 0 ? static_cast<size_t>(fr_capacity_) : FlightRecorder::capacity_from_env();
      if (cap > 0) {
        fr_ = std::make_unique<FlightRecorder>(cap, rank(), size());
        FlightIdentity id = fr_identity_;
        id.backend = backend();
        if (id.name.empty()) id.name = id.backend;
        fr_->set_identity(std::move(id));
        state = 1;
      }
    } catch (const std::exception& e) {
      GZ_LOG(warn, "flight recorder off for this communicator: ", e.what());
      fr_.reset();
    }
    fr_state_.store(state, std::memory_order_release);
  }
  return fr_.get();
}

void Communicator::set_flight_recorder_capacity(size_t ops) {
  std::lock_guard<std::mutex> lock(fr_mu_);
  fr_capacity_ = static_cast<long long>(ops);
}

void Communicator::set_flight_identity(const std::string& name, std::vector<int> ranks,
                                       Communicator* parent) {
  FlightRecorder* up = parent ? parent->flight_recorder() : nullptr;
  {
    std::lock_guard<std::mutex> lock(fr_mu_);
    fr_identity_.name = name;
    fr_identity_.ranks = std::move(ranks);
    fr_identity_.parent = up ? up->id() : 0;
    if (fr_) {
      FlightIdentity id = fr_identity_;
      id.backend = backend();
      fr_->set_identity(std::move(id));
    }
  }
  name_flight_parts(name);
}

std::string Communicator::flight_name() const {
  std::lock_guard<std::mutex> lock(fr_mu_);
  return fr_identity_.name;
}

// One record per op: running now, done or failed (with the error's text) when fn returns. The
// try block costs nothing unless the op throws.
template <typename Fn>
void Communicator::recorded(const OpInfo& info, uint64_t issued, Fn&& fn) {
  FlightRecorder* fr = flight_recorder();
  if (fr == nullptr) {
    fn();
    return;
  }
  const uint64_t h = fr->begin(current_seq_, info, issued);
  try {
    fn();
  } catch (...) {
    fr->fail(h, std::current_exception());
    throw;
  }
  fr->finish(h);
}

std::shared_ptr<Communicator> Communicator::new_group(const std::vector<int>& ranks) {
  auto group = do_new_group(ranks);
  const uint64_t n = ++groups_made_;
  if (group) {
    std::string name = flight_name();
    if (name.empty()) name = backend();
    group->set_flight_identity(name + "/g" + std::to_string(n), ranks, this);
  }
  return group;
}

Communicator::~Communicator() {
  // A backend that did not call shutdown_executor() leaves its queued ops here: fail them (there
  // is no do_abort() to reach any more) rather than run them against a half-destroyed backend.
  fail_queued("communicator destroyed");
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
}

void Communicator::shutdown_executor() {
  size_t pending;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
    pending = in_flight_;
  }
  // An op still pending at destruction would run against freed state, and queued ones would each
  // wait out their full deadline for peers that may be gone: abort them. Owners that waited for
  // their Works (Reducer, DistributedOptimizer) leave nothing here.
  if (pending > 0 && !executor_stopped_ && !aborted()) {
    GZ_LOG(warn, backend(), " rank ", rank(), ": destroyed with ", pending, " async op(s) pending; aborting them");
    abort(detail::concat("communicator destroyed with ", pending, " async op(s) pending"));
  }
  q_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  executor_stopped_ = true;
}

void Communicator::fail_queued(const std::string& why) {
  std::deque<std::pair<std::function<void()>, WorkPtr>> dropped;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    dropped.swap(queue_);
    in_flight_ -= dropped.size();
    if (fr_state_.load() == 1)
      for (size_t i = 0; i < dropped.size(); ++i) fr_->dequeued();
    if (in_flight_ == 0) idle_cv_.notify_all();
  }
  for (auto& item : dropped)
    item.second->finish(std::make_exception_ptr(Aborted(detail::concat("op aborted before it ran: ", why))));
}

void Communicator::check_rank(int r, const char* what) const {
  if (r < 0 || r >= size()) GZ_THROW(InvalidArgument, what, ": rank ", r, " out of range [0, ", size(), ")");
}

void Communicator::check_aborted() const {
  if (aborted_.load()) GZ_THROW(Aborted, "communicator aborted: ", abort_reason_);
}

std::string Communicator::op_failure(const std::string& op, int peer, Duration elapsed) const {
  return detail::concat(backend(), " ", op, " #", current_seq_, " on rank ", rank(), "/", size(),
                        peer >= 0 ? detail::concat(" with peer ", peer) : std::string(), " failed after ",
                        format_duration(elapsed));
}

void Communicator::start_op(Deadline deadline, int tag) {
  current_seq_ = seq_++;
  current_deadline_ = deadline;
  current_tag_ = tag;
}

void Communicator::begin_sync(const OpOptions& opts) {
  check_aborted();
  const Deadline deadline = opts.resolve(timeout_);
  // Keep one op order on every rank: a synchronous op waits for the async ones issued before it.
  std::unique_lock<std::mutex> lock(q_mu_);
  // Ops called from a submit()ted function run on the progress thread and are already in order.
  if (in_flight_ != 0 && std::this_thread::get_id() != executor_.get_id()) {
    Stopwatch sw;
    if (!idle_cv_.wait_until(lock, deadline.at(), [&] { return in_flight_ == 0; }))
      GZ_THROW(TimeoutError, "rank ", rank(), ": pending async ops did not finish after ",
               format_duration(sw.elapsed()));
  }
  lock.unlock();
  check_aborted();
  start_op(deadline, opts.tag);
}

std::shared_ptr<void> Communicator::alloc_buffer(size_t bytes) {
  begin_sync(OpOptions{});
  return do_alloc_buffer(bytes);
}

std::shared_ptr<void> Communicator::do_alloc_buffer(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void Communicator::allreduce(void* data, size_t count, DType dtype, ReduceOp op, const OpOptions& opts) {
  check_buf(data, count, "allreduce", "data");
  begin_sync(opts);
  recorded(op_info(OpKind::allreduce, dtype, op, count, -1, 0), 0,
           [&] { do_allreduce(data, count, dtype, op); });
}

void Communicator::broadcast(void* data, size_t count, DType dtype, int root, const OpOptions& opts) {
  check_buf(data, count, "broadcast", "data");
  check_rank(root, "broadcast root");
  begin_sync(opts);
  recorded(op_info(OpKind::broadcast, dtype, ReduceOp::sum, count, root, 0), 0,
           [&] { do_broadcast(data, count, dtype, root); });
}

void Communicator::allgather(const void* send, void* recv, size_t count, DType dtype, const OpOptions& opts) {
  check_buf(send, count, "allgather", "send");
  check_buf(recv, count, "allgather", "recv");
  begin_sync(opts);
  recorded(op_info(OpKind::allgather, dtype, ReduceOp::sum, count, -1, 0), 0,
           [&] { do_allgather(send, recv, count, dtype); });
}

void Communicator::allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                              const OpOptions& opts) {
  if (counts.size() != static_cast<size_t>(size()))
    GZ_THROW(InvalidArgument, "allgatherv: ", counts.size(), " counts for a group of ", size());
  size_t total = 0;
  for (size_t c : counts) total += c;
  check_buf(send, counts[rank()], "allgatherv", "send");
  check_buf(recv, total, "allgatherv", "recv");
  begin_sync(opts);
  recorded(op_info(OpKind::allgatherv, dtype, ReduceOp::sum, total, -1, 0), 0,
           [&] { do_allgatherv(send, recv, counts, dtype); });
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                                  const OpOptions& opts) {
  check_buf(send, recv_count, "reduce_scatter", "send");
  check_buf(recv, recv_count, "reduce_scatter", "recv");
  begin_sync(opts);
  recorded(op_info(OpKind::reduce_scatter, dtype, op, recv_count, -1, 0), 0,
           [&] { do_reduce_scatter(send, recv, recv_count, dtype, op); });
}

void Communicator::reduce(void* data, size_t count, DType dtype, ReduceOp op, int root, const OpOptions& opts) {
  check_buf(data, count, "reduce", "data");
  check_rank(root, "reduce root");
  begin_sync(opts);
  recorded(op_info(OpKind::reduce, dtype, op, count, root, 0), 0,
           [&] { do_reduce(data, count, dtype, op, root); });
}

void Communicator::barrier(const OpOptions& opts) {
  begin_sync(opts);
  recorded(op_info(OpKind::barrier, DType::u8, ReduceOp::sum, 0, -1, 0), 0, [&] { do_barrier(); });
}

void Communicator::send(const void* data, size_t count, DType dtype, int peer, const OpOptions& opts) {
  check_buf(data, count, "send", "data");
  check_rank(peer, "send peer");
  if (peer == rank()) GZ_THROW(InvalidArgument, "send: rank ", rank(), " cannot send to itself");
  begin_sync(opts);
  recorded(op_info(OpKind::send, dtype, ReduceOp::sum, count, peer, opts.tag), 0,
           [&] { do_send(data, count, dtype, peer, opts.tag); });
}

void Communicator::recv(void* data, size_t count, DType dtype, int peer, const OpOptions& opts) {
  check_buf(data, count, "recv", "data");
  check_rank(peer, "recv peer");
  if (peer == rank()) GZ_THROW(InvalidArgument, "recv: rank ", rank(), " cannot receive from itself");
  begin_sync(opts);
  recorded(op_info(OpKind::recv, dtype, ReduceOp::sum, count, peer, opts.tag), 0,
           [&] { do_recv(data, count, dtype, peer, opts.tag); });
}

WorkPtr Communicator::enqueue(std::function<void()> fn, Deadline deadline, const OpInfo& info,
                              uint64_t issued) {
  check_aborted();
  auto work = std::make_shared<Work>(deadline);
  FlightRecorder* fr = flight_recorder();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (stop_) GZ_THROW(Aborted, "communicator is shutting down");
    if (!executor_.joinable()) executor_ = std::thread([this] { executor_loop(); });
    queue_.emplace_back(std::move(fn), work);
    ++in_flight_;
    // Under q_mu_, so the recorder's queue and ours hold the same ops in the same order.
    if (fr) fr->enqueued(info, issued);
  }
  q_cv_.notify_one();
  return work;
}

void Communicator::executor_loop() {
  std::unique_lock<std::mutex> lock(q_mu_);
  for (;;) {
    q_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    auto item = std::move(queue_.front());
    queue_.pop_front();
    if (FlightRecorder* fr = flight_recorder()) fr->dequeued();
    lock.unlock();
    std::exception_ptr err;
    try {
      check_aborted();
      item.first();
    } catch (...) {
      err = std::current_exception();
    }
    // The op has returned: it no longer counts as pending (for shutdown and for the next
    // synchronous op), then its Work completes.
    lock.lock();
    if (--in_flight_ == 0) idle_cv_.notify_all();
    lock.unlock();
    item.second->finish(err);
    // Destroy the op (and what it captured) before taking the lock again: a capture's destructor
    // may block (a tensor freed by a Python binding takes the interpreter lock) or issue ops.
    item = {};
    lock.lock();
  }
}

// Async ops take their deadline when issued and their sequence number when they run, which is
// issue order (one queue). Their flight record starts when they run; it keeps the issue time.
WorkPtr Communicator::allreduce_async(void* data, size_t count, DType dtype, ReduceOp op, const OpOptions& opts) {
  check_buf(data, count, "allreduce", "data");
  const Deadline dl = opts.resolve(timeout_);
  const OpInfo info = op_info(OpKind::allreduce, dtype, op, count, -1, 0);
  const uint64_t issued = flight_ticks();
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        recorded(info, issued, [&] { do_allreduce(data, count, dtype, op); });
      },
      dl, info, issued);
}

WorkPtr Communicator::broadcast_async(void* data, size_t count, DType dtype, int root, const OpOptions& opts) {
  check_buf(data, count, "broadcast", "data");
  check_rank(root, "broadcast root");
  const Deadline dl = opts.resolve(timeout_);
  const OpInfo info = op_info(OpKind::broadcast, dtype, ReduceOp::sum, count, root, 0);
  const uint64_t issued = flight_ticks();
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        recorded(info, issued, [&] { do_broadcast(data, count, dtype, root); });
      },
      dl, info, issued);
}

WorkPtr Communicator::allgather_async(const void* send, void* recv, size_t count, DType dtype, const OpOptions& opts) {
  check_buf(send, count, "allgather", "send");
  check_buf(recv, count, "allgather", "recv");
  const Deadline dl = opts.resolve(timeout_);
  const OpInfo info = op_info(OpKind::allgather, dtype, ReduceOp::sum, count, -1, 0);
  const uint64_t issued = flight_ticks();
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        recorded(info, issued, [&] { do_allgather(send, recv, count, dtype); });
      },
      dl, info, issued);
}

WorkPtr Communicator::reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                                           const OpOptions& opts) {
  check_buf(send, recv_count, "reduce_scatter", "send");
  check_buf(recv, recv_count, "reduce_scatter", "recv");
  const Deadline dl = opts.resolve(timeout_);
  const OpInfo info = op_info(OpKind::reduce_scatter, dtype, op, recv_count, -1, 0);
  const uint64_t issued = flight_ticks();
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        recorded(info, issued, [&] { do_reduce_scatter(send, recv, recv_count, dtype, op); });
      },
      dl, info, issued);
}

// An opaque function: its ops record themselves as they run; while it waits in the queue the
// dump shows it as a "task".
WorkPtr Communicator::submit(std::function<void()> fn, const OpOptions& opts) {
  return enqueue(std::move(fn), opts.resolve(timeout_), task_info(), flight_ticks());
}

void Communicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;  // written before the flag, read only after seeing it set
    aborted_.store(true);
  }
  // Queued ops finish now; the running one is woken by the backend and finishes as it returns.
  fail_queued(reason);
  do_abort(reason);
  if (fr_state_.load() == 1) request_flight_dump(DumpReason::failure, 0, "abort: " + reason);
}

void finish_or_abort(Communicator& comm, Work& work, const std::string& why) noexcept {
  try {
    work.wait();
  } catch (...) {
  }
  if (work.is_completed()) return;
  try {
    comm.abort(why);
  } catch (...) {
  }
  work.wait_finished();
}

}  // namespace gz::comm
