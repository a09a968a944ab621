// The etcd store's options: the endpoint list and the security rule (who may send what where),
// checked before anything is sent.
#include <algorithm>

#include "gz/core/error.h"
#include "gz/store/etcd_store.h"
#include "gz/store/rdzv_auth.h"    // is_loopback_host
#include "store/etcd/http_conn.h"  // parse_endpoint

namespace gz {

std::vector<std::string> parse_etcd_endpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= list.size()) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    std::string item = list.substr(b, e - b);
    item.erase(std::remove_if(item.begin(), item.end(), [](char c) { return c == ' ' || c == '\t'; }),
               item.end());
    if (!item.empty()) {
      etcd::parse_endpoint(item);  // validates
      out.push_back(item);
    }
    b = e + 1;
  }
  if (out.empty())
    GZ_THROW(InvalidArgument, "no etcd endpoint in '", list, "' (expected host:port,host:port,...)");
  return out;
}

std::vector<std::string> check_etcd_options(const EtcdStoreOptions& o) {
  std::vector<std::string> warnings;
  if (o.endpoints.empty()) GZ_THROW(InvalidArgument, "etcd store: no endpoint given");
  if (o.prefix.size() < 2 || o.prefix[0] != '/' || o.prefix.back() == '/')
    GZ_THROW(InvalidArgument, "etcd store: prefix '", o.prefix, "' must start with '/' and not end with one");
  if (!o.user.empty() && o.password.empty())
    GZ_THROW(InvalidArgument, "etcd user '", o.user, "' needs a password (gzrun: the rendezvous token)");
  if (o.user.empty() && !o.password.empty())
    GZ_THROW(InvalidArgument, "an etcd password (the rendezvous token) needs an etcd user to go with it");
  const bool client_cert = !o.cert_file.empty();
  std::string clear, unauthenticated;
  bool any_tls = false;
  for (const auto& text : o.endpoints) {
    const etcd::Endpoint ep = etcd::parse_endpoint(text);
    any_tls = any_tls || ep.tls;
    if (is_loopback_host(ep.host)) continue;
    if (!ep.tls) clear += (clear.empty() ? "" : ", ") + ep.url();
    if (!(ep.tls && client_cert) && o.user.empty())
      unauthenticated += (unauthenticated.empty() ? "" : ", ") + ep.url();
  }
  if (!any_tls && (client_cert || !o.ca_file.empty()))
    warnings.push_back("etcd: TLS files are given but no endpoint is https://: they are not used");
  if (!o.user.empty() && !clear.empty()) {
    if (!o.allow_insecure)
      GZ_THROW(InvalidArgument, "the etcd password (the rendezvous token) would travel in clear text to ",
               clear,
               ", which has not proved who it is: use https:// endpoints and the CA that signs the members' "
               "certificates (gzrun --rdzv-conf cacert=FILE), or allow it on a network you trust completely "
               "(--rdzv-insecure)");
    warnings.push_back("the etcd password (the rendezvous token) travels in clear text to " + clear +
                       " (--rdzv-insecure): anyone on the network path can read it");
  }
  if (!unauthenticated.empty()) {
    if (!o.allow_insecure)
      GZ_THROW(
          InvalidArgument, "the etcd cluster at ", unauthenticated,
          " is reachable beyond loopback, so the job must authenticate to it: an etcd user whose password is "
          "the rendezvous token (over https://), or a client certificate (https:// with etcd's "
          "--client-cert-auth); or allow an open etcd on a network you trust completely (--rdzv-insecure)");
    warnings.push_back(
        "etcd at " + unauthenticated +
        " is used without authentication (--rdzv-insecure): anyone who can reach it can read and "
        "change the job's keys");
  }
  return warnings;
}

}  // namespace gz
