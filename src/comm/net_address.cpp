// Which local address do ranks listen on, and which one do other machines reach us on?
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "gz/comm/net_address.h"
#include "gz/core/error.h"

namespace gz::comm {
namespace {

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  const void* a = sa->sa_family == AF_INET6
                      ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr)
                      : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr);
  return inet_ntop(sa->sa_family, a, buf, sizeof(buf)) ? std::string(buf) : std::string();
}

struct LocalAddress {
  std::string iface, address;
  int family;
  bool link_local;
};

std::vector<LocalAddress> local_addresses() {
  ifaddrs* ifap = nullptr;
  if (getifaddrs(&ifap) != 0) throw SystemError("getifaddrs", errno);
  std::vector<LocalAddress> out;
  for (ifaddrs* ifa = ifap; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) {
      out.push_back({ifa->ifa_name, "", AF_UNSPEC, false});  // an interface without an address
      continue;
    }
    const int f = ifa->ifa_addr->sa_family;
    if (f != AF_INET && f != AF_INET6) continue;
    const bool ll =
        f == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr)->sin6_addr);
    out.push_back({ifa->ifa_name, address_text(ifa->ifa_addr), f, ll});
  }
  freeifaddrs(ifap);
  return out;
}

std::string describe(const std::vector<LocalAddress>& all) {
  std::string s;
  for (const auto& a : all)
    if (!a.address.empty()) s += (s.empty() ? "" : ", ") + a.iface + " " + a.address;
  return s.empty() ? "none" : s;
}

}  // namespace

bool is_ip_address(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

bool is_loopback_address(const std::string& s) {
  in_addr a4{};
  in6_addr a6{};
  if (inet_pton(AF_INET, s.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  return inet_pton(AF_INET6, s.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

std::string listen_address_for(const std::string& spec, const std::string& what) {
  if (spec.empty()) GZ_THROW(InvalidArgument, what, " is empty: give an interface name (eth0) or an address");
  const auto all = local_addresses();
  if (is_ip_address(spec)) {
    in6_addr want{}, have{};
    const bool v6 = inet_pton(AF_INET6, spec.c_str(), &want) == 1;
    for (const auto& a : all) {
      if (a.address.empty()) continue;
      if (a.address == spec) return spec;
      // The same IPv6 address written differently ("::1" vs "0:0::1").
      if (v6 && a.family == AF_INET6 && inet_pton(AF_INET6, a.address.c_str(), &have) == 1 &&
          std::memcmp(&want, &have, sizeof(want)) == 0)
        return a.address;
    }
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    GZ_THROW(InvalidArgument, what, "=", spec, " is not an address of this machine (", host,
             " has: ", describe(all), ")");
  }
  bool exists = false;
  std::string v6;
  for (const auto& a : all) {
    if (a.iface != spec) continue;
    exists = true;
    if (a.family == AF_INET) return a.address;  // IPv4 first, as Gloo and NCCL do
    if (a.family == AF_INET6 && !a.link_local && v6.empty()) v6 = a.address;
  }
  if (!v6.empty()) return v6;
  if (!exists && if_nametoindex(spec.c_str()) == 0) {
    std::vector<std::string> seen;
    std::string names;
    for (const auto& a : all) {
      if (std::find(seen.begin(), seen.end(), a.iface) != seen.end()) continue;
      seen.push_back(a.iface);
      names += (names.empty() ? "" : ", ") + a.iface;
    }
    GZ_THROW(InvalidArgument, what, "=", spec,
             ": no network interface of that name here (interfaces: ", names, "; or give an address)");
  }
  GZ_THROW(InvalidArgument, what, "=", spec, ": interface ", spec,
           " has no usable IP address (is it up and configured?); addresses here: ", describe(all));
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  if (rc != 0 || res == nullptr) GZ_THROW(InvalidArgument, "cannot resolve '", host, "': ", gai_strerror(rc));
  std::string out;
  int err = 0;
  for (addrinfo* ai = res; ai != nullptr && out.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    // connect() on a datagram socket only picks the route and source address; nothing is sent.
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
        out = address_text(reinterpret_cast<sockaddr*>(&ss));
      else
        err = errno;
    } else {
      err = errno;
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (out.empty()) throw SystemError("no local address routes to '" + host + "'", err);
  return out;
}

}  // namespace gz::comm
