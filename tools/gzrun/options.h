// gzrun command line: torchrun-compatible option names (dash or underscore spellings, --opt=value).
#pragma once

#include <string>
#include <vector>

namespace gz::launcher {

/// @brief Everything gzrun was asked to do, validated and with defaults resolved.
struct LaunchOptions {
  int nproc_per_node = 1;
  bool nproc_auto = false;  ///< "--nproc-per-node auto" was given (value already resolved)
  /// @brief Fixed-size jobs: the number of nodes. Elastic jobs: max_nodes (the most there can be).
  int nnodes = 1;
  int node_rank = 0;
  bool node_rank_given = false;
  /// @brief "--nnodes MIN:MAX" with MIN < MAX: nodes join a rendezvous that assigns node ranks; the
  /// job runs on every round's members (at least MIN, at most MAX), see elastic_rendezvous.h.
  bool elastic = false;
  int min_nodes = 1;
  int max_nodes = 1;
  /// @brief Elastic: once MIN nodes have joined a round, how long to wait for more (up to MAX)
  /// before the round starts (torchrun's last-call timeout). At MAX it starts at once.
  double join_window_s = 10;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;
  /// @brief The program's MASTER_PORT (torch's TCPStore, bound by the program's rank 0; gzrun
  /// only checks that it is free). 0 = a free port (single node only). Default: 0 on one node,
  /// 29500 on many. gzrun's own store listens elsewhere (store_port()).
  int master_port = 0;
  bool master_port_given = false;
  std::string log_dir;          ///< empty = no per-rank log files
  double rdzv_timeout_s = 900;  ///< how long nodes wait for each other (and workers for the store)
  int max_restarts = 0;
  /// @brief What a failed worker costs. restart: stop every worker of the job and start a new
  /// round (torchrun's way). in_place: replace only the failed worker, the others keep running
  /// and rebuild their communicator with it; --max-restarts replacements per node and round,
  /// then the restart path.
  enum class Recovery { restart, in_place };
  Recovery recovery = Recovery::restart;
  bool standalone = false;
  double grace_period_s = 5;  ///< SIGTERM -> SIGKILL delay when stopping workers
  /// @brief Multi-node failure detection: a node whose gzrun has not heartbeaten for this long is
  /// lost, and it is also the deadline of every store operation of the job monitor (a store host
  /// that does not answer for this long is lost). Every node stops within this + 2 s.
  double heartbeat_timeout_s = 10;
  bool heartbeat_timeout_given = false;
  /// @brief How often each gzrun heartbeats and reads the job state; 0 = heartbeat_timeout / 10,
  /// clamped to [0.05 s, 1 s].
  double heartbeat_interval_s = 0;
  /// @brief Rendezvous authentication (see launch_auth.h): a token given on the command line
  /// (hidden from ps once parsed), a file holding it, or an explicit opt-out.
  std::string rdzv_token;
  std::string rdzv_token_file;
  bool rdzv_insecure = false;
  // ---- The job's store backend (torchrun's option names). Default: gzrun's TcpStore, hosted by
  // node 0 (elastic: by the host owning --master-addr). "etcd": an etcd cluster, so that no node
  // hosts the store and losing any one host does not end the job (see docs/reliability.md).
  std::string rdzv_backend = "tcp";  ///< --rdzv-backend: "tcp" (also c10d, static) or "etcd"
  std::vector<std::string>
      rdzv_endpoints;   ///< --rdzv-endpoints (etcd members); with etcd also --rdzv-endpoint
  std::string rdzv_id;  ///< --rdzv-id: the job's name (etcd: keys under "<root>/<id>")
  /// @brief --rdzv-conf user=NAME,cacert=FILE,cert=FILE,key=FILE,root=/gz: the etcd user whose
  /// password is the rendezvous token; TLS files for https:// endpoints; the key root.
  std::string etcd_user, etcd_cacert, etcd_cert, etcd_key, etcd_root = "/gz";
  std::string rdzv_endpoint_text;  ///< --rdzv-endpoint as given (with etcd: the endpoints)
  bool master_port_from_endpoint = false;
  bool etcd() const { return rdzv_backend == "etcd"; }
  /// @brief The job's key prefix in etcd: "<root>/<rdzv-id>".
  std::string etcd_prefix() const { return etcd_root + "/" + rdzv_id; }
  /// @brief The name gzrun's TcpStore proves in every handshake: "gzrun", or "gzrun/<rdzv-id>".
  /// A gzrun never takes another store that shares its token (a program's own, another job's
  /// elastic store on the same host and port) for its job's.
  std::string store_name() const { return rdzv_id.empty() ? "gzrun" : "gzrun/" + rdzv_id; }

  // Flight-recorder verdicts (dump_collector.h, verdict_report.h; docs/debugging.md).
  bool status = false;        ///< --status: ask the running job for its picture (no PROGRAM)
  std::string analyze_dir;    ///< --analyze DIR: judge a directory of dumps offline (no PROGRAM)
  double dump_wait_s = 1;     ///< --dump-wait: how long workers get to answer a dump request
  double verdict_wait_s = 3;  ///< --verdict-wait: how long the verdict waits for other nodes' reports
  double stuck_s = 1;         ///< --stuck: in a status picture, a wait longer than this is a hang
  bool help = false;
  bool version = false;
  // --- the pre-flight check (preflight.h) ---
  /// @brief --preflight[=warn|strict]: measure every node before the job (or alone without a
  /// PROGRAM); strict refuses to start it when a node is flagged.
  bool preflight = false;
  bool preflight_strict = false;
  // --- end pre-flight ---
  std::string program;            ///< as given (resolved through PATH later)
  std::vector<std::string> args;  ///< arguments after PROGRAM, untouched

  /// @brief Whether a failed worker is replaced in place (--recovery in-place).
  bool in_place() const { return recovery == Recovery::in_place; }
  /// @brief Total number of workers in the job.
  int world_size() const { return nnodes * nproc_per_node; }
  /// @brief The heartbeat interval in effect (see heartbeat_interval_s).
  double effective_heartbeat_interval_s() const;
  /// @brief Port of gzrun's own store (workers get it as GZ_STORE_PORT): 0 (a free port) on one
  /// node, MASTER_PORT + 1 on several (every node must know it in advance), so it never takes
  /// the program's MASTER_PORT.
  int store_port() const { return nnodes == 1 ? 0 : master_port + 1; }
};

/// @brief Default store port when several nodes meet (torchrun's default).
constexpr int kDefaultMultiNodePort = 29500;

/// @brief Parse argv (without argv[0]). Throws gz::InvalidArgument with a message naming the
/// offending option. `auto_nproc` resolves "--nproc-per-node auto".
LaunchOptions parse_options(const std::vector<std::string>& argv, int auto_nproc);

/// @brief Apply GZ_HEARTBEAT_TIMEOUT_S / GZ_HEARTBEAT_INTERVAL_S where the options were not given.
/// Throws gz::InvalidArgument naming the variable.
void apply_env_defaults(LaunchOptions& o, const std::string& heartbeat_timeout,
                        const std::string& heartbeat_interval);

/// @brief Workers for "--nproc-per-node auto": GPUs (/dev/nvidia[0-9]*) when present, else cores.
int detect_auto_nproc();

/// @brief CPU cores this process may run on (sched_getaffinity), at least 1.
int usable_cores();

/// @brief The --help text.
std::string usage_text();

}  // namespace gz::launcher
