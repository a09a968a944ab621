// Fault injection for the torch front ends: a communicator whose all-reduces finish only just
// before their own deadline (a slow link that still honours the op contract), as c10d's tests
// subclass a backend with a delayed send. Everything else is forwarded to a real communicator.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gz/comm/communicator.h"

namespace gz::test {

/// @brief Shared by a SlowComm and the sub-groups it creates: what the test inspects.
struct SlowCommState {
  /// @brief How long before its deadline an all-reduce runs (on the real communicator).
  std::chrono::milliseconds margin{300};
  /// @brief Per rank: all-reduces inside a SlowComm of this family now (sleeping or running).
  std::array<std::atomic<int>, 16> running_on{};
  int running() const {
    int n = 0;
    for (auto& r : running_on) n += r.load();
    return n;
  }
  /// @brief Every communicator of the family (so a test can abort one its owner forgot).
  std::mutex mu;
  std::vector<std::shared_ptr<comm::Communicator>> members;
  void abort_all(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& c : members) c->abort(why);
  }
  /// @brief Drop the family (members hold this state: a cycle until then).
  void release() {
    std::vector<std::shared_ptr<comm::Communicator>> gone;
    {
      std::lock_guard<std::mutex> lock(mu);
      gone.swap(members);
    }
  }
};

/// @brief Wraps `inner`: its all-reduces wait until `margin` before their deadline (or an abort),
/// touch their buffer, then run on `inner` with what is left of the deadline.
class SlowComm : public comm::Communicator {
 public:
  SlowComm(std::shared_ptr<comm::Communicator> inner, Duration timeout, std::shared_ptr<SlowCommState> state)
      : Communicator(timeout), inner_(std::move(inner)), state_(std::move(state)) {}
  ~SlowComm() override { shutdown_executor(); }

  static std::shared_ptr<SlowComm> make(std::shared_ptr<comm::Communicator> inner, Duration timeout,
                                        std::shared_ptr<SlowCommState> state) {
    auto c = std::make_shared<SlowComm>(std::move(inner), timeout, state);
    std::lock_guard<std::mutex> lock(state->mu);
    state->members.push_back(c);
    return c;
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "slow(" + inner_->backend() + ")"; }

 protected:
  std::shared_ptr<comm::Communicator> do_new_group(const std::vector<int>& ranks) override {
    auto g = inner_->new_group(ranks);
    return g ? make(std::move(g), timeout(), state_) : nullptr;
  }
  void do_allreduce(void* data, size_t count, DType dtype, comm::ReduceOp op) override {
    auto& running = state_->running_on.at(static_cast<size_t>(rank()));
    ++running;
    struct Done {
      std::atomic<int>& n;
      ~Done() { --n; }
    } done{running};
    const auto until = op_deadline().at() - state_->margin;
    while (Clock::now() < until && !aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // The buffer is touched however the wait ended: ASan reports a freed one.
    if (count > 0) {
      const char first = *static_cast<volatile char*>(data);
      (void)first;
    }
    check_aborted();
    inner_->allreduce(data, count, dtype, op, comm::OpOptions::until(op_deadline()));
  }
  void do_broadcast(void* data, size_t count, DType dtype, int root) override {
    inner_->broadcast(data, count, dtype, root, comm::OpOptions::until(op_deadline()));
  }
  void do_allgather(const void* send, void* recv, size_t count, DType dtype) override {
    inner_->allgather(send, recv, count, dtype, comm::OpOptions::until(op_deadline()));
  }
  void do_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) override {
    inner_->allgatherv(send, recv, counts, dtype, comm::OpOptions::until(op_deadline()));
  }
  void do_reduce_scatter(const void* send, void* recv, size_t rc, DType dtype, comm::ReduceOp op) override {
    inner_->reduce_scatter(send, recv, rc, dtype, op, comm::OpOptions::until(op_deadline()));
  }
  void do_reduce(void* data, size_t count, DType dtype, comm::ReduceOp op, int root) override {
    inner_->reduce(data, count, dtype, op, root, comm::OpOptions::until(op_deadline()));
  }
  void do_barrier() override { inner_->barrier(comm::OpOptions::until(op_deadline())); }
  void do_send(const void* data, size_t count, DType dtype, int peer, int tag) override {
    auto o = comm::OpOptions::until(op_deadline());
    o.tag = tag;
    inner_->send(data, count, dtype, peer, o);
  }
  void do_recv(void* data, size_t count, DType dtype, int peer, int tag) override {
    auto o = comm::OpOptions::until(op_deadline());
    o.tag = tag;
    inner_->recv(data, count, dtype, peer, o);
  }
  void do_abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  std::shared_ptr<comm::Communicator> inner_;
  std::shared_ptr<SlowCommState> state_;
};

}  // namespace gz::test
