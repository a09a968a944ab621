// Who may join this job's rendezvous: the token gzrun uses, hands its workers and requires of
// everyone reaching the store, decided from the options and the environment. A store reachable
// beyond loopback is never left open by accident.
#pragma once

#include <string>
#include <vector>

#include "options.h"

namespace gz::launcher {

/// @brief The outcome of resolve_launch_auth().
struct LaunchAuth {
  std::string token;       ///< empty: none (--rdzv-insecure)
  bool insecure = false;   ///< --rdzv-insecure in effect: no token
  bool generated = false;  ///< gzrun made the token (one node, none given)
  std::vector<std::string> warnings;  ///< to print at start
};

/// @brief Whether the job's store is reachable beyond loopback: --master-addr is not a loopback
/// literal (node 0 then binds all interfaces, the other nodes reach it over the network).
bool store_beyond_loopback(const LaunchOptions& o);

/// @brief Address node 0's store binds: the loopback literal given (127.0.0.1 for "localhost"),
/// else all interfaces.
std::string store_bind_addr(const LaunchOptions& o);

/// @brief The token, in this order: --rdzv-token-file, --rdzv-token, GZ_RDZV_TOKEN (`env_token`);
/// else one generated for a single node; else, for several nodes (on loopback too: every local
/// user reaches it), --rdzv-insecure or a gz::InvalidArgument that says what to do (gzrun exits 2
/// with it). With --rdzv-backend etcd the token is the --rdzv-conf user's password, and
/// check_etcd_options() decides (a password only over verified https or to loopback; beyond
/// loopback some client authentication; else --rdzv-insecure, which warns).
LaunchAuth resolve_launch_auth(const LaunchOptions& o, const std::string& env_token);

/// @brief Overwrite the value of --rdzv-token in gzrun's own argv (what ps and /proc/PID/cmdline
/// show) with '*'. `program_index` is where PROGRAM starts (its arguments are left alone).
void hide_token_args(int argc, char** argv, int program_index);

/// @brief Where PROGRAM starts in gzrun's argv as `o` was parsed from it: argc when there is none
/// (--status, --preflight alone), so that a token at the end of the line is still hidden.
int program_arg_index(int argc, const LaunchOptions& o);

}  // namespace gz::launcher
