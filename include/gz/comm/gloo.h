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
  /// @brief Network interface name ("eth0") or an IPv4/IPv6 address. Empty = GZ_SOCKET_IFNAME
  /// (or GZ_IFACE).
  std::string iface;
  /// @brief All-reduces of at most this many bytes run on a second, synchronous full mesh: the
  /// calling thread writes its data into every peer's inbox (Gloo bound buffers, registered once)
  /// and reads theirs from the sockets itself, one exchange with no event-loop thread in between.
  /// Larger ones (and every other op) use Gloo's ring on the first, asynchronous mesh. 0 = no
  /// second mesh; -1 = GZ_GLOO_SYNC_MAX, else 0. Experimental, opt-in: its connect fails now and
  /// then at 7 ranks, and it finds its sockets by scanning /proc/self/fd, which races with other
  /// threads' descriptors (ThreadSanitizer). Capped at 256 KiB (the exchange relies on the
  /// kernel's socket buffers holding one message per peer).
  long long sync_max_bytes = -1;
};

/// @brief Create the Gloo communicator of `rank` among `size` ranks. Collective: every rank calls
/// it with the same store (already namespaced for this group). Throws InvalidArgument when the
/// build has no Gloo, TimeoutError when peers do not show up before the timeout.
///
/// abort(): every pair of this rank is put into Gloo's error state. That wakes whatever waits on
/// it, Gloo's own algorithms included, so a blocked op returns with gz::Aborted at once; it also
/// closes the TCP connections, so peers blocked on this rank fail promptly (gz::PeerError). Every
/// later op throws gz::Aborted.
///
/// Gloo writes to sockets without MSG_NOSIGNAL, so the first Gloo communicator sets SIGPIPE to
/// SIG_IGN when it still has the default disposition (a dead peer is then an error, not a crash).
CommPtr create_gloo_communicator(int rank, int size, std::shared_ptr<Store> store,
                                 const GlooOptions& options = {});

/// @brief The local IPv4/IPv6 address the kernel would use to reach `host` (no packet is sent).
/// Used to pick the address other machines can reach. Throws SystemError when unroutable.
std::string local_address_towards(const std::string& host);

}  // namespace gz::comm
