// gzrun: launches one worker per local slot, hosts the rendezvous store, supervises the group.
// See options.cpp (usage_text) for the command line, environment and exit codes.
#include <errno.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "elastic_rendezvous.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/store/store.h"
#include "job_monitor.h"
#include "launch_auth.h"
#include "options.h"
#include "output_relay.h"
#include "preflight.h"
#include "process.h"
#include "store_host.h"
#include "supervisor.h"
#include "verdict_report.h"

#ifndef GZ_VERSION
#define GZ_VERSION "unknown"
#endif

namespace {

using namespace gz::launcher;

// mkdir -p; returns an empty string or the error.
std::string make_dirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return cur + ": " + std::strerror(errno);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return path + ": not a directory";
  return "";
}

// --preflight: 0 = go on (or, alone, nothing flagged), 4 = flagged (strict, or alone), 1 = the
// check itself failed.
int preflight_step(const LaunchOptions& o, StoreHost& store) {
  PreflightOptions p;
  p.strict = o.preflight_strict;
  try {
    return run_preflight(o, store, p);
  } catch (const gz::Error& e) {
    say(std::string("error: --preflight: ") + e.what());
    return 1;
  }
}

// The command line, the environment's defaults, the program and the log directory; --analyze and
// --status, which need no job of their own. Returns an exit code when gzrun is done already
// (help, version, those two, bad input), else -1.
int parse(int argc, char** argv, const gz::Env& env, LaunchOptions& o, SupervisorConfig& cfg) {
  try {
    o = parse_options(std::vector<std::string>(argv + 1, argv + argc), detect_auto_nproc());
  } catch (const gz::Error& e) {
    say(std::string("error: ") + e.what());
    return 2;
  }
  // Before anything that can take long (--status waits for a job): ps must not show the token.
  hide_token_args(argc, argv, program_arg_index(argc, o));
  if (o.help) {
    std::string u = usage_text();
    write_all(1, u.data(), u.size());
    return 0;
  }
  if (o.version) {
    std::string v = std::string("gzrun (guozhuang) ") + GZ_VERSION + "\n";
    write_all(1, v.data(), v.size());
    return 0;
  }

  // Flight-recorder verdicts without a job of our own: offline, or asking a running one.
  if (!o.analyze_dir.empty()) return run_analyze(o.analyze_dir);
  try {
    apply_env_defaults(o, env.get("GZ_HEARTBEAT_TIMEOUT_S", ""), env.get("GZ_HEARTBEAT_INTERVAL_S", ""));
  } catch (const gz::Error& e) {
    say(std::string("error: ") + e.what());
    return 2;
  }
  if (o.status) return run_status_client(o, env.get("GZ_RDZV_TOKEN", ""));
  try {
    if (!o.program.empty()) cfg.program_path = resolve_program(o.program, env.get("PATH", ""));
  } catch (const gz::Error& e) {
    say(std::string("error: ") + e.what());
    return 2;
  }
  if (!o.log_dir.empty()) {
    std::string err = make_dirs(o.log_dir);
    if (!err.empty()) {
      say("error: cannot create --log-dir " + err);
      return 1;
    }
  }
  return -1;
}

// Elastic: the rendezvous assigns node ranks round by round; the store host is whoever owns
// --master-addr.
void elastic_rounds(const LaunchOptions& o, StoreHost& store, SupervisorConfig& cfg,
                    std::unique_ptr<ElasticRendezvous>& elastic) {
  auto me = cfg.hostname + ":" + launch_id();
  cfg.begin_round = [&store, &elastic, &o, me](int, const SupervisorConfig::Cancelled& c) {
    if (!elastic) {
      // etcd: a job of this --rdzv-id that ended, or died, is refused, not taken for ours.
      store.refuse_old_job();
      elastic = std::make_unique<ElasticRendezvous>(o, store.client(), me);
    }
    RoundInfo r = elastic->join(c);
    // TcpStore: MASTER_ADDR stays --master-addr (the store host). etcd: node 0's host.
    if (!o.etcd()) r.master_addr.clear();
    return r;
  };
  cfg.next_round = [&elastic](const RoundInfo& r, const JobFailure& f) {
    elastic->advance(r, f);
    return r.round + 1;
  };
  cfg.cannot_continue = [&elastic](const RoundInfo& r, const JobFailure& f) {
    return elastic->cannot_continue(r, f);
  };
  cfg.end_job = [&elastic](const std::string& reason, bool success) {
    if (elastic) elastic->end_job(reason, success);
  };
}

// Fixed node ranks: the nodes' gzruns meet in the store before every attempt.
void static_rounds(const LaunchOptions& o, StoreHost& store, SupervisorConfig& cfg) {
  cfg.begin_round = [&store, &o](int round, const SupervisorConfig::Cancelled& c) {
    RoundInfo r;
    r.round = r.restarts = round;
    r.node_rank = o.node_rank;
    r.nnodes = o.nnodes;
    // etcd: nobody hosts a store, so MASTER_ADDR is node 0's host (meet() tells it).
    r.run_id = store.meet(round, c, &r.master_addr);
    return r;
  };
  if (o.etcd())
    // The end marker in etcd (where a store outlives the job): a new job with this --rdzv-id is refused.
    cfg.end_job = [&store](const std::string& reason, bool success) {
      try {
        store.client().compare_set("gzrun/ended", gz::Bytes{},
                                   gz::to_bytes((success ? "done|" : "failed|") + reason));
      } catch (const std::exception&) {
        // the job ends anyway
      }
    };
}

// The process limits and the workers' common environment, ports and host.
void worker_setup(const gz::Env& env, const LaunchAuth& auth, const StoreHost& store, const LaunchOptions& o,
                  SupervisorConfig& cfg) {
  // Two pipes per worker: make room for large --nproc-per-node within the hard limit.
  rlimit nofile{};
  const rlim_t needed = static_cast<rlim_t>(o.nproc_per_node) * 2 + 64;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < needed) {
    nofile.rlim_cur = std::min(needed, nofile.rlim_max);
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  // Descendants that leave their worker's process group (setsid) are re-parented to gzrun
  // instead of init when their parent dies, so gzrun can still clean them up.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  cfg.base_env = env;
  // Workers get the token in their environment, never on a command line.
  if (!auth.token.empty()) cfg.base_env.set("GZ_RDZV_TOKEN", auth.token);
  if (auth.insecure) cfg.base_env.set("GZ_RDZV_INSECURE", "1");
  cfg.master_addr = o.master_addr;
  cfg.store_port = store.port();
  cfg.master_port = store.program_port();
  cfg.cores = usable_cores();
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) cfg.hostname = host;
}

int run(int argc, char** argv) {
  ensure_std_fds();
  const gz::Env env = gz::Env::from_process();
  LaunchOptions o;
  SupervisorConfig cfg;
  if (int code = parse(argc, argv, env, o, cfg); code >= 0) return code;

  // Rendezvous authentication: a token for every client of the store (launch_auth.h).
  LaunchAuth auth;
  try {
    auth = resolve_launch_auth(o, env.get("GZ_RDZV_TOKEN", ""));
  } catch (const gz::InvalidArgument& e) {
    say(std::string("error: ") + e.what());
    return 2;
  }
  for (const auto& w : auth.warnings) say("warning: " + w);

  StoreHost store(o, auth.token);
  try {
    store.start();
  } catch (const gz::Error& e) {
    say(std::string("error: ") + e.what());
    return 1;
  }
  if (o.preflight) {  // the pre-flight check (preflight.h): before any worker starts
    const int rc = preflight_step(o, store);
    if (rc != 0 || o.program.empty()) return rc;
  }

  worker_setup(env, auth, store, o, cfg);
  std::unique_ptr<JobMonitor> monitor;
  std::unique_ptr<ElasticRendezvous> elastic;
  if (o.elastic)
    elastic_rounds(o, store, cfg, elastic);
  else
    static_rounds(o, store, cfg);
  cfg.after_success = [&store](const RoundInfo& r, const SupervisorConfig::Cancelled& c,
                               const std::function<bool()>& failed) { return store.finish(r, c, failed); };
  // Several nodes: failures, lost nodes and restarts are decided job-wide through the store.
  if (o.nnodes > 1) {
    const std::string where = o.elastic || o.etcd() ? store.where() : "node 0 at " + store.where();
    monitor = std::make_unique<JobMonitor>(
        o, [&store] { return store.monitor_client(); }, where, store.hosts_store(),
        o.etcd() ? "etcd cluster" : "store host");
    cfg.monitor = monitor.get();
    if (!o.elastic)
      cfg.next_round = [m = monitor.get()](const RoundInfo& r, const JobFailure&) {
        return m->advance_round(r.round);
      };
  }
  // Several nodes: the verdict's reports and status requests go through the store.
  auto status_hook = std::make_shared<StatusWatcher*>(nullptr);
  // etcd: no gzrun hosts a store at master_port+1; the monitor's client reaches the cluster. tcp:
  // a client whose ops give up within a second, so that neither the report upload nor the status
  // watcher, both joined on the way out, delays the exit of a node cut off from the store.
  StoreConnect verdict_client;
  if (o.etcd())
    verdict_client = [&store] { return store.monitor_client(); };
  else
    verdict_client = verdict_store_client(o, auth.token);
  if (o.nnodes > 1) {
    cfg.store_client = verdict_client;
    cfg.ask_status = [status_hook] {
      if (*status_hook) (*status_hook)->ask_job();
    };
  }
  const std::string hostname = cfg.hostname;
  Supervisor sup(o, std::move(cfg));
  std::unique_ptr<StatusWatcher> watcher;  // destroyed before sup, whose board it reads
  if (o.nnodes > 1) {
    watcher = std::make_unique<StatusWatcher>(o, verdict_client, sup.board(), hostname);
    *status_hook = watcher.get();
  }
  return sup.run();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    say(std::string("error: ") + e.what());
    return 1;
  }
}
