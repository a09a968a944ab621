// Test-only in-process communicator: ranks are threads of one process that exchange pointers
// through a shared hub (mutex + condition variable). Used while no real backend is available and
// as an independent reference implementation for the torch front-end tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/core/error.h"
#include "gz/store/store.h"

namespace gz::test {

class ThreadComm : public comm::Communicator {
 public:
  struct Hub {
    explicit Hub(int n) : world(n), sends(n), recvs(n) {}
    std::mutex mu;
    std::condition_variable cv;
    int world;
    int arrived = 0;
    uint64_t generation = 0;
    bool aborted = false;
    std::vector<const void*> sends;
    std::vector<void*> recvs;
  };

  ThreadComm(int rank, int size, std::shared_ptr<Hub> hub, Duration timeout)
      : Communicator(timeout), rank_(rank), size_(size), hub_(std::move(hub)) {}
  ~ThreadComm() override { shutdown_executor(); }

  /// @brief One communicator per rank; ranks sharing `store` share a hub.
  static comm::CommPtr create(int rank, int size, const std::shared_ptr<Store>& store,
                              Duration timeout = std::chrono::seconds(20)) {
    static std::mutex reg_mu;
    static std::map<Store*, std::weak_ptr<Hub>> reg;
    std::shared_ptr<Hub> hub;
    {
      std::lock_guard<std::mutex> lock(reg_mu);
      hub = reg[store.get()].lock();
      if (!hub) {
        hub = std::make_shared<Hub>(size);
        reg[store.get()] = hub;
      }
    }
    return std::make_shared<ThreadComm>(rank, size, hub, timeout);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "thread"; }
  std::shared_ptr<comm::Communicator> new_group(const std::vector<int>&) override {
    GZ_THROW(Error, "ThreadComm: new_group not supported");
  }

 protected:
  void do_allreduce(void* data, size_t count, DType dt, comm::ReduceOp op) override {
    const size_t bytes = count * dtype_size(dt);
    std::vector<uint8_t> tmp(bytes);
    publish(data, nullptr);
    // Sum in rank order so every rank gets bit-identical results.
    std::vector<double> acc(count);
    for (int r = 0; r < size_; ++r) {
      const void* src = hub_->sends[r];
      for (size_t i = 0; i < count; ++i) {
        double v = load(src, i, dt);
        if (r == 0) acc[i] = v;
        else if (op == comm::ReduceOp::sum || op == comm::ReduceOp::avg) acc[i] += v;
        else if (op == comm::ReduceOp::min) acc[i] = std::min(acc[i], v);
        else if (op == comm::ReduceOp::max) acc[i] = std::max(acc[i], v);
        else acc[i] *= v;
      }
    }
    for (size_t i = 0; i < count; ++i) {
      double v = acc[i];
      if (op == comm::ReduceOp::avg) v /= size_;
      store(tmp.data(), i, dt, v);
    }
    sync();
    std::memcpy(data, tmp.data(), bytes);
    sync();
  }
  void do_broadcast(void* data, size_t count, DType dt, int root) override {
    const size_t bytes = count * dtype_size(dt);
    publish(data, nullptr);
    if (rank_ != root) std::memcpy(data, hub_->sends[root], bytes);
    sync();
  }
  void do_allgather(const void* send, void* recv, size_t count, DType dt) override {
    std::vector<size_t> counts(size_, count);
    do_allgatherv(send, recv, counts, dt);
  }
  void do_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dt) override {
    const size_t es = dtype_size(dt);
    std::vector<uint8_t> mine(static_cast<const uint8_t*>(send), static_cast<const uint8_t*>(send) + counts[rank_] * es);
    publish(mine.data(), nullptr);
    size_t off = 0;
    for (int r = 0; r < size_; ++r) {
      std::memcpy(static_cast<uint8_t*>(recv) + off, hub_->sends[r], counts[r] * es);
      off += counts[r] * es;
    }
    sync();
  }
  void do_reduce_scatter(const void* send, void* recv, size_t n, DType dt, comm::ReduceOp op) override {
    std::vector<uint8_t> all(static_cast<const uint8_t*>(send),
                             static_cast<const uint8_t*>(send) + n * size_ * dtype_size(dt));
    do_allreduce(all.data(), n * size_, dt, op);
    std::memcpy(recv, all.data() + rank_ * n * dtype_size(dt), n * dtype_size(dt));
  }
  void do_reduce(void* data, size_t count, DType dt, comm::ReduceOp op, int) override {
    do_allreduce(data, count, dt, op);
  }
  void do_barrier() override { sync(); }
  void do_send(const void*, size_t, DType, int, int) override { GZ_THROW(Error, "ThreadComm: no send"); }
  void do_recv(void*, size_t, DType, int, int) override { GZ_THROW(Error, "ThreadComm: no recv"); }
  void do_abort(const std::string&) override {
    std::lock_guard<std::mutex> lock(hub_->mu);
    hub_->aborted = true;
    hub_->cv.notify_all();
  }

 private:
  static double load(const void* p, size_t i, DType dt) {
    switch (dt) {
      case DType::f32: return static_cast<const float*>(p)[i];
      case DType::f64: return static_cast<const double*>(p)[i];
      case DType::f16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
      case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
      case DType::i8: return static_cast<const int8_t*>(p)[i];
      case DType::u8: return static_cast<const uint8_t*>(p)[i];
      case DType::i32: return static_cast<const int32_t*>(p)[i];
      case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    }
    return 0;
  }
  static void store(void* p, size_t i, DType dt, double v) {
    switch (dt) {
      case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
      case DType::f64: static_cast<double*>(p)[i] = v; break;
      case DType::f16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
      case DType::bf16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
      case DType::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
      case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
      case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
      case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    }
  }
  void publish(const void* send, void* recv) {
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      hub_->sends[rank_] = send;
      hub_->recvs[rank_] = recv;
    }
    sync();
  }
  void sync() {
    std::unique_lock<std::mutex> lock(hub_->mu);
    uint64_t gen = hub_->generation;
    if (++hub_->arrived == size_) {
      hub_->arrived = 0;
      ++hub_->generation;
      hub_->cv.notify_all();
      return;
    }
    auto deadline = op_deadline();
    while (hub_->generation == gen) {
      if (hub_->aborted) GZ_THROW(Aborted, "ThreadComm rank ", rank_, ": aborted");
      if (hub_->cv.wait_until(lock, deadline.at()) == std::cv_status::timeout && hub_->generation == gen)
        GZ_THROW(TimeoutError, "ThreadComm rank ", rank_, ": op ", current_seq(), " timed out waiting for peers");
    }
  }

  int rank_, size_;
  std::shared_ptr<Hub> hub_;
};

}  // namespace gz::test
