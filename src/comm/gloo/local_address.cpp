// Which local address do other machines reach us on? Ask the routing table with a UDP connect.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gz/comm/gloo.h"
#include "gz/core/error.h"

namespace gz::comm {

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  if (rc != 0 || res == nullptr)
    GZ_THROW(InvalidArgument, "cannot resolve '", host, "': ", gai_strerror(rc));
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
      char buf[INET6_ADDRSTRLEN] = {0};
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        const void* a = ss.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                                                 : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
        if (inet_ntop(ss.ss_family, a, buf, sizeof(buf))) out = buf;
      } else {
        err = errno;
      }
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
