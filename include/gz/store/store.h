// Key-value store used for rendezvous: ranks exchange addresses, counters and barriers through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gz/core/deadline.h"

namespace gz {

using Bytes = std::vector<uint8_t>;

/// @brief Bytes from a string and back (keys and small values are often text).
Bytes to_bytes(const std::string& s);
std::string to_string(const Bytes& b);

/// @brief Rendezvous key-value store. All methods are thread-safe. Blocking methods take a
/// deadline and throw gz::TimeoutError naming the missing keys when it passes.
class Store {
 public:
  virtual ~Store() = default;

  /// @brief Set key to value (overwrites) and wake waiters on that key.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  /// @brief Value of key, waiting until it exists or the deadline passes.
  virtual Bytes get(const std::string& key, Deadline deadline) = 0;
  Bytes get(const std::string& key) { return get(key, Deadline::after(timeout_)); }
  /// @brief Atomically add delta to the integer counter at key (missing = 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// @brief If key's value equals expected (or key is missing and expected is empty) set it to
  /// desired. Returns the value now stored.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  /// @brief Append value to key's bytes (missing = empty) in one step; returns the new length.
  /// Lets N ranks gather records under one key in one round trip each (store_allgather). The
  /// default is a compare-and-set loop; the TCP, file and memory stores do it natively.
  virtual int64_t append(const std::string& key, const Bytes& value);
  /// @brief Wait until every key exists.
  virtual void wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, Deadline::after(timeout_)); }
  /// @brief True when every key exists (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  /// @brief Remove key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  /// @brief Number of keys stored.
  virtual int64_t num_keys() = 0;

  /// @brief Timeout used by the overloads without a deadline.
  void set_timeout(Duration t) { timeout_ = t; }
  Duration timeout() const { return timeout_; }

 protected:
  Duration timeout_ = default_timeout();
};

/// @brief Barrier over a store: every one of `world` participants calls it with the same name.
void store_barrier(Store& store, const std::string& name, int world, Deadline deadline);

/// @brief An all-gather of small records through a store, in two halves: the constructor
/// publishes this rank's record (append + add: two round trips), collect() waits for every rank's
/// and returns them in rank order (wait + get: two more). Four round trips per rank whatever the
/// world size, where reading one key per rank takes `world`. `name` is used once per group.
class StoreAllgather {
 public:
  StoreAllgather(Store& store, std::string name, int rank, int world, const Bytes& mine);
  /// @brief Every rank's record, in rank order; TimeoutError naming the ranks not heard from.
  std::vector<Bytes> collect(Deadline deadline);

 private:
  Store& store_;
  std::string name_;
  int rank_, world_;
};

/// @brief StoreAllgather in one call.
std::vector<Bytes> store_allgather(Store& store, const std::string& name, int rank, int world, const Bytes& mine,
                                   Deadline deadline);

}  // namespace gz
