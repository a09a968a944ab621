#include "gz/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gz/core/error.h"

namespace gz::comm {

namespace {
void check_buf(const void* p, size_t count, const char* op, const char* name) {
  if (count > 0 && p == nullptr) GZ_THROW(InvalidArgument, op, ": ", name, " is null with count ", count);
}
}  // namespace

Communicator::~Communicator() { shutdown_executor(); }

void Communicator::shutdown_executor() {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
}

void Communicator::check_rank(int r, const char* what) const {
  if (r < 0 || r >= size()) GZ_THROW(InvalidArgument, what, ": rank ", r, " out of range [0, ", size(), ")");
}

void Communicator::check_aborted() const {
  if (aborted_.load()) GZ_THROW(Aborted, "communicator aborted: ", abort_reason_);
}

void Communicator::begin_sync() {
  check_aborted();
  // Keep one op order on every rank: a synchronous op waits for the async ones issued before it.
  std::unique_lock<std::mutex> lock(q_mu_);
  // Ops called from a submit()ted function run on the progress thread and are already in order.
  if (in_flight_ == 0 || std::this_thread::get_id() == executor_.get_id()) return;
  Stopwatch sw;
  if (!idle_cv_.wait_until(lock, op_deadline().at(), [&] { return in_flight_ == 0; }))
    GZ_THROW(TimeoutError, "rank ", rank(), ": pending async ops did not finish after ",
             format_duration(sw.elapsed()));
}

#define GZ_SYNC_OP(call)      \
  begin_sync();               \
  current_seq_ = seq_++;      \
  call

std::shared_ptr<void> Communicator::alloc_buffer(size_t bytes) {
  begin_sync();
  return do_alloc_buffer(bytes);
}

std::shared_ptr<void> Communicator::do_alloc_buffer(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void Communicator::allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  check_buf(data, count, "allreduce", "data");
  GZ_SYNC_OP(do_allreduce(data, count, dtype, op));
}

void Communicator::broadcast(void* data, size_t count, DType dtype, int root) {
  check_buf(data, count, "broadcast", "data");
  check_rank(root, "broadcast root");
  GZ_SYNC_OP(do_broadcast(data, count, dtype, root));
}

void Communicator::allgather(const void* send, void* recv, size_t count, DType dtype) {
  check_buf(send, count, "allgather", "send");
  check_buf(recv, count, "allgather", "recv");
  GZ_SYNC_OP(do_allgather(send, recv, count, dtype));
}

void Communicator::allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) {
  if (counts.size() != static_cast<size_t>(size()))
    GZ_THROW(InvalidArgument, "allgatherv: ", counts.size(), " counts for a group of ", size());
  size_t total = 0;
  for (size_t c : counts) total += c;
  check_buf(send, counts[rank()], "allgatherv", "send");
  check_buf(recv, total, "allgatherv", "recv");
  GZ_SYNC_OP(do_allgatherv(send, recv, counts, dtype));
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) {
  check_buf(send, recv_count, "reduce_scatter", "send");
  check_buf(recv, recv_count, "reduce_scatter", "recv");
  GZ_SYNC_OP(do_reduce_scatter(send, recv, recv_count, dtype, op));
}

void Communicator::reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) {
  check_buf(data, count, "reduce", "data");
  check_rank(root, "reduce root");
  GZ_SYNC_OP(do_reduce(data, count, dtype, op, root));
}

void Communicator::barrier() { GZ_SYNC_OP(do_barrier()); }

void Communicator::send(const void* data, size_t count, DType dtype, int peer, int tag) {
  check_buf(data, count, "send", "data");
  check_rank(peer, "send peer");
  if (peer == rank()) GZ_THROW(InvalidArgument, "send: rank ", rank(), " cannot send to itself");
  GZ_SYNC_OP(do_send(data, count, dtype, peer, tag));
}

void Communicator::recv(void* data, size_t count, DType dtype, int peer, int tag) {
  check_buf(data, count, "recv", "data");
  check_rank(peer, "recv peer");
  if (peer == rank()) GZ_THROW(InvalidArgument, "recv: rank ", rank(), " cannot receive from itself");
  GZ_SYNC_OP(do_recv(data, count, dtype, peer, tag));
}

#undef GZ_SYNC_OP

WorkPtr Communicator::enqueue(std::function<void()> fn) {
  check_aborted();
  auto work = std::make_shared<Work>(timeout_);
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
    item.second->finish(err);
    lock.lock();
    if (--in_flight_ == 0) idle_cv_.notify_all();
  }
}

// Async ops take their sequence number when they run, which is issue order (one queue).
WorkPtr Communicator::allreduce_async(void* data, size_t count, DType dtype, ReduceOp op) {
  check_buf(data, count, "allreduce", "data");
  return enqueue([=] {
    current_seq_ = seq_++;
    do_allreduce(data, count, dtype, op);
  });
}

WorkPtr Communicator::broadcast_async(void* data, size_t count, DType dtype, int root) {
  check_buf(data, count, "broadcast", "data");
  check_rank(root, "broadcast root");
  return enqueue([=] {
    current_seq_ = seq_++;
    do_broadcast(data, count, dtype, root);
  });
}

WorkPtr Communicator::allgather_async(const void* send, void* recv, size_t count, DType dtype) {
  check_buf(send, count, "allgather", "send");
  check_buf(recv, count, "allgather", "recv");
  return enqueue([=] {
    current_seq_ = seq_++;
    do_allgather(send, recv, count, dtype);
  });
}

WorkPtr Communicator::reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) {
  check_buf(send, recv_count, "reduce_scatter", "send");
  check_buf(recv, recv_count, "reduce_scatter", "recv");
  return enqueue([=] {
    current_seq_ = seq_++;
    do_reduce_scatter(send, recv, recv_count, dtype, op);
  });
}

WorkPtr Communicator::submit(std::function<void()> fn) { return enqueue(std::move(fn)); }

void Communicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;  // written before the flag, read only after seeing it set
    aborted_.store(true);
  }
  do_abort(reason);
}

}  // namespace gz::comm
