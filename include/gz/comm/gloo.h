// Gloo backend: TCP collectives between ranks on any number of machines (Debian libgloo-dev).
// Compiled only when CMake found Gloo (GZ_HAVE_GLOO); create_gloo_communicator throws otherwise.
#pragma once

#include <memory>
#include <string>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief Knobs of the Gloo backend.
struct GlooOptions {
  /// @brief Default per-op timeout (also the connect timeout; Gloo itself allows 5x this for
  /// connect). An op's own OpOptions override it for that op.
  Duration timeout = default_timeout();
  /// @brief Address this rank listens on and advertises to peers. Empty = derived from `iface`,
  /// else GZ_SOCKET_IFNAME (or GZ_IFACE), else 127.0.0.1 (single machine).
  std::string hostname;
  /// @brief Network interface name ("eth0") or an IPv4/IPv6 address of this machine. Empty =
  /// GZ_SOCKET_IFNAME (or GZ_IFACE). Checked before connecting: see listen_address_for.
  std::string iface;
  /// @brief All-reduces of at most this many bytes run on a second, synchronous full mesh as one
  /// exchange: the calling thread writes its data into every peer's inbox (Gloo bound buffers,
  /// registered once) and reads theirs from the sockets itself, with no event-loop thread in
  /// between. -1 = GZ_GLOO_SYNC_MAX, else 64 KiB; 0 = none; capped at 256 KiB and at what a
  /// socket may queue unread (the exchange writes before it reads).
  long long sync_max_bytes = -1;
  /// @brief Larger all-reduces, reduce-scatter and all-gather run a pipelined ring on the same
  /// synchronous mesh, in segments of this many bytes: the calling thread writes segments to its
  /// right neighbour while it reads (and reduces) its left neighbour's, a few segments ahead, so
  /// both directions of every link stay busy; all-gather segments land in place. -1 =
  /// GZ_GLOO_SEGMENT, else 256 KiB; 0 = Gloo's own algorithms on the first mesh; capped at 4 MiB
  /// and at what a socket may queue unread (net.core.wmem_max). Every rank uses the smallest
  /// value of the group (and likewise for sync_max_bytes), so ranks may disagree.
  long long segment_bytes = -1;
  /// @brief For a communicator used (mostly) for point-to-point and new_group, as the
  /// hierarchical backend's one over all ranks: nothing connects at creation (no store traffic
  /// either); the pair to a peer is connected by the first send/recv between the two, so a rank
  /// holds connections only to the peers it talks to. A collective on it connects every pair
  /// first. No synchronous mesh (groups made with new_group are ordinary ones).
  bool p2p_only = false;
};

/// @brief Create the Gloo communicator of `rank` among `size` ranks. Collective: every rank calls
/// it with the same store (already namespaced for this group). Throws InvalidArgument when the
/// build has no Gloo or the interface/address asked for is not usable here (see
/// listen_address_for), TimeoutError when peers do not show up before the timeout, PeerError when
/// a peer's advertised address cannot be reached (naming the addresses).
///
/// Two full meshes of TCP connections: Gloo's own (asynchronous, an event-loop thread; broadcast,
/// reduce, barrier, point-to-point, and everything when the synchronous mesh is off) and, unless
/// sync_max_bytes and segment_bytes are both 0 or p2p_only is set, a synchronous one whose socket
/// I/O the calling thread does itself (all-reduce, reduce-scatter, all-gather). Connecting costs a
/// constant number of store round trips per rank.
///
/// Deadlines: every op's own; on the synchronous mesh they become the sockets' timeouts before
/// each blocking call, so a stuck peer ends the op as gz::TimeoutError at its deadline. An op that
/// fails there shuts down the connection it failed on, so that peer fails at once too.
///
/// abort(): the synchronous mesh's sockets are shut down (a reader blocked in recv() returns at
/// once) and every pair of both meshes is put into Gloo's error state, which wakes whatever waits
/// on it, Gloo's own algorithms included: a blocked op returns with gz::Aborted at once, and
/// peers blocked on this rank fail promptly (gz::PeerError). Every later op throws gz::Aborted.
///
/// Gloo writes to sockets without MSG_NOSIGNAL, so the first Gloo communicator sets SIGPIPE to
/// SIG_IGN when it still has the default disposition (a dead peer is then an error, not a crash).
CommPtr create_gloo_communicator(int rank, int size, std::shared_ptr<Store> store,
                                 const GlooOptions& options = {});

/// @brief The address to listen on for `spec`, a network interface name ("eth0": its IPv4
/// address, else its first IPv6 one that is not link-local) or an address of this machine (as
/// GZ_SOCKET_IFNAME / GLOO_SOCKET_IFNAME take). Throws InvalidArgument naming `what` (the
/// variable or option it came from), with this machine's interfaces or addresses, when the
/// interface does not exist, has no address, or the address is not local.
std::string listen_address_for(const std::string& spec, const std::string& what = "GZ_SOCKET_IFNAME");

/// @brief True for a literal IPv4 or IPv6 address.
bool is_ip_address(const std::string& s);
/// @brief True for 127.0.0.0/8 and ::1: addresses no other machine reaches.
bool is_loopback_address(const std::string& s);

/// @brief The local IPv4/IPv6 address the kernel would use to reach `host` (no packet is sent).
/// Used to pick the address other machines can reach. Throws SystemError when unroutable.
std::string local_address_towards(const std::string& host);

}  // namespace gz::comm
