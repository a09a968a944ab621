// Which local address a rank listens on, and which one other machines reach it on (the Gloo
// backend, the factory's choice of interface, gzrun's pre-flight check).
#pragma once

#include <string>

namespace gz::comm {

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
/// Throws SystemError when unroutable.
std::string local_address_towards(const std::string& host);

}  // namespace gz::comm
