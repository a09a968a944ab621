// Adapter: our gz::Store seen as Gloo's rendezvous store, with our deadlines.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>

#include "gz/store/store.h"

namespace gz::comm::gloo_impl {

/// @brief gloo::rendezvous::Store over a gz::Store. Blocking calls wait at most `timeout` and
/// throw gz::TimeoutError (naming the keys) instead of Gloo's own untimed waits.
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<gz::Store> store, Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes b = store_->get(key, Deadline::after(timeout_));
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    store_->wait(keys, Deadline::after(timeout_));
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    // Gloo passes its own default (30 s) here; never wait longer than our timeout.
    auto t = timeout.count() > 0 ? std::min<Duration>(timeout, timeout_) : timeout_;
    store_->wait(keys, Deadline::after(t));
  }

 private:
  std::shared_ptr<gz::Store> store_;
  Duration timeout_;
};

}  // namespace gz::comm::gloo_impl
