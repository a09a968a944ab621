// A Store in an etcd cluster (etcd's v3 API through its JSON gateway): no process of the job hosts
// the store, so losing any one host (while the etcd cluster keeps its quorum) loses nothing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gz/store/store.h"

namespace gz {

/// @brief How to reach the etcd cluster and where the job's keys live in it.
///
/// Security, the same rule as the TcpStore's token: a client never hands its credentials to a
/// server that has not proved who it is. The password (and the auth token etcd returns for it)
/// only travels over https with the server's certificate verified (against `ca_file`, else the
/// system's trust store, and naming the host dialled), or to a loopback endpoint whose listening
/// process belongs to this user, root or the system user "etcd", or with `allow_insecure`. An endpoint beyond
/// loopback also needs some authentication of the client (a user and password, or a client certificate for
/// etcd's --client-cert-auth), unless `allow_insecure`.
struct EtcdStoreOptions {
  /// @brief The members' client URLs: "host:port", "http://host:port" or "https://host:port"
  /// (port 2379 when left out). Operations go to one member and move to the next when it does
  /// not answer, errs, or has lost its leader.
  std::vector<std::string> endpoints;
  /// @brief The job's namespace: every key of this store lives under "<prefix>/k/".
  std::string prefix = "/gz/default";
  std::string user;       ///< etcd user (its auth enabled); empty = no password authentication
  std::string password;   ///< that user's password (gzrun: the rendezvous token)
  std::string ca_file;    ///< https: CA certificate(s) that sign the members' certificates
  std::string cert_file;  ///< https: client certificate (etcd --client-cert-auth), with key_file
  std::string key_file;
  /// @brief Allow what the rule above forbids (plaintext credentials or no client
  /// authentication beyond loopback): only on a network where everyone who can reach it is trusted.
  bool allow_insecure = false;
  /// @brief Start with a member picked at random (the job's clients spread over the members, and
  /// losing one member moves only its share of them); false: the first endpoint.
  bool spread = true;
  /// @brief The first contact (authentication, reaching a member) may take this long; also the
  /// default timeout of the overloads without a deadline.
  Duration timeout = default_timeout();
  /// @brief The most one member gets of an operation before the next member is tried (the
  /// operation's own deadline bounds the whole).
  Duration attempt_timeout{2000};
  /// @brief While a get()/wait() watches, how often it checks (one read) that its member still
  /// answers and still has a leader; a silent member is left for the next after this long.
  Duration watch_check_interval{1000};
};

/// @brief Parse "h1:2379,h2:2379,https://h3:2379" into endpoints (spaces ignored). Throws
/// gz::InvalidArgument naming the bad entry or an empty list.
std::vector<std::string> parse_etcd_endpoints(const std::string& list);

/// @brief Throws gz::InvalidArgument, saying what to do, when `options` break the security rule
/// (see EtcdStoreOptions), or name no endpoint, a bad one, or a bad prefix. Returns warnings to
/// print (allow_insecure in effect beyond loopback).
std::vector<std::string> check_etcd_options(const EtcdStoreOptions& options);

/// @brief A Store whose data lives in etcd. Every operation keeps the Store semantics and its
/// deadline: set = put; add and append are compare-and-swap transactions that also record the
/// result under a per-client key, so retrying on another member after a member died mid-request
/// never applies them twice; compare_set is one transaction; get() and wait() watch the keys
/// (etcd's watch) rather than poll. Values are limited by etcd's --max-request-bytes (1.5 MiB by
/// default). The constructor contacts the cluster (authenticating when a user is set), retrying
/// until options.timeout; it throws gz::InvalidArgument for bad options or refused credentials,
/// gz::TimeoutError naming every endpoint's last error when no member answered.
class EtcdStore : public Store {
 public:
  explicit EtcdStore(const EtcdStoreOptions& options);
  ~EtcdStore() override;
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

  /// @brief Remove every key of this store's prefix (all clients' data, for a job that is over).
  /// Returns how many keys were removed.
  int64_t delete_all();
  /// @brief The member this client talks to now, for messages.
  std::string endpoint() const;
  /// @brief Requests (HTTP round trips to etcd) this process's EtcdStore clients have made.
  static uint64_t requests_sent();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gz
