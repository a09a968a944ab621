// gzrun with --rdzv-backend etcd: the etcd store's options from the command line, and the
// variables that send the workers to the same store (read back by gz::rendezvous, env://).
#pragma once

#include <map>
#include <string>

#include "gz/store/etcd_store.h"
#include "options.h"

namespace gz::launcher {

/// @brief The job's etcd store: --rdzv-endpoints under "<root>/<rdzv-id>", the --rdzv-conf user
/// with the rendezvous `token` as password, the TLS files; `insecure` (--rdzv-insecure) allows
/// what the security rule forbids. Every operation is bounded by the heartbeat timeout; one
/// member gets at most a quarter of it (a silent member is left in time for the monitor).
EtcdStoreOptions etcd_store_options(const LaunchOptions& o, const std::string& token, bool insecure);

/// @brief The workers' store variables: GZ_STORE_BACKEND=etcd, GZ_STORE_ENDPOINTS,
/// GZ_STORE_PREFIX, and GZ_STORE_USER / GZ_STORE_CACERT / GZ_STORE_CERT / GZ_STORE_KEY when set.
void add_etcd_worker_env(const LaunchOptions& o, std::map<std::string, std::string>& env);

/// @brief "etcd cluster at h1:2379,h2:2379 (job /gz/ID)", for messages.
std::string etcd_where(const LaunchOptions& o);

}  // namespace gz::launcher
