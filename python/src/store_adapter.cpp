#include "store_adapter.h"

#include <algorithm>
#include <thread>

#include "gz/core/error.h"

namespace gz::python {

namespace {

/// Run a c10d call; anything it throws (c10::Error, std::runtime_error) becomes gz::Error.
template <typename F>
auto guarded(const char* what, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const gz::Error&) {
    throw;
  } catch (const std::exception& e) {
    GZ_THROW(gz::Error, "torch store ", what, "('", key, "') failed: ", e.what());
  }
}

}  // namespace

C10dStoreAdapter::C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  if (!store_) GZ_THROW(gz::InvalidArgument, "C10dStoreAdapter: null store");
  auto t = store_->getTimeout();
  if (t.count() > 0) set_timeout(std::chrono::duration_cast<Duration>(t));
}

void C10dStoreAdapter::set(const std::string& key, const Bytes& value) {
  guarded("set", key, [&] { store_->set(key, value); });
}

Bytes C10dStoreAdapter::get(const std::string& key, Deadline deadline) {
  wait({key}, deadline);
  return guarded("get", key, [&] { return store_->get(key); });
}

int64_t C10dStoreAdapter::add(const std::string& key, int64_t delta) {
  return guarded("add", key, [&] { return store_->add(key, delta); });
}

Bytes C10dStoreAdapter::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return guarded("compare_set", key, [&] { return store_->compareSet(key, expected, desired); });
}

bool C10dStoreAdapter::check(const std::vector<std::string>& keys) {
  return guarded("check", keys.empty() ? std::string() : keys.front(), [&] { return store_->check(keys); });
}

void C10dStoreAdapter::wait(const std::vector<std::string>& keys, Deadline deadline) {
  if (keys.empty()) return;
  Stopwatch sw;
  auto pause = std::chrono::microseconds(200);
  while (!check(keys)) {
    if (deadline.expired()) {
      std::string missing;
      for (const auto& k : keys) {
        bool present = false;
        try {
          present = store_->check({k});
        } catch (const std::exception&) {
        }
        if (!present) missing += (missing.empty() ? "" : ", ") + k;
      }
      GZ_THROW(gz::TimeoutError, "torch store: waited ", format_duration(sw.elapsed()), " for key(s) ",
               missing);
    }
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(pause, deadline.remaining()));
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
}

bool C10dStoreAdapter::delete_key(const std::string& key) {
  return guarded("delete_key", key, [&] { return store_->deleteKey(key); });
}

int64_t C10dStoreAdapter::num_keys() {
  return guarded("num_keys", "", [&] { return store_->getNumKeys(); });
}

}  // namespace gz::python
