#include "gz/store/mem_store.h"

#include <string>

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "store/store_state.h"

namespace gz {

void MemStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Bytes MemStore::get(const std::string& key, Deadline deadline) {
  for (;;) {
    wait({key}, deadline);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) return it->second;
    // Deleted between wait and here: wait again.
  }
}

int64_t MemStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    // Same strict decimal parsing as the TCP and file stores.
    if (it != data_.end() && !wire::parse_counter(to_string(it->second), v))
      GZ_THROW(InvalidArgument, "add: value of key '", key, "' is not an integer");
    if (__builtin_add_overflow(v, delta, &v)) GZ_THROW(InvalidArgument, "add: counter '", key, "' would overflow");
    data_[key] = to_bytes(std::to_string(v));
  }
  cv_.notify_all();
  return v;
}

int64_t MemStore::append(const std::string& key, const Bytes& value) {
  int64_t len;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& v = data_[key];
    v.insert(v.end(), value.begin(), value.end());
    len = static_cast<int64_t>(v.size());
  }
  cv_.notify_all();
  return len;
}

Bytes MemStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;  // c10d semantics: missing key with non-empty expected
    data_[key] = desired;
  } else if (it->second == expected) {
    it->second = desired;
  } else {
    return it->second;
  }
  lock.unlock();
  cv_.notify_all();
  return desired;
}

void MemStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] {
    for (auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  Stopwatch sw;
  if (!cv_.wait_until(lock, deadline.at(), ready)) {
    std::string missing;
    for (auto& k : keys)
      if (!data_.count(k)) missing += (missing.empty() ? "" : ", ") + k;
    GZ_THROW(TimeoutError, "store wait timed out after ", format_duration(sw.elapsed()),
             "; missing keys: ", missing);
  }
}

bool MemStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

bool MemStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

int64_t MemStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

}  // namespace gz
