#include "etcd_backend.h"

#include <algorithm>
#include <chrono>

namespace gz::launcher {

EtcdStoreOptions etcd_store_options(const LaunchOptions& o, const std::string& token, bool insecure) {
  EtcdStoreOptions e;
  e.endpoints = o.rdzv_endpoints;
  e.prefix = o.etcd_prefix();
  e.user = o.etcd_user;
  if (!e.user.empty()) e.password = token;
  e.ca_file = o.etcd_cacert;
  e.cert_file = o.etcd_cert;
  e.key_file = o.etcd_key;
  e.allow_insecure = insecure;
  const auto hb = std::chrono::milliseconds(static_cast<long long>(o.heartbeat_timeout_s * 1000));
  e.timeout = hb;
  e.attempt_timeout = std::clamp<Duration>(hb / 4, Duration(250), Duration(2000));
  e.watch_check_interval = std::clamp<Duration>(hb / 4, Duration(250), Duration(1000));
  return e;
}

void add_etcd_worker_env(const LaunchOptions& o, std::map<std::string, std::string>& env) {
  std::string list;
  for (const auto& e : o.rdzv_endpoints) list += (list.empty() ? "" : ",") + e;
  env["GZ_STORE_BACKEND"] = "etcd";
  env["GZ_STORE_ENDPOINTS"] = list;
  env["GZ_STORE_PREFIX"] = o.etcd_prefix();
  const std::pair<const char*, const std::string*> extra[] = {{"GZ_STORE_USER", &o.etcd_user},
                                                              {"GZ_STORE_CACERT", &o.etcd_cacert},
                                                              {"GZ_STORE_CERT", &o.etcd_cert},
                                                              {"GZ_STORE_KEY", &o.etcd_key}};
  for (const auto& [name, value] : extra)
    if (!value->empty()) env[name] = *value;
}

std::string etcd_where(const LaunchOptions& o) {
  std::string list;
  for (const auto& e : o.rdzv_endpoints) list += (list.empty() ? "" : ",") + e;
  return "etcd cluster at " + list + " (job " + o.etcd_prefix() + ")";
}

}  // namespace gz::launcher
