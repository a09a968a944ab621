#include "gz/store/prefix_store.h"

#include "gz/core/error.h"

namespace gz {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  GZ_CHECK_ARG(base_ != nullptr, "PrefixStore needs a base store");
  timeout_ = base_->timeout();
}

std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (auto& key : keys) out.push_back(k(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { base_->set(k(key), value); }
Bytes PrefixStore::get(const std::string& key, Deadline d) { return base_->get(k(key), d); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(k(key), delta); }
int64_t PrefixStore::append(const std::string& key, const Bytes& value) { return base_->append(k(key), value); }
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& e, const Bytes& d) {
  return base_->compare_set(k(key), e, d);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Deadline d) { base_->wait(k(keys), d); }
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(k(keys)); }
bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(k(key)); }
int64_t PrefixStore::num_keys() { return base_->num_keys(); }

}  // namespace gz
