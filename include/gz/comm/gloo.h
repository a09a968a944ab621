// Gloo backend: TCP collectives between ranks on any number of machines (Debian libgloo-dev).
// Compiled only when CMake found Gloo (GZ_HAVE_GLOO); create_gloo_communicator throws otherwise.
// How it works (two meshes, the synchronous one's exchange and ring): docs/multi-node.md, "The
// Gloo engine", and src/comm/gloo/.
#pragma once

#include <memory>
#include <string>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief Knobs of the Gloo backend.
struct GlooOptions {
  /// @brief Default per-op timeout, also the connect timeout. An op's own OpOptions override it.
  Duration timeout = default_timeout();
  /// @brief Address this rank listens on and advertises. Empty: from `iface`, else
  /// GZ_SOCKET_IFNAME (or GZ_IFACE), else 127.0.0.1 (single machine).
  std::string hostname;
  /// @brief Network interface name ("eth0") or an address of this machine; checked before
  /// connecting (an unknown interface or a foreign address is InvalidArgument). Empty:
  /// GZ_SOCKET_IFNAME (or GZ_IFACE).
  std::string iface;
  /// @brief All-reduces of at most this many bytes run as one exchange on the synchronous mesh.
  /// -1 = GZ_GLOO_SYNC_MAX, else 64 KiB; 0 = none; capped at 256 KiB and at what a socket may
  /// queue unread.
  long long sync_max_bytes = -1;
  /// @brief Larger all-reduces, reduce-scatter and all-gather run a pipelined ring on the
  /// synchronous mesh in segments of this many bytes. -1 = GZ_GLOO_SEGMENT, else 256 KiB; 0 =
  /// Gloo's own algorithms; capped at 4 MiB and at what a socket may queue unread. Every rank uses
  /// the group's smallest values (for this and sync_max_bytes), so ranks may ask for different ones.
  long long segment_bytes = -1;
  /// @brief For a communicator used mostly for point-to-point and new_group: nothing connects at
  /// creation; a pair is connected by the first send/recv between its two ranks (a collective
  /// connects every pair first). No synchronous mesh.
  bool p2p_only = false;
};

/// @brief Create the Gloo communicator of `rank` among `size` ranks. Collective: every rank calls
/// it with the same store (already namespaced for this group); connecting costs a constant number
/// of store round trips per rank.
///
/// Throws InvalidArgument when the build has no Gloo or the interface/address asked for is not
/// usable here, TimeoutError when peers do not show up before the timeout, PeerError when a peer's
/// advertised address cannot be reached (naming the addresses).
///
/// The op contract (docs/architecture.md): every op ends by its own deadline, for the whole op
/// whatever the peers send (TimeoutError naming the peer); a dead peer is PeerError. An op that
/// fails on the synchronous mesh (all-reduce, reduce-scatter, all-gather) shuts that mesh down
/// on this rank: every peer's op that still needs this rank fails at once, and every later such op
/// here fails at once naming the first failure (abort and recreate the communicator). abort()
/// wakes a blocked op with Aborted at once, makes peers blocked on this rank fail promptly, and
/// fails every later op with Aborted.
///
/// Gloo writes to sockets without MSG_NOSIGNAL: the first Gloo communicator sets SIGPIPE to
/// SIG_IGN when it still has the default disposition (a dead peer is then an error, not a crash).
CommPtr create_gloo_communicator(int rank, int size, std::shared_ptr<Store> store,
                                 const GlooOptions& options = {});

}  // namespace gz::comm
