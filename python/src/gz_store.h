// Our store as torch's: a c10d::Store over a gz::Store, so a script may hand Guozhuang's
// rendezvous store (gzrun's, or one from our env:// rules) to init_process_group(store=...)
// instead of letting torch open its own TCPStore on MASTER_PORT.
#pragma once

#include <memory>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "gz/store/rendezvous.h"
#include "gz/store/store.h"

namespace gz::python {

/// @brief c10d::Store over a gz::Store. Blocking calls wait up to the store's timeout (c10d's
/// setTimeout / the constructor's), and a timeout is a c10d error naming the keys.
class GzC10dStore : public ::c10d::Store {
 public:
  /// @brief `keep_alive` holds what the store needs (the rendezvous and its server).
  GzC10dStore(std::shared_ptr<gz::Store> store, std::chrono::milliseconds timeout,
              std::shared_ptr<void> keep_alive = nullptr);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<gz::Store> store_;
  std::shared_ptr<void> keep_alive_;
};

/// @brief Rendezvous by our rules (gzrun's hosted store, torchrun's MASTER_PORT+1, mpirun, srun,
/// tcp://, file://) and return the store with this process's rank and world size.
struct RendezvousStore {
  c10::intrusive_ptr<GzC10dStore> store;
  int rank = 0;
  int world_size = 1;
};
RendezvousStore rendezvous_store(const std::string& init_method, std::chrono::milliseconds timeout);

}  // namespace gz::python
