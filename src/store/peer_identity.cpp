#include "store/peer_identity.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "store/admission.h"

namespace gz::wire {

namespace {

// The IPv4 address of a v4 or v4-mapped v6 peer, in network order; false for other v6.
bool v4_of(const sockaddr_storage& a, uint32_t& out, uint16_t& port) {
  if (a.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    out = s->sin_addr.s_addr;
    port = s->sin_port;
    return true;
  }
  auto* s6 = reinterpret_cast<const sockaddr_in6*>(&a);
  if (a.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
    std::memcpy(&out, s6->sin6_addr.s6_addr + 12, 4);
    port = s6->sin6_port;
    return true;
  }
  return false;
}

}  // namespace

bool is_loopback_peer(const sockaddr_storage& addr) {
  uint32_t v4 = 0;
  uint16_t port = 0;
  if (v4_of(addr, v4, port)) return (ntohl(v4) >> 24) == 127;
  if (addr.ss_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr);
  return false;
}

PeerIdentity::PeerIdentity() = default;

PeerIdentity::~PeerIdentity() {
  if (nl_ >= 0) ::close(nl_);
}

long long PeerIdentity::uid(const sockaddr_storage& peer, const sockaddr_storage& local) {
  if (nl_ < 0) {
    nl_ = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl_ < 0) {
      unavailable_ = true;
      return -1;
    }
    timeval tv{0, 100000};  // the kernel answers at once; never hang the server's loop on it
    setsockopt(nl_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.nlh.nlmsg_seq = ++seq_;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  // The peer's own socket: its source is the peer address, its destination our end.
  uint32_t p4 = 0, l4 = 0;
  uint16_t pport = 0, lport = 0;
  if (v4_of(peer, p4, pport) && v4_of(local, l4, lport)) {
    msg.req.sdiag_family = AF_INET;
    msg.req.id.idiag_src[0] = p4;
    msg.req.id.idiag_dst[0] = l4;
  } else if (peer.ss_family == AF_INET6 && local.ss_family == AF_INET6) {
    auto* p6 = reinterpret_cast<const sockaddr_in6*>(&peer);
    auto* l6 = reinterpret_cast<const sockaddr_in6*>(&local);
    msg.req.sdiag_family = AF_INET6;
    std::memcpy(msg.req.id.idiag_src, &p6->sin6_addr, 16);
    std::memcpy(msg.req.id.idiag_dst, &l6->sin6_addr, 16);
    pport = p6->sin6_port;
    lport = l6->sin6_port;
  } else {
    return -1;
  }
  msg.req.id.idiag_sport = pport;
  msg.req.id.idiag_dport = lport;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl_, &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    unavailable_ = true;
    return -1;
  }
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    const ssize_t got = ::recv(nl_, buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return -1;
    // The messages of the answer (NLMSG_OK/NLMSG_NEXT spelt out: their int arithmetic draws
    // sign-compare warnings).
    size_t len = static_cast<size_t>(got);
    for (const char* p = buf; len >= sizeof(nlmsghdr);) {
      const auto* h = reinterpret_cast<const nlmsghdr*>(p);
      if (h->nlmsg_len < sizeof(nlmsghdr) || h->nlmsg_len > len) break;
      const size_t step = std::min<size_t>(NLMSG_ALIGN(h->nlmsg_len), len);
      p += step;
      len -= step;
      if (h->nlmsg_seq != seq_) continue;  // a late answer to an earlier (timed-out) lookup
      if (h->nlmsg_type == NLMSG_ERROR) {
        const int err = -reinterpret_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
        // ENOENT: the peer is gone already; anything else: no sock_diag for TCP here.
        if (err != ENOENT) unavailable_ = true;
        return -1;
      }
      if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
        unavailable_ = false;
        // A socket its owner already closed (orphaned, or in TIME_WAIT) has no inode, and the
        // kernel reports uid 0 for it: not the owner's, so unknown (else a flood of connections
        // closed at once would count as root's).
        const auto* m = reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(h));
        return m->idiag_inode == 0 ? -1 : static_cast<long long>(m->idiag_uid);
      }
    }
  }
}

std::string PeerIdentity::source(const sockaddr_storage& peer, const sockaddr_storage& local) {
  if (!is_loopback_peer(peer)) return source_key(peer);
  const long long u = uid(peer, local);
  return u < 0 ? std::string("loopback, user unknown") : "local user " + std::to_string(u);
}

}  // namespace gz::wire
