#include "options.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "gz/core/env.h"          // parse_int, parse_double
#include "gz/core/error.h"        // InvalidArgument
#include "gz/store/etcd_store.h"  // parse_etcd_endpoints
#include "gz/store/rdzv_auth.h"   // check_rdzv_token

namespace gz::launcher {
namespace {

enum class Kind { flag, value, optional };  // optional: --opt or --opt=value, never a separate value

struct Spec {
  const char* name;  // canonical dash spelling without the leading "--"
  Kind kind;
};

constexpr Spec kSpecs[] = {
    {"nproc-per-node", Kind::value},
    {"nnodes", Kind::value},
    {"node-rank", Kind::value},
    {"master-addr", Kind::value},
    {"master-port", Kind::value},
    {"log-dir", Kind::value},
    {"rdzv-timeout", Kind::value},
    {"max-restarts", Kind::value},
    {"recovery", Kind::value},
    {"grace-period", Kind::value},
    {"rdzv-endpoint", Kind::value},
    {"standalone", Kind::flag},
    {"help", Kind::flag},
    {"version", Kind::flag},
    {"heartbeat-timeout", Kind::value},
    {"heartbeat-interval", Kind::value},
    // Rendezvous authentication (launch_auth.h).
    {"rdzv-token", Kind::value},
    {"rdzv-token-file", Kind::value},
    {"rdzv-insecure", Kind::flag},
    {"rdzv-join-window", Kind::value},
    // The store backend (etcd): apply_backend_option().
    {"rdzv-backend", Kind::value},
    {"rdzv-endpoints", Kind::value},
    {"rdzv-id", Kind::value},
    {"rdzv-conf", Kind::value},
    // The pre-flight check (preflight.h): --preflight or --preflight=warn|strict.
    {"preflight", Kind::optional},
    // Flight-recorder verdicts.
    {"status", Kind::flag},
    {"analyze", Kind::value},
    {"dump-wait", Kind::value},
    {"verdict-wait", Kind::value},
    {"stuck", Kind::value},
};

const Spec* find_spec(const std::string& name) {
  for (const Spec& s : kSpecs)
    if (name == s.name) return &s;
  return nullptr;
}

int parse_bounded(const std::string& v, const std::string& opt, long long lo, long long hi) {
  long long n = parse_int(v, "--" + opt);
  if (n < lo || n > hi) GZ_THROW(InvalidArgument, "--", opt, " must be in [", lo, ", ", hi, "], got ", v);
  return static_cast<int>(n);
}

double parse_seconds(const std::string& v, const std::string& opt, bool allow_zero) {
  double s = parse_double(v, "--" + opt);
  if (!std::isfinite(s) || s < 0 || (!allow_zero && s == 0))
    GZ_THROW(InvalidArgument, "--", opt, " must be a ", allow_zero ? "non-negative" : "positive",
             " number of seconds, got ", v);
  return s;
}

LaunchOptions::Recovery parse_recovery(const std::string& v) {
  if (v == "restart") return LaunchOptions::Recovery::restart;
  if (v == "in-place" || v == "in_place") return LaunchOptions::Recovery::in_place;
  GZ_THROW(InvalidArgument, "--recovery '", v,
           "': expected restart (stop every worker, restart the job) or in-place (replace only the failed "
           "worker)");
}

void set_port(LaunchOptions& o, const std::string& v, const std::string& opt) {
  o.master_port = parse_bounded(v, opt, 0, 65535);
  o.master_port_given = true;
}

// ---- The store backend (etcd) -------------------------------------------------------------------

void apply_backend_option(LaunchOptions& o, const std::string& name, const std::string& v) {
  if (name == "rdzv-backend") {
    if (v == "tcp" || v == "c10d" || v == "static") {
      o.rdzv_backend = "tcp";
    } else if (v == "etcd" || v == "etcd-v3") {
      o.rdzv_backend = "etcd";
    } else {
      GZ_THROW(InvalidArgument, "--rdzv-backend '", v,
               "': expected tcp (gzrun's own store; also c10d, static) or etcd");
    }
  } else if (name == "rdzv-endpoints") {
    o.rdzv_endpoints = parse_etcd_endpoints(v);
  } else if (name == "rdzv-id") {
    // At most 120: gzrun's store proves "gzrun/<id>" (store names: 128 bytes at most).
    const bool ok = !v.empty() && v.size() <= 120 && std::all_of(v.begin(), v.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
    if (!ok) GZ_THROW(InvalidArgument, "--rdzv-id '", v, "': 1-120 letters, digits, '-', '_' or '.'");
    o.rdzv_id = v;
  } else if (name == "rdzv-conf") {
    // KEY=VALUE,KEY=VALUE (torchrun's form).
    size_t b = 0;
    while (b < v.size()) {
      size_t e = v.find(',', b);
      if (e == std::string::npos) e = v.size();
      const std::string item = v.substr(b, e - b);
      b = e + 1;
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      const std::string key = item.substr(0, eq), val = eq == std::string::npos ? "" : item.substr(eq + 1);
      if (eq == std::string::npos || val.empty())
        GZ_THROW(InvalidArgument, "--rdzv-conf '", item, "': expected KEY=VALUE");
      if (key == "user") {
        o.etcd_user = val;
      } else if (key == "cacert") {
        o.etcd_cacert = val;
      } else if (key == "cert") {
        o.etcd_cert = val;
      } else if (key == "key") {
        o.etcd_key = val;
      } else if (key == "root") {
        if (val[0] != '/' || val.back() == '/' || val.size() < 2)
          GZ_THROW(InvalidArgument, "--rdzv-conf root='", val, "': must start with '/' and not end with one");
        o.etcd_root = val;
      } else {
        GZ_THROW(InvalidArgument, "--rdzv-conf: unknown key '", key,
                 "' (known: user, cacert, cert, key, root)");
      }
    }
  }
}

void validate_backend(LaunchOptions& o) {
  if (!o.etcd()) {
    // --rdzv-id is the job's name with gzrun's own store too (its store proves it).
    if (!o.rdzv_endpoints.empty() || !o.etcd_user.empty() || !o.etcd_cacert.empty() || !o.etcd_cert.empty() ||
        !o.etcd_key.empty())
      GZ_THROW(InvalidArgument, "--rdzv-endpoints and --rdzv-conf are for --rdzv-backend etcd");
    return;
  }
  if (o.rdzv_endpoints.empty() && !o.rdzv_endpoint_text.empty()) {
    // torchrun's spelling: --rdzv-backend etcd --rdzv-endpoint HOST:PORT names etcd, not node 0.
    o.rdzv_endpoints = parse_etcd_endpoints(o.rdzv_endpoint_text);
    o.master_addr_given = false;
    o.master_addr = "127.0.0.1";
    if (o.master_port_from_endpoint) {
      o.master_port_given = false;
      o.master_port = 0;
    }
  }
  if (o.rdzv_endpoints.empty())
    GZ_THROW(InvalidArgument,
             "--rdzv-backend etcd needs --rdzv-endpoints HOST:2379,HOST:2379,... (the etcd members)");
  if (o.rdzv_id.empty())
    GZ_THROW(InvalidArgument,
             "--rdzv-backend etcd needs --rdzv-id JOB: the same on every node, new for every job "
             "(the job's keys live under ",
             o.etcd_root, "/JOB in etcd)");
  if (o.standalone)
    GZ_THROW(InvalidArgument, "--standalone hosts its own store: it cannot use --rdzv-backend etcd");
}

void apply(LaunchOptions& o, const std::string& name, const std::string& v, int auto_nproc) {
  if (name == "nproc-per-node") {
    if (v == "auto") {
      o.nproc_auto = true;
      o.nproc_per_node = auto_nproc;
    } else {
      o.nproc_auto = false;
      o.nproc_per_node = parse_bounded(v, name, 1, 65536);
    }
  } else if (name == "nnodes") {
    // torchrun's forms: N (fixed), MIN:MAX (elastic when MIN < MAX; N:N is fixed).
    auto colon = v.find(':');
    int lo = 0, hi = 0;
    if (colon == std::string::npos) {
      lo = hi = parse_bounded(v, name, 1, 65536);
    } else {
      lo = parse_bounded(v.substr(0, colon), name, 1, 65536);
      hi = parse_bounded(v.substr(colon + 1), name, 1, 65536);
      if (lo > hi) GZ_THROW(InvalidArgument, "--nnodes ", v, ": MIN must not be larger than MAX");
    }
    o.min_nodes = lo;
    o.max_nodes = o.nnodes = hi;
    o.elastic = lo < hi;
  } else if (name == "node-rank") {
    o.node_rank = parse_bounded(v, name, 0, 65535);
    o.node_rank_given = true;
  } else if (name == "master-addr") {
    if (v.empty()) GZ_THROW(InvalidArgument, "--master-addr must not be empty");
    o.master_addr = v;
    o.master_addr_given = true;
  } else if (name == "master-port") {
    set_port(o, v, name);
  } else if (name == "rdzv-endpoint") {
    o.rdzv_endpoint_text = v;  // with --rdzv-backend etcd: the etcd endpoint(s) (validate())
    auto colon = v.rfind(':');
    if (colon == std::string::npos || colon == 0)
      GZ_THROW(InvalidArgument, "--rdzv-endpoint must be HOST:PORT, got '", v, "'");
    o.master_addr = v.substr(0, colon);
    o.master_addr_given = true;
    set_port(o, v.substr(colon + 1), name);
    o.master_port_from_endpoint = true;
  } else if (name == "log-dir") {
    if (v.empty()) GZ_THROW(InvalidArgument, "--log-dir must not be empty");
    o.log_dir = v;
  } else if (name == "rdzv-timeout") {
    o.rdzv_timeout_s = parse_seconds(v, name, false);
  } else if (name == "max-restarts") {
    o.max_restarts = parse_bounded(v, name, 0, 1000000);
  } else if (name == "recovery") {
    o.recovery = parse_recovery(v);
  } else if (name == "grace-period") {
    o.grace_period_s = parse_seconds(v, name, true);
  } else if (name == "heartbeat-timeout") {
    o.heartbeat_timeout_s = parse_seconds(v, name, false);
    o.heartbeat_timeout_given = true;
  } else if (name == "heartbeat-interval") {
    o.heartbeat_interval_s = parse_seconds(v, name, false);
  } else if (name == "rdzv-token") {
    if (v.empty()) GZ_THROW(InvalidArgument, "--rdzv-token must not be empty");
    check_rdzv_token(v, "--rdzv-token");
    o.rdzv_token = v;
  } else if (name == "rdzv-token-file") {
    if (v.empty()) GZ_THROW(InvalidArgument, "--rdzv-token-file must not be empty");
    o.rdzv_token_file = v;
  } else if (name == "rdzv-join-window") {
    o.join_window_s = parse_seconds(v, name, true);
  } else if (name == "preflight") {
    if (!v.empty() && v != "warn" && v != "strict")
      GZ_THROW(InvalidArgument, "--preflight takes no value, =warn or =strict; got '", v, "'");
    o.preflight = true;
    o.preflight_strict = v == "strict";
  } else if (name == "analyze") {
    if (v.empty()) GZ_THROW(InvalidArgument, "--analyze needs a directory");
    o.analyze_dir = v;
  } else if (name == "dump-wait") {
    o.dump_wait_s = parse_seconds(v, name, true);
  } else if (name == "verdict-wait") {
    o.verdict_wait_s = parse_seconds(v, name, true);
  } else if (name == "stuck") {
    o.stuck_s = parse_seconds(v, name, true);
  } else {
    apply_backend_option(o, name, v);
  }
}

void validate(LaunchOptions& o) {
  if (o.help || o.version) return;
  validate_backend(o);
  if (o.status && o.etcd())
    GZ_THROW(InvalidArgument, "--status asks gzrun's own store and does not work with --rdzv-backend etcd yet; "
             "send SIGUSR1 to any of the job's gzruns instead (docs/debugging.md)");
  if (o.status || !o.analyze_dir.empty()) {
    if (!o.program.empty()) GZ_THROW(InvalidArgument, "--status and --analyze take no PROGRAM");
    if (o.status && !o.analyze_dir.empty()) GZ_THROW(InvalidArgument, "give either --status or --analyze");
    if (o.status && !o.master_port_given)
      GZ_THROW(InvalidArgument,
               "--status needs the job's --master-addr and --master-port (its store is on port+1)");
    return;
  }
  if (o.program.empty() && !o.preflight)
    GZ_THROW(InvalidArgument, "no program given (usage: gzrun [options] [--] PROGRAM [ARGS...])");
  if (o.preflight && o.etcd())
    GZ_THROW(InvalidArgument, "--preflight needs gzrun's own store (--rdzv-backend tcp): with etcd the nodes "
             "have no master address to find each other by");
  if (o.preflight && o.elastic)
    GZ_THROW(InvalidArgument, "--preflight needs a fixed --nnodes N (node ranks known in advance), not ",
             o.min_nodes, ":", o.max_nodes);
  if (o.standalone) {
    // torchrun's --standalone: one node, a free local port, no endpoint to agree on.
    if (o.nnodes != 1) GZ_THROW(InvalidArgument, "--standalone runs on one node, but --nnodes is ", o.nnodes);
    if (o.node_rank != 0)
      GZ_THROW(InvalidArgument, "--standalone runs on one node, but --node-rank is ", o.node_rank);
    if (!o.master_addr_given) o.master_addr = "127.0.0.1";
  }
  if (!o.rdzv_token.empty() && !o.rdzv_token_file.empty())
    GZ_THROW(InvalidArgument, "give either --rdzv-token or --rdzv-token-file, not both");
  if (o.elastic) {
    if (o.node_rank_given)
      GZ_THROW(InvalidArgument, "--node-rank cannot be combined with --nnodes ", o.min_nodes, ":",
               o.max_nodes, ": an elastic job's rendezvous assigns node ranks");
  }
  if (o.node_rank >= o.nnodes)
    GZ_THROW(InvalidArgument, "--node-rank ", o.node_rank, " must be smaller than --nnodes ", o.nnodes);
  if (o.nnodes > 1) {
    if (!o.master_port_given) o.master_port = kDefaultMultiNodePort;
    if (o.master_port == 0)
      GZ_THROW(InvalidArgument, "--master-port 0 (a free port) only works with one node: with --nnodes ",
               o.nnodes, " every node must know the port in advance");
    if (o.master_port >= 65535)
      GZ_THROW(InvalidArgument, "--master-port ", o.master_port, ": with --nnodes ", o.nnodes,
               " gzrun's store listens on MASTER_PORT+1, which must be a valid port");
  }
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > (1 << 24))
    GZ_THROW(InvalidArgument, "world size ", static_cast<long long>(o.nnodes) * o.nproc_per_node,
             " is too large");
}

}  // namespace

double LaunchOptions::effective_heartbeat_interval_s() const {
  if (heartbeat_interval_s > 0) return std::min(heartbeat_interval_s, heartbeat_timeout_s / 2);
  return std::clamp(heartbeat_timeout_s / 10, 0.05, 1.0);
}

void apply_env_defaults(LaunchOptions& o, const std::string& heartbeat_timeout,
                        const std::string& heartbeat_interval) {
  if (!o.heartbeat_timeout_given && !heartbeat_timeout.empty()) {
    o.heartbeat_timeout_s =
        parse_seconds(heartbeat_timeout, "heartbeat-timeout (GZ_HEARTBEAT_TIMEOUT_S)", false);
    o.heartbeat_timeout_given = true;
  }
  if (o.heartbeat_interval_s == 0 && !heartbeat_interval.empty())
    o.heartbeat_interval_s =
        parse_seconds(heartbeat_interval, "heartbeat-interval (GZ_HEARTBEAT_INTERVAL_S)", false);
}

LaunchOptions parse_options(const std::vector<std::string>& argv, int auto_nproc) {
  LaunchOptions o;
  size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h") {
      o.help = true;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') break;  // PROGRAM: the rest belongs to it
    if (a[1] != '-') GZ_THROW(InvalidArgument, "unknown option '", a, "' (see gzrun --help)");
    std::string body = a.substr(2);
    std::string value;
    bool has_value = false;
    auto eq = body.find('=');
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
      has_value = true;
    }
    for (char& c : body)
      if (c == '_') c = '-';
    const Spec* spec = find_spec(body);
    if (!spec) GZ_THROW(InvalidArgument, "unknown option '", a, "' (see gzrun --help)");
    if (spec->kind == Kind::optional) {
      apply(o, body, has_value ? value : "", auto_nproc);
      continue;
    }
    if (spec->kind == Kind::flag) {
      if (has_value) GZ_THROW(InvalidArgument, "option --", body, " takes no value");
      if (body == "standalone") o.standalone = true;
      if (body == "help") o.help = true;
      if (body == "version") o.version = true;
      if (body == "rdzv-insecure") o.rdzv_insecure = true;
      if (body == "status") o.status = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argv.size()) GZ_THROW(InvalidArgument, "option --", body, " needs a value");
      value = argv[++i];
    }
    apply(o, body, value, auto_nproc);
  }
  if (i < argv.size()) {
    o.program = argv[i];
    o.args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
  }
  validate(o);
  return o;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int detect_auto_nproc() {
  int gpus = 0;
  if (DIR* d = opendir("/dev")) {
    while (dirent* e = readdir(d)) {
      const char* n = e->d_name;
      if (std::strncmp(n, "nvidia", 6) != 0 || !n[6]) continue;
      bool digits = true;
      for (const char* p = n + 6; *p; ++p) digits = digits && std::isdigit(static_cast<unsigned char>(*p));
      if (digits) ++gpus;
    }
    closedir(d);
  }
  return gpus > 0 ? gpus : usable_cores();
}

std::string usage_text() {
  return R"(usage: gzrun [options] [--] PROGRAM [ARGS...]

Starts PROGRAM once per local worker, hosts the rendezvous store (on node rank 0; with
--rdzv-backend etcd an etcd cluster is the store) and supervises the workers: their output is
relayed line by line prefixed with "[rank] ", the first failure stops the whole group (SIGTERM,
then SIGKILL after the grace period).

options (underscores work too: --nproc_per_node; so does --opt=value):
  --nproc-per-node N|auto  workers on this node (auto: GPUs if /dev/nvidiaN exist, else cores); default 1
  --nnodes N|MIN:MAX       number of nodes (default 1). MIN:MAX (MIN < MAX): elastic job, node
                           ranks assigned by the rendezvous; it starts once MIN nodes joined and
                           the join window passed, or at once at MAX; a lost node leaves the
                           others to go on (a restart) while at least MIN remain; a node that
                           joins later is admitted at a new round (no restart counted)
  --node-rank R            this node's rank in [0, nnodes) (default 0; not with MIN:MAX)
  --rdzv-join-window S     elastic: after MIN nodes joined a round, wait this long for more
                           (default 10)
  --master-addr A          address of the store host (default 127.0.0.1): node rank 0, or with
                           MIN:MAX the gzrun on the host that owns this address
  --master-port P          the program's MASTER_PORT (rank 0 of a torch program binds it);
                           default: a free port on one node, 29500 on several. gzrun's own
                           store listens on a free port (one node) or P+1 (several nodes)
  --rdzv-endpoint A:P      same as --master-addr A --master-port P
  --standalone             single node on a free local port
  --log-dir DIR            also write each rank's output to DIR/rank_<r>.log
  --rdzv-timeout SECONDS   how long nodes wait for each other (default 900); exported to
                           workers as GZ_RDZV_TIMEOUT_S
  --max-restarts K         restart the job up to K times after a failure (default 0); with
                           several nodes the budget and the round are job-wide (in the store).
                           Elastic: a lost node costs one restart, admitting a node none
  --recovery MODE          what a failed worker (non-zero exit or signal) costs: restart
                           (default) = stop every worker and restart the job, as above;
                           in-place = gzrun starts a replacement for that local rank alone while
                           the other workers keep running (gz-train's Trainer with snapshots
                           recovers in its process: docs/reliability.md), at most --max-restarts
                           replacements per node and round; once they are spent the next failure
                           restarts the job as with restart
  --grace-period SECONDS   SIGTERM -> SIGKILL delay when stopping workers (default 5)
  --heartbeat-timeout S    several nodes: a node whose gzrun is silent this long is lost, and the
                           deadline of the job monitor's store operations (default 10; env
                           GZ_HEARTBEAT_TIMEOUT_S). Every node stops within it + 2 s
  --heartbeat-interval S   heartbeat and job-state poll period (default timeout/10 in
                           [0.05, 1]; env GZ_HEARTBEAT_INTERVAL_S)
  --rdzv-token-file FILE   the rendezvous token shared by every node: the first line of FILE
                           (keep it mode 600). Same as GZ_RDZV_TOKEN in the environment
  --rdzv-token TOKEN       the token on the command line (shown by ps until gzrun hides it; in
                           shell history: prefer the file or the variable)
  --rdzv-insecure          no token although several nodes share the store (warns): only on
                           a network (and machine) where everyone who can reach the port is trusted
  --rdzv-backend tcp|etcd  the job's store: tcp (default; also c10d, static) = gzrun's own store
                           on node 0, which the job cannot lose; etcd = an etcd cluster (v3 API),
                           nobody hosts it and losing any one host does not end the job
  --rdzv-endpoints LIST    etcd: the members, h1:2379,h2:2379,https://h3:2379 (--rdzv-endpoint
                           A:P works too, as in torchrun)
  --rdzv-id JOB            the job's name, the same on every node (at most 120 characters).
                           tcp: gzrun's store proves it, so a gzrun never joins another job's
                           store that shares its token and port (elastic jobs on one host).
                           etcd (required): new for every job; its keys live under /gz/JOB
                           (removed when the job succeeded)
  --rdzv-conf K=V,...      etcd: user=NAME (the etcd user; its password is the rendezvous token),
                           cacert=FILE (CA of the members' https certificates), cert=FILE and
                           key=FILE (client certificate), root=/gz (key root). The password only
                           goes over https with a verified certificate or to loopback, unless
                           --rdzv-insecure; beyond loopback the job must authenticate (user or
                           client certificate) unless --rdzv-insecure
  --preflight[=warn|strict] before the job (or alone, without PROGRAM) measure every node: link
                           bandwidth and round trip to its ring neighbours and a sample of other
                           nodes, GFLOP/s per local rank, free /dev/shm and memory; node 0 prints
                           a table flagging outliers (below half the median). =strict: do not
                           start the job when a node is flagged (exit 4). About 0.3 s of compute
                           per node and 4 MiB per probed pair (docs/debugging-slow.md)
  --dump-wait S            how long workers get to answer a dump request (default 1)
  --verdict-wait S         how long the verdict waits for the other nodes' reports (default 3)
  --status                 ask the running job at --master-addr/--master-port (with its token)
                           where every rank is and print the verdict; no PROGRAM. Or send
                           SIGUSR1 to any of the job's gzruns
  --stuck S                --status: a wait longer than S is a hang (default 1)
  --analyze DIR            judge a directory of dumps (rank-*.jsonl, gzrun reports) offline
  -h, --help               this text
  --version                print the version

worker environment: RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK NODE_RANK ROLE_RANK
  MASTER_ADDR MASTER_PORT GZ_LAUNCHER=gzrun GZ_STORE_HOSTED=1 GZ_STORE_ADDR GZ_STORE_PORT GZ_NNODES GZ_RUN_ID
  GZ_RESTART_COUNT TORCHELASTIC_RESTART_COUNT GZ_RDZV_TIMEOUT_S, OMP_NUM_THREADS (unless set)
  GZ_RECOVERY (restart or in_place) GZ_REPLACEMENT (how often this local rank was replaced in
  place in this round: 0 at its first start; a replacement keeps GZ_RESTART_COUNT and GZ_RUN_ID)
  and GZ_RDZV_TOKEN (GZ_RDZV_INSECURE=1 with --rdzv-insecure). With etcd GZ_STORE_BACKEND=etcd
  GZ_STORE_ENDPOINTS GZ_STORE_PREFIX [GZ_STORE_USER GZ_STORE_CACERT GZ_STORE_CERT GZ_STORE_KEY]
  replace GZ_STORE_ADDR/PORT. Workers read stdin from /dev/null.

rendezvous token: on one node gzrun generates a random token for its workers unless one is
given. With several nodes (also several gzruns on one machine: every local user reaches a
loopback port) every node needs the same token (--rdzv-token-file, GZ_RDZV_TOKEN or --rdzv-token), or
--rdzv-insecure; without either gzrun stops at once (exit 2). The token never appears on the
workers' command lines.

exit status:
  0        every worker exited 0
  1        a worker failed (non-zero exit or killed by a signal) and no restarts were left,
           or the launch itself failed (store port busy, nodes did not meet in time, ...)
  2        bad command line or PROGRAM not found
  4        --preflight flagged a node: with =strict the job was not started; without PROGRAM
           (the check alone) any flagged node
  128+N    gzrun received signal N (SIGINT/SIGTERM/SIGHUP), forwarded it to the workers and
           stopped them

when a job fails (or on --status / SIGUSR1) every worker's flight recorder is dumped
(GZ_DUMP_DIR: DIR/dumps/<run id> with --log-dir, else /tmp/gz-dumps/<run id>), node 0's gzrun
gathers them through the store and prints one verdict line naming the culprit rank and the
cause (docs/debugging.md).

several nodes: failures are decided job-wide through the store. A failed worker, a lost node
(no heartbeat) or a lost store host stops the workers of every node within the heartbeat timeout
+ 2 s, and every gzrun names the node, rank and cause. Restarts happen on all nodes together, in
a new round agreed in the store (GZ_RESTART_COUNT is the round), within the job-wide budget.
)";
}

}  // namespace gz::launcher
