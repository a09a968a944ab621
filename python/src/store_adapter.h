// torch's c10d::Store (the store init_process_group made: PrefixStore over TCPStore/FileStore/
// HashStore) seen as our gz::Store, so our backends rendezvous through torch's store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "gz/store/store.h"

namespace gz::python {

/// @brief gz::Store over a c10d::Store.
///
/// Blocking calls (get, wait) poll check() instead of calling c10d's blocking wait(): a c10d
/// TCPStore client serialises its calls, so one thread blocked in c10d wait() would stall every
/// other thread using the store, and polling lets our own deadline (not the store's) decide.
/// c10d errors become gz::Error naming the call and key.
class C10dStoreAdapter : public gz::Store {
 public:
  explicit C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Deadline deadline) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace gz::python
