// TCP rendezvous store: a small server (inside rank 0 or inside gzrun) and a client per rank.
#pragma once

#include <memory>
#include <string>

#include "gz/store/store.h"

namespace gz {

/// @brief Server options.
///
/// A server that listens beyond loopback (any bind address but 127.0.0.0/8, ::1, localhost)
/// refuses to start without a token unless `allow_insecure` says so. Every connection starts with
/// a mutual challenge-response on the token (the token itself never travels; details in
/// docs/multi-node.md); until it succeeds a client may send its two small handshake messages and
/// nothing else, within `auth_timeout`. Unauthenticated connections are bounded in all and per
/// source (the local user owning the peer's socket for a peer on this host, whatever address it
/// dialled; else the peer's address): refused ones are
/// closed first, then the oldest of the source waiting with the most, authenticated ones never. A
/// correct proof is accepted as soon as it arrives, whatever others sent before it.
struct TcpStoreServerOptions {
  std::string bind_addr = "127.0.0.1";
  int port = 0;  ///< 0 = pick a free port; port() tells which.
  /// @brief Empty = no token: then, unless allow_insecure, the server listens on loopback only
  /// and admits only processes of its own local user (told by the kernel, see peer_identity.h), so
  /// a tokenless store of one node is not open to the machine's other users.
  std::string token;
  /// @brief What this server is, proved together with the token in every handshake (at most
  /// 128 bytes): a client that expects another name (TcpStoreOptions::server_name) refuses it.
  std::string name;
  /// @brief Without a token: listen beyond loopback, and admit every local user (trusted networks only).
  bool allow_insecure = false;
  size_t max_value_bytes = 64u << 20;  ///< larger messages are rejected
  size_t max_total_bytes = 1u << 30;   ///< total stored bytes cap
  size_t max_clients = 4096;           ///< authenticated connections
  Duration auth_timeout{5000};         ///< time from accept to a valid auth
  size_t max_pending_auth = 256;       ///< unauthenticated connections, all sources together
  /// @brief Unauthenticated connections waiting per source: a local user (for peers on this host),
  /// else an address (IPv6: its /64).
  size_t max_pending_per_source = 32;
};

/// @brief Counters of a running server (for tests, benchmarks and diagnostics).
struct TcpStoreServerStats {
  uint64_t accepted = 0;       ///< connections accepted
  uint64_t authenticated = 0;  ///< handshakes accepted
  uint64_t wrong_token = 0;    ///< auths refused for their proof (another token, or none)
  uint64_t bad_hello = 0;      ///< first messages refused otherwise (not a hello, malformed, version)
  uint64_t oversized = 0;      ///< first messages refused for their announced size, unread
  uint64_t auth_timeouts = 0;  ///< connections closed for sending no valid hello in time
  uint64_t evicted = 0;        ///< unauthenticated connections closed to free a slot
  /// @brief Looks at unauthenticated connections' input (one per arrival of bytes: a connection
  /// that stalls mid-message is not looked at again until more comes).
  uint64_t handshake_passes = 0;
  size_t clients = 0;             ///< authenticated connections open now
  size_t pending = 0;             ///< unauthenticated connections open now
  size_t peak_pending = 0;        ///< most unauthenticated connections open at once
  size_t peak_pending_bytes = 0;  ///< most input bytes one unauthenticated connection had buffered
};

/// @brief The store server; runs its own thread until stop() or destruction.
class TcpStoreServer {
 public:
  /// @brief Binds and starts serving. Throws gz::InvalidArgument for options that cannot work
  /// (a bind address beyond loopback without token or allow_insecure, a token that is too
  /// long) and gz::SystemError when the address cannot be bound.
  explicit TcpStoreServer(const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  int port() const;
  void stop();
  TcpStoreServerStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// @brief Client options.
struct TcpStoreOptions {
  /// @brief At most kMaxRdzvTokenBytes (gz/store/rdzv_auth.h). With a token the client uses only
  /// a server that proves it knows the same token, and never sends the token or anything derived
  /// from it before that proof.
  std::string token;
  /// @brief The server's name (TcpStoreServerOptions::name) this client expects; empty = any.
  std::string server_name;
  Duration timeout = default_timeout();  ///< connect + per-request default
};

/// @brief A Store backed by a TcpStoreServer.
///
/// Connecting retries until options.timeout when the server closes the connection without a
/// word (it sheds unauthenticated load that way) or does not answer. It fails at once, with
/// gz::Error naming the server, when the server refuses in words (token, protocol, too many
/// clients), answers with something that is not the store protocol, does not prove the token
/// (a server without one, or with another one: something else listens on that port) or names
/// itself otherwise than options.server_name.
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
