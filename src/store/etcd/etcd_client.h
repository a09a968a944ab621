// The etcd v3 JSON gateway as the store needs it: unary calls (range, put, txn, deleterange) and
// watches, with failover across the members, authentication and a deadline on everything.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gz/store/etcd_store.h"
#include "store/etcd/http_conn.h"

namespace gz::etcd {

using json = nlohmann::json;

/// @brief Base64 as etcd's JSON carries bytes, and back (throws gz::PeerError on bad input).
std::string b64_encode(const std::string& raw);
std::string b64_decode(const std::string& text);
/// @brief An int64 field of an etcd JSON message (proto3 JSON writes them as strings); 0 when absent.
int64_t field_i64(const json& j, const char* name);

/// @brief etcd refused the request (a gRPC status through the gateway). `retry`: the member is
/// unavailable, has no leader, timed out or is overloaded, so another member may do better.
class ServerError : public Error {
 public:
  ServerError(const std::string& what, int code, bool retry) : Error(what), code_(code), retry_(retry) {}
  int code() const { return code_; }
  bool retry() const { return retry_; }

 private:
  int code_;
  bool retry_;
};

/// @brief A key change seen by a watch.
struct WatchEvent {
  std::string key;  ///< full etcd key
  std::string value;
  bool deleted = false;
  bool created = false;  ///< the key was created by this change (no earlier version)
};

/// @brief One watch stream (one HTTP connection to one member) on a set of keys.
class Watch {
 public:
  Watch(std::unique_ptr<HttpConn> conn, size_t member);
  /// @brief The next change of a watched key, or false when `deadline` passed first. Throws
  /// TransportError / ServerError when the stream broke or etcd cancelled it (no leader, ...).
  bool next(WatchEvent& ev, Deadline deadline);
  size_t member() const { return member_; }

 private:
  std::unique_ptr<HttpConn> conn_;
  size_t member_;
  std::string buf_;  // body bytes not yet parsed into messages
  std::vector<WatchEvent> ready_;
};

/// @brief Thread-safe client of one etcd cluster.
class Client {
 public:
  explicit Client(const EtcdStoreOptions& options);
  ~Client();
  /// @brief The first contact: authenticate (with a user) or read once, retrying until `deadline`.
  void connect(Deadline deadline);
  /// @brief POST `body` to `path` (e.g. "/v3/kv/range") on the current member, moving to the next
  /// on transport errors and retryable refusals until `deadline`. `member` (optional) tells which
  /// member answered. `what` names the operation in errors. Throws gz::TimeoutError (nobody
  /// answered in time, with each member's last error), gz::InvalidArgument / gz::Error (refused).
  json call(const std::string& path, const json& body, Deadline deadline, const std::string& what,
            size_t* member = nullptr);
  /// @brief Watch `keys` (full etcd keys) from revision `from` on the current member.
  std::unique_ptr<Watch> watch(const std::vector<std::string>& keys, int64_t from, Deadline deadline,
                               const std::string& what);
  /// @brief The member requests go to now ("http://host:port").
  std::string endpoint_now() const;
  size_t members() const { return eps_.size(); }

  static std::atomic<uint64_t> requests;  ///< HTTP requests of every client of this process

 private:
  using Attempt = std::function<void(size_t member, Deadline attempt_deadline)>;
  /// @brief Run `attempt` against the current member until it returns, moving on after
  /// transport errors and retryable refusals, refreshing the auth token once when it expired.
  void with_failover(const std::string& what, Deadline deadline, const Attempt& attempt);
  std::unique_ptr<HttpConn> take(size_t member, Deadline deadline);
  void give(size_t member, std::unique_ptr<HttpConn> conn);
  /// @brief Plain http on loopback with a password: throw gz::InvalidArgument unless the listener
  /// belongs to this user, root or "etcd" (anyone local can listen on a free port).
  void check_listener(const HttpConn& conn) const;
  Headers headers() const;
  void authenticate(size_t member, Deadline deadline);
  /// @brief Turn a non-200 answer into a ServerError (or InvalidArgument for bad requests).
  [[noreturn]] void refused(size_t member, const HttpResponse& r, const std::string& what) const;

  EtcdStoreOptions o_;
  std::vector<Endpoint> eps_;
  std::unique_ptr<TlsContext> tls_;
  std::atomic<size_t> cur_{0};
  mutable std::mutex mu_;
  std::vector<std::vector<std::unique_ptr<HttpConn>>> idle_;
  std::string token_;  // etcd auth token (guarded by mu_)
};

}  // namespace gz::etcd
