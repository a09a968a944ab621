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

// How long sock_diag, found missing, is left alone before it is probed again.
constexpr std::chrono::seconds kRetryProbe{60};

PeerIdentity::PeerIdentity(int protocol) : protocol_(protocol) {}

PeerIdentity::~PeerIdentity() {
  if (nl_ >= 0) ::close(nl_);
}

void PeerIdentity::give_up() {
  unavailable_ = true;
  retry_at_ = std::chrono::steady_clock::now() + kRetryProbe;
}

PeerIdentity::Found PeerIdentity::lookup(const sockaddr_storage& src, const sockaddr_storage& dst,
                                         long long& uid) {
  ++queries_;
  if (nl_ < 0) {
    nl_ = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl_ < 0) return Found::failed;
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
  msg.req.sdiag_protocol = static_cast<uint8_t>(protocol_);
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  uint32_t s4 = 0, d4 = 0;
  uint16_t sport = 0, dport = 0;
  if (v4_of(src, s4, sport) && v4_of(dst, d4, dport)) {
    msg.req.sdiag_family = AF_INET;
    msg.req.id.idiag_src[0] = s4;
    msg.req.id.idiag_dst[0] = d4;
  } else if (src.ss_family == AF_INET6 && dst.ss_family == AF_INET6) {
    auto* s6 = reinterpret_cast<const sockaddr_in6*>(&src);
    auto* d6 = reinterpret_cast<const sockaddr_in6*>(&dst);
    msg.req.sdiag_family = AF_INET6;
    std::memcpy(msg.req.id.idiag_src, &s6->sin6_addr, 16);
    std::memcpy(msg.req.id.idiag_dst, &d6->sin6_addr, 16);
    sport = s6->sin6_port;
    dport = d6->sin6_port;
  } else {
    return Found::no;
  }
  msg.req.id.idiag_sport = sport;
  msg.req.id.idiag_dport = dport;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl_, &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return Found::failed;
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    const ssize_t got = ::recv(nl_, buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Found::failed;
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
        // ENOENT: no such socket here (a remote peer, or one gone already), or no module for
        // the protocol (the probe tells these apart); anything else: no sock_diag here.
        const int err = -reinterpret_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
        return err == ENOENT ? Found::no : Found::failed;
      }
      if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
        // A socket its owner already closed (orphaned, or in TIME_WAIT) has no inode, and the
        // kernel reports uid 0 for it: not the owner's, so unknown (else a flood of connections
        // closed at once would count as root's).
        const auto* m = reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(h));
        if (m->idiag_inode == 0) return Found::no;
        uid = static_cast<long long>(m->idiag_uid);
        return Found::yes;
      }
    }
  }
}

bool PeerIdentity::usable(const sockaddr_storage& peer, const sockaddr_storage& local) {
  if (probed_ && !(unavailable_ && std::chrono::steady_clock::now() >= retry_at_)) return !unavailable_;
  probed_ = true;
  // Our own end of this connection exists for sure: if the kernel cannot find it, it cannot
  // find anyone's.
  long long mine = -1;
  if (lookup(local, peer, mine) == Found::yes) {
    unavailable_ = false;
    return true;
  }
  give_up();
  return false;
}

long long PeerIdentity::uid(const sockaddr_storage& peer, const sockaddr_storage& local) {
  if (!usable(peer, local)) return -1;
  long long u = -1;
  // The peer's own socket: its source is the peer address, its destination our end.
  const Found f = lookup(peer, local, u);
  if (f == Found::failed) give_up();
  return f == Found::yes ? u : -1;
}

long long PeerIdentity::listener_uid(const sockaddr_storage& server, const sockaddr_storage& local) {
  if (!usable(server, local)) return -1;
  // The kernel looks a socket up as it would for an arriving packet: established ones first, then
  // listeners. From our address's port 0 nothing is established, so the answer is the listener.
  sockaddr_storage nobody = local;
  if (nobody.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&nobody)->sin_port = 0;
  if (nobody.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&nobody)->sin6_port = 0;
  long long u = -1;
  const Found f = lookup(server, nobody, u);
  if (f == Found::failed) give_up();
  return f == Found::yes ? u : -1;
}

std::string PeerIdentity::source(const sockaddr_storage& peer, const sockaddr_storage& local) {
  return source_of(peer, uid(peer, local));
}

std::string PeerIdentity::source_of(const sockaddr_storage& peer, long long u) {
  if (u >= 0) return "local user " + std::to_string(u);
  return is_loopback_peer(peer) ? std::string("loopback, user unknown") : source_key(peer);
}

}  // namespace gz::wire
