// Who is at the other end of a TCP connection from this host: every local process connects from
// an address of this host (127.0.0.1, or the host's own address when it dials MASTER_ADDR), so the
// store server tells its unauthenticated local clients apart by the user owning the peer's socket,
// as the kernel reports it (sock_diag, the interface of `ss -e`; SO_PEERCRED exists only for Unix
// sockets). One user cannot then crowd another out of the server's slots for unauthenticated
// connections (admission.h), whichever local address either dials.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace gz::wire {

/// @brief Whether `addr` is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
bool is_loopback_peer(const sockaddr_storage& addr);

/// @brief Looks up the owners of local peers' sockets. One netlink socket, opened lazily; not
/// thread-safe (the server's loop owns it).
///
/// Whether sock_diag works here is probed once, on the server's own end of the first connection
/// (a socket that certainly exists): without it (no inet_diag/tcp_diag module, no netlink) every
/// lookup would fail, each one possibly asking the kernel to load the module, so none is made
/// until the probe is due again (a minute later).
class PeerIdentity {
 public:
  /// @brief `protocol`: of the sockets looked up (IPPROTO_TCP; tests give another to see the
  /// behaviour without sock_diag for TCP).
  explicit PeerIdentity(int protocol = IPPROTO_TCP);
  ~PeerIdentity();
  PeerIdentity(const PeerIdentity&) = delete;
  PeerIdentity& operator=(const PeerIdentity&) = delete;

  /// @brief The uid owning the socket at `peer` connected to `local`, when that socket is on this
  /// host (in this network namespace); -1 when it is not, or the kernel cannot tell (no
  /// sock_diag, the peer already closed).
  long long uid(const sockaddr_storage& peer, const sockaddr_storage& local);
  /// @brief For a client's connection from `local` to the server at `server` on this host: the uid
  /// owning the server's listening socket (its accepted one may not be accepted yet, and then
  /// belongs to nobody); -1 when unknown.
  long long listener_uid(const sockaddr_storage& server, const sockaddr_storage& local);
  /// @brief The admission key of a connection: "local user <uid>" for a peer on this host whose
  /// owner is known (whatever address it dialled), "loopback, user unknown" for a loopback peer
  /// whose owner is not, else source_key(peer).
  std::string source(const sockaddr_storage& peer, const sockaddr_storage& local);
  /// @brief The same key for a peer whose owner uid() already gave (-1: unknown).
  static std::string source_of(const sockaddr_storage& peer, long long uid);
  /// @brief Whether sock_diag was found missing (logged once by the server).
  bool unavailable() const { return unavailable_; }
  /// @brief Questions asked of the kernel so far (probes included).
  uint64_t queries() const { return queries_; }

 private:
  enum class Found { yes, no, failed };
  /// One sock_diag question: the socket whose source is `src` and destination `dst`.
  Found lookup(const sockaddr_storage& src, const sockaddr_storage& dst, long long& uid);
  /// Whether lookups are worth making now (probing with our own end when due).
  bool usable(const sockaddr_storage& peer, const sockaddr_storage& local);
  void give_up();

  int protocol_;
  int nl_ = -1;
  bool probed_ = false;
  bool unavailable_ = false;
  std::chrono::steady_clock::time_point retry_at_{};
  unsigned seq_ = 0;
  uint64_t queries_ = 0;
};

}  // namespace gz::wire
