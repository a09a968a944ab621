// Who is at the other end of a loopback TCP connection: every local process connects from
// 127.0.0.1 (or ::1), so the store server tells its unauthenticated loopback clients apart by the
// user owning the peer's socket, as the kernel reports it (sock_diag, the interface of `ss -e`;
// SO_PEERCRED exists only for Unix sockets). One user cannot then crowd another out of the
// server's slots for unauthenticated connections (admission.h).
#pragma once

#include <sys/socket.h>

#include <memory>
#include <string>

namespace gz::wire {

/// @brief Whether `addr` is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
bool is_loopback_peer(const sockaddr_storage& addr);

/// @brief Looks up the owners of loopback peers' sockets. One netlink socket, opened lazily;
/// not thread-safe (the server's loop owns it).
class PeerIdentity {
 public:
  PeerIdentity();
  ~PeerIdentity();
  PeerIdentity(const PeerIdentity&) = delete;
  PeerIdentity& operator=(const PeerIdentity&) = delete;

  /// @brief The uid owning the socket at `peer` connected to `local` on this host, or -1 when
  /// the kernel cannot tell (no sock_diag, the peer already closed).
  long long uid(const sockaddr_storage& peer, const sockaddr_storage& local);
  /// @brief The admission key of a connection: "local user <uid>" for a loopback peer whose
  /// owner is known, "loopback, user unknown" when it is not, else source_key(peer).
  std::string source(const sockaddr_storage& peer, const sockaddr_storage& local);
  /// @brief Whether the last lookup failed for want of sock_diag (logged once by the server).
  bool unavailable() const { return unavailable_; }

 private:
  int nl_ = -1;
  bool unavailable_ = false;
  unsigned seq_ = 0;
};

}  // namespace gz::wire
