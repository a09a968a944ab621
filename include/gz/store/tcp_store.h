// TCP rendezvous store: a small server (inside rank 0 or inside gzrun) and a client per rank.
#pragma once

#include <memory>
#include <string>

#include "gz/store/store.h"

namespace gz {

/// @brief Server options. A non-empty token makes the server refuse clients without it.
struct TcpStoreServerOptions {
  std::string bind_addr = "0.0.0.0";
  int port = 0;  ///< 0 = pick a free port; port() tells which.
  std::string token;
  size_t max_value_bytes = 64u << 20;  ///< larger messages are rejected
  size_t max_total_bytes = 1u << 30;   ///< total stored bytes cap
  size_t max_clients = 4096;
};

/// @brief The store server; runs its own thread until stop() or destruction.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  int port() const;
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// @brief Client options.
struct TcpStoreOptions {
  std::string token;
  Duration timeout = default_timeout();  ///< connect + per-request default
};

/// @brief A Store backed by a TcpStoreServer. Connect retries until options.timeout.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, int port, const TcpStoreOptions& options = {});
  ~TcpStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;
  int64_t append(const std::string& key, const Bytes& value) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Deadline deadline) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::get;
  using Store::wait;

  /// @brief Requests (round trips to the server) this process's TcpStore clients have made, for
  /// checking that rendezvous costs each rank a number of round trips independent of the world.
  static uint64_t requests_sent();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gz
