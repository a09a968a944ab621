// Starting and describing worker processes; gzrun's signal self-pipe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace gz::launcher {

/// @brief What to start. Everything is prepared before fork(): the child only makes
/// async-signal-safe calls (gzrun may have a store server thread running).
struct SpawnRequest {
  std::string path;               ///< resolved executable
  std::vector<std::string> argv;  ///< argv[0] = program as the user wrote it
  std::vector<std::string> envp;  ///< "KEY=VALUE"
  int stdin_fd = -1;              ///< e.g. /dev/null
  int stdout_fd = -1;             ///< pipe write ends
  int stderr_fd = -1;
};

/// @brief fork + exec one worker as the leader of its own process group, with
/// PR_SET_PDEATHSIG(SIGKILL) so it dies with gzrun, default signal dispositions and only
/// fds 0-2 open. Throws gz::SystemError when fork fails. An exec failure shows up as the
/// child writing a message to its stderr and exiting 127.
pid_t spawn_worker(const SpawnRequest& request);

/// @brief Resolve PROGRAM like execvp: names with '/' are taken as they are, others are searched
/// in `path_var` (PATH). Throws gz::InvalidArgument naming the program when nothing executable
/// is found.
std::string resolve_program(const std::string& program, const std::string& path_var);

/// @brief "SIGKILL", "SIGTERM", ... ("signal 42" when unknown).
std::string signal_name(int sig);

/// @brief "exited with code 3" / "killed by signal 9 (SIGKILL)" for a waitpid() status.
std::string describe_status(int status);

/// @brief For a worker that died of a signal gzrun did not send: a hint at the likely cause
/// (SIGKILL: the out-of-memory killer, as a memory cgroup's or the kernel's), else "".
std::string unexpected_death_hint(int status);

/// @brief Pids whose parent is `parent` (from /proc). With gzrun as a child subreaper this
/// finds descendants that escaped their worker's process group (setsid) once the worker died.
std::vector<pid_t> list_children(pid_t parent);

/// @brief Make sure fds 0, 1 and 2 are open (on /dev/null when closed), so that pipes gzrun
/// creates never land on them.
void ensure_std_fds();

/// @brief Self-pipe for SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGUSR1; SIGPIPE is ignored (a closed
/// console must not kill gzrun while workers run).
class SignalPipe {
 public:
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  /// @brief Read end, for poll().
  int fd() const;
  /// @brief Signals caught since the last call, in arrival order (non-blocking).
  std::vector<int> take();
};

}  // namespace gz::launcher
