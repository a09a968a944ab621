#include "gz_store.h"

#include <c10/util/Exception.h>

#include "gz/core/error.h"

namespace gz::python {

namespace {
Deadline after(std::chrono::milliseconds t) {
  return Deadline::after(t.count() > 0 ? std::chrono::duration_cast<Duration>(t) : default_timeout());
}

// gz errors as c10d's (c10::Error: RuntimeError in Python), with our message.
template <typename F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const gz::Error& e) {
    TORCH_CHECK(false, "gz store: ", e.what());
  }
}
}  // namespace

GzC10dStore::GzC10dStore(std::shared_ptr<gz::Store> store, std::chrono::milliseconds timeout,
                         std::shared_ptr<void> keep_alive)
    : ::c10d::Store(timeout), store_(std::move(store)), keep_alive_(std::move(keep_alive)) {
  TORCH_CHECK(store_, "gz store: null store");
}

void GzC10dStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  translated([&] { store_->set(key, value); });
}

std::vector<uint8_t> GzC10dStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  return translated([&] { return store_->compare_set(key, expected, desired); });
}

std::vector<uint8_t> GzC10dStore::get(const std::string& key) {
  return translated([&] { return store_->get(key, after(timeout_)); });
}

int64_t GzC10dStore::add(const std::string& key, int64_t value) {
  return translated([&] { return store_->add(key, value); });
}

bool GzC10dStore::deleteKey(const std::string& key) {
  return translated([&] { return store_->delete_key(key); });
}

bool GzC10dStore::check(const std::vector<std::string>& keys) {
  return translated([&] { return store_->check(keys); });
}

int64_t GzC10dStore::getNumKeys() {
  return translated([&] { return store_->num_keys(); });
}

void GzC10dStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GzC10dStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  translated([&] { store_->wait(keys, after(timeout)); });
}

RendezvousStore rendezvous_store(const std::string& init_method, std::chrono::milliseconds timeout) {
  InitOptions o;
  o.init_method = init_method;
  if (timeout.count() > 0) o.timeout = std::chrono::duration_cast<Duration>(timeout);
  auto rdzv = std::make_shared<Rendezvous>(translated([&] { return rendezvous(o); }));
  RendezvousStore out;
  out.rank = rdzv->world.rank;
  out.world_size = rdzv->world.world_size;
  out.store = c10::make_intrusive<GzC10dStore>(
      rdzv->store, timeout.count() > 0 ? timeout : ::c10d::Store::kDefaultTimeout, rdzv);
  return out;
}

}  // namespace gz::python
