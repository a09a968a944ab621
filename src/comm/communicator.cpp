#include "gz/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gz/core/error.h"
#include "gz/core/log.h"

namespace gz::comm {

namespace {
void check_buf(const void* p, size_t count, const char* op, const char* name) {
  if (count > 0 && p == nullptr) GZ_THROW(InvalidArgument, op, ": ", name, " is null with count ", count);
}
}  // namespace

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
  do_allreduce(data, count, dtype, op);
}

void Communicator::broadcast(void* data, size_t count, DType dtype, int root, const OpOptions& opts) {
  check_buf(data, count, "broadcast", "data");
  check_rank(root, "broadcast root");
  begin_sync(opts);
  do_broadcast(data, count, dtype, root);
}

void Communicator::allgather(const void* send, void* recv, size_t count, DType dtype, const OpOptions& opts) {
  check_buf(send, count, "allgather", "send");
  check_buf(recv, count, "allgather", "recv");
  begin_sync(opts);
  do_allgather(send, recv, count, dtype);
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
  do_allgatherv(send, recv, counts, dtype);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                                  const OpOptions& opts) {
  check_buf(send, recv_count, "reduce_scatter", "send");
  check_buf(recv, recv_count, "reduce_scatter", "recv");
  begin_sync(opts);
  do_reduce_scatter(send, recv, recv_count, dtype, op);
}

void Communicator::reduce(void* data, size_t count, DType dtype, ReduceOp op, int root, const OpOptions& opts) {
  check_buf(data, count, "reduce", "data");
  check_rank(root, "reduce root");
  begin_sync(opts);
  do_reduce(data, count, dtype, op, root);
}

void Communicator::barrier(const OpOptions& opts) {
  begin_sync(opts);
  do_barrier();
}

void Communicator::send(const void* data, size_t count, DType dtype, int peer, const OpOptions& opts) {
  check_buf(data, count, "send", "data");
  check_rank(peer, "send peer");
  if (peer == rank()) GZ_THROW(InvalidArgument, "send: rank ", rank(), " cannot send to itself");
  begin_sync(opts);
  do_send(data, count, dtype, peer, opts.tag);
}

void Communicator::recv(void* data, size_t count, DType dtype, int peer, const OpOptions& opts) {
  check_buf(data, count, "recv", "data");
  check_rank(peer, "recv peer");
  if (peer == rank()) GZ_THROW(InvalidArgument, "recv: rank ", rank(), " cannot receive from itself");
  begin_sync(opts);
  do_recv(data, count, dtype, peer, opts.tag);
}

WorkPtr Communicator::enqueue(std::function<void()> fn, Deadline deadline) {
  check_aborted();
  auto work = std::make_shared<Work>(deadline);
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (stop_) GZ_THROW(Aborted, "communicator is shutting down");
    if (!executor_.joinable()) executor_ = std::thread([this] { executor_loop(); });
    queue_.emplace_back(std::move(fn), work);
    ++in_flight_;
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
// issue order (one queue).
WorkPtr Communicator::allreduce_async(void* data, size_t count, DType dtype, ReduceOp op, const OpOptions& opts) {
  check_buf(data, count, "allreduce", "data");
  const Deadline dl = opts.resolve(timeout_);
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        do_allreduce(data, count, dtype, op);
      },
      dl);
}

WorkPtr Communicator::broadcast_async(void* data, size_t count, DType dtype, int root, const OpOptions& opts) {
  check_buf(data, count, "broadcast", "data");
  check_rank(root, "broadcast root");
  const Deadline dl = opts.resolve(timeout_);
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        do_broadcast(data, count, dtype, root);
      },
      dl);
}

WorkPtr Communicator::allgather_async(const void* send, void* recv, size_t count, DType dtype, const OpOptions& opts) {
  check_buf(send, count, "allgather", "send");
  check_buf(recv, count, "allgather", "recv");
  const Deadline dl = opts.resolve(timeout_);
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        do_allgather(send, recv, count, dtype);
      },
      dl);
}

WorkPtr Communicator::reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                                           const OpOptions& opts) {
  check_buf(send, recv_count, "reduce_scatter", "send");
  check_buf(recv, recv_count, "reduce_scatter", "recv");
  const Deadline dl = opts.resolve(timeout_);
  return enqueue(
      [=] {
        start_op(dl, opts.tag);
        do_reduce_scatter(send, recv, recv_count, dtype, op);
      },
      dl);
}

WorkPtr Communicator::submit(std::function<void()> fn, const OpOptions& opts) {
  return enqueue(std::move(fn), opts.resolve(timeout_));
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
