#include "supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "gz/core/error.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rendezvous.h"
#include "gz/store/round_move.h"
#include "gz/store/store.h"
#include "verdict_report.h"
#include "worker_env.h"

namespace gz::launcher {

Supervisor::Supervisor(const LaunchOptions& options, SupervisorConfig config)
    : o_(options), c_(std::move(config)) {
  devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

Supervisor::~Supervisor() {
  // Every exit path, exceptions included: nothing of ours keeps running.
  kill_all_groups(SIGKILL, true);
  if (upload_.joinable()) upload_.join();
  if (verdict_.joinable()) verdict_.join();
  if (devnull_ >= 0) ::close(devnull_);
}

bool Supervisor::poll_interrupt() {
  for (int s : signals_.take()) on_signal(s);
  return interrupt_sig_ != 0;
}

int Supervisor::run() {
  const int rc = run_rounds();
  // A verdict still being judged in the background is printed before gzrun exits.
  if (verdict_.joinable()) verdict_.join();
  return rc;
}

int Supervisor::run_rounds() {
  const SupervisorConfig::Cancelled cancelled = [this] { return poll_interrupt(); };
  JobMonitor* mon = c_.monitor;
  for (int expected = 0;;) {
    if (poll_interrupt()) return 128 + interrupt_sig_;  // e.g. Ctrl-C between two rounds
    RoundInfo r;
    try {
      if (c_.begin_round) {
        r = c_.begin_round(expected, cancelled);
      } else {
        r.round = r.restarts = expected;
        r.node_rank = o_.node_rank;
        r.nnodes = o_.nnodes;
        r.run_id = launch_id() + "-" + std::to_string(expected);
      }
    } catch (const std::exception& e) {
      if (interrupt_sig_) return 128 + interrupt_sig_;
      say(std::string("error: ") + e.what());
      return 1;
    }
    if (r.job_done) {
      say("the job finished before this node was admitted: nothing to run");
      return 0;
    }
    round_ = r;
    job_failure_seen_ = false;
    if (mon) mon->start_round(r.round, r.node_rank, r.nnodes);
    Outcome out = run_attempt();
    r = round_;             // a move in place may have taken this node to a later round
    // A failed move ended the round already (JobMonitor::end_round); like a failed rendezvous
    // it ends this node only: the other nodes see it lost and go on without it.
    if (!fatal_.empty() && out != Outcome::interrupted) {
      say("error: " + fatal_);
      return 1;
    }
    if (out == Outcome::success) {
      SupervisorConfig::Finish f = SupervisorConfig::Finish::done;
      if (c_.after_success) {
        std::function<bool()> job_failed = [mon] { return mon && mon->failure().failed(); };
        f = c_.after_success(r, cancelled, job_failed);
      }
      if (f == SupervisorConfig::Finish::job_failed) {
        on_job_failure();
        out = Outcome::failed;
      } else {
        if (mon) mon->end_round();
        if (interrupt_sig_) return 128 + interrupt_sig_;
        if (f == SupervisorConfig::Finish::done) end_job("every worker exited 0", true);
        if (r.restarts > 0) say("all workers exited 0 (after " + std::to_string(r.restarts) + " restart(s))");
        return f == SupervisorConfig::Finish::done ? 0 : 1;
      }
    }
    int next = r.round + 1;
    const int rc = after_failure(out, next);
    if (rc >= 0) return rc;
    expected = next;
  }
}

void Supervisor::end_job(const std::string& reason, bool success) {
  if (c_.end_job) c_.end_job(reason, success);
}

int Supervisor::after_failure(Outcome out, int& next) {
  JobMonitor* mon = c_.monitor;
  const RoundInfo& r = round_;
  if (mon) {
    mon->end_round();
    on_job_failure();  // the job-wide report, also when the local workers ended before it came
  }
  print_verdict(mon ? mon->failure() : JobFailure{});
  if (out == Outcome::interrupted) {
    end_job("gzrun of node " + std::to_string(r.node_rank) + " received " + signal_name(interrupt_sig_),
            false);
    return 128 + interrupt_sig_;
  }
  // The job's failure (the first one recorded in the store) names the node, rank and cause.
  JobFailure jf = mon ? mon->failure() : JobFailure{};
  const std::string cause = jf.failed() ? jf.text : failure_;
  if (jf.kind == JobFailure::Kind::store_lost || jf.kind == JobFailure::Kind::interrupted) {
    say("giving up (no restart possible): " + cause);
    end_job(cause, false);
    return 1;
  }
  if (o_.elastic && jf.kind == JobFailure::Kind::node_lost && jf.node == r.node_rank) {
    // The others declared this node lost (it was stopped or cut off and is back): they decide
    // about the job; this node only asks to be admitted again.
    say("the other nodes declared this node lost; asking to join the job again");
    next = r.round + 1;
    return -1;
  }
  const bool admit = jf.kind == JobFailure::Kind::admit;
  if (!admit && r.restarts >= o_.max_restarts) {
    std::string why;
    if (o_.max_restarts > 0)
      why = std::string("giving up after ") + std::to_string(o_.max_restarts) + (mon ? " job-wide" : "") +
            " restart(s); last failure: " + cause;
    else if (mon)
      why = "job failed (no restarts allowed): " + cause;
    if (!why.empty()) say(why);
    end_job(why.empty() ? cause : why, false);
    return 1;
  }
  if (c_.cannot_continue) {
    std::string why;
    try {
      why = c_.cannot_continue(r, jf);
    } catch (const std::exception& e) {
      why = std::string("cannot read the job's membership from the store: ") + e.what();
    }
    if (!why.empty()) {
      say("giving up: " + why);
      end_job(why, false);
      return 1;
    }
  }
  if (c_.next_round) {
    try {
      next = c_.next_round(r, jf);
    } catch (const std::exception& e) {
      say(std::string("error: cannot agree on the next round through the store: ") + e.what());
      return 1;
    }
  }
  if (admit)
    say("new round " + std::to_string(next) + " to admit waiting node(s) (no restart counted): " + cause);
  else
    say(std::string("restarting all ") + (mon ? "nodes' " : "local ") + "workers (restart " +
        std::to_string(r.restarts + 1) + " of " + std::to_string(o_.max_restarts) +
        (mon ? ", job-wide round " : "") + (mon ? std::to_string(next) : std::string()) +
        ") after: " + cause);
  return -1;
}

void Supervisor::publish_local(int kind, const std::string& what) {
  if (!c_.monitor) return;
  JobFailure f;
  f.kind = static_cast<JobFailure::Kind>(kind);
  f.node = round_.node_rank;
  f.text = "node " + std::to_string(round_.node_rank) +
           (c_.hostname.empty() ? "" : " (" + c_.hostname + ")") + ": " + what;
  c_.monitor->report_local(std::move(f));
}

void Supervisor::on_job_failure() {
  if (!c_.monitor || job_failure_seen_) return;
  JobFailure f = c_.monitor->failure();
  if (!f.failed()) return;
  job_failure_seen_ = true;
  if (can_move_in_place(f)) {
    say((f.kind == JobFailure::Kind::admit ? "round " + std::to_string(round_.round) + " ends: "
                                           : "job failure in round " + std::to_string(round_.round) + ": ") +
        f.text + "; moving the local workers to the next round in place");
    move_pending_ = true;
    return;
  }
  if (f.kind != JobFailure::Kind::admit) collect_for_verdict();
  if (f.kind == JobFailure::Kind::admit)
    say("round " + std::to_string(round_.round) + " ends: " + f.text);
  else
    say("job failure in round " + std::to_string(round_.round) + ": " + f.text);
  if (failure_.empty()) failure_ = f.text;
  if (!stopping_ && !all_reaped()) {
    say("stopping the local workers (SIGTERM, then SIGKILL after " +
        format_duration(std::chrono::milliseconds(static_cast<long long>(o_.grace_period_s * 1000))) + ")");
    begin_stop(SIGTERM);
  }
}

void Supervisor::open_logs() {
  if (o_.log_dir.empty()) return;
  const int attempt = round_.round;
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
    int rank = rank_of(round_.node_rank, lr);
    std::string path = o_.log_dir + "/rank_" + std::to_string(rank) + ".log";
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (attempt == 0 ? O_TRUNC : 0);
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) {
      say("warning: cannot open " + path + ": " + std::strerror(errno));
      continue;
    }
    relay_.set_log(rank, fd);
  }
  if (attempt > 0) relay_.note_in_logs("[gzrun] restart " + std::to_string(attempt));
}

bool Supervisor::any_finished() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& x) {
    return !x.alive && WIFEXITED(x.status) && WEXITSTATUS(x.status) == 0;
  });
}

int Supervisor::rank_of(int node_rank, int local_rank) const {
  return node_rank * o_.nproc_per_node + local_rank;
}

bool Supervisor::can_move_in_place(const JobFailure& f) const {
  using K = JobFailure::Kind;
  if (!o_.in_place() || !o_.elastic || stopping_ || !failure_.empty() || all_reaped() || !c_.store_client)
    return false;
  // A worker that finished means the job is ending; this node declared lost restarts its own.
  if (any_finished()) return false;
  if (f.kind != K::admit &&
      !(f.kind == K::node_lost && f.node != round_.node_rank && round_.restarts < o_.max_restarts))
    return false;
  // Each live worker must follow moves now (gz::accept_moves: the Trainer, while it trains);
  // a program that cannot adopt a new rank is stopped and restarted as before.
  try {
    PrefixStore run(run_prefix(round_.run_id), c_.store_client());
    for (const Worker& w : workers_)
      if (w.alive && !round_accepts(run, w.rank)) return false;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void Supervisor::stop_for(const JobFailure& jf) {
  if (failure_.empty()) failure_ = jf.text;
  if (jf.kind != JobFailure::Kind::admit) collect_for_verdict();
  if (!stopping_ && !all_reaped()) begin_stop(SIGTERM);
}

void Supervisor::tell_moves(const RoundInfo& old, const RoundInfo& next, const std::string& why) {
  // The store may be slow to answer right after a node was lost: a few tries, each a fresh client.
  for (int attempt = 1;; ++attempt) {
    try {
      PrefixStore run(run_prefix(old.run_id), c_.store_client());
      for (const Worker& w : workers_) {
        if (!w.alive) continue;
        RoundMove m{next.round,
                    next.run_id,
                    rank_of(next.node_rank, w.local_rank),
                    next.nnodes * o_.nproc_per_node,
                    next.node_rank,
                    next.nnodes,
                    why};
        run.set(round_move_key(w.rank), to_bytes(encode_round_move(m)));
      }
      return;
    } catch (const std::exception&) {
      if (attempt >= 3) throw;
    }
  }
}

bool Supervisor::claim_moves(const RoundInfo& round, const std::vector<int>& ranks) {
  try {
    PrefixStore run(run_prefix(round.run_id), c_.store_client());
    if (claim_round_moves(run, ranks)) return true;
    say("a local worker withdrew from moves (its training ended): stopping the local workers instead");
  } catch (const std::exception& e) {
    say(std::string("cannot claim the local workers for a move: ") + e.what());
    release_moves(round, ranks);
  }
  return false;
}

bool Supervisor::commit_moves(const RoundInfo& round, const std::vector<int>& ranks) {
  // A few tries, each a fresh client, as tell_moves: a commit found done already counts as done.
  bool all = false;
  for (int attempt = 1;; ++attempt) {
    try {
      PrefixStore run(run_prefix(round.run_id), c_.store_client());
      all = commit_round_moves(run, ranks);
      break;
    } catch (const std::exception&) {
      if (attempt >= 3) throw;
    }
  }
  if (all) return true;
  say("a local worker withdrew from moves (its training ended) while this node joined the next round: "
      "stopping the local workers instead of moving them");
  return false;
}

void Supervisor::stop_in_joined_round() {
  // This node is in the new round but brings no worker: the job's failure in that round sends
  // every node on to the next one (the other nodes' moved workers are moved again or stopped),
  // and this node's workers restart there, as after a failed claim.
  const std::string what =
      "its workers withdrew from moves while it joined round " + std::to_string(round_.round);
  publish_local(static_cast<int>(JobFailure::Kind::worker), what);
  if (failure_.empty()) failure_ = "node " + std::to_string(round_.node_rank) + ": " + what;
  collect_for_verdict();
  if (!stopping_ && !all_reaped()) begin_stop(SIGTERM);
}

void Supervisor::release_moves(const RoundInfo& round, const std::vector<int>& ranks) {
  try {
    PrefixStore run(run_prefix(round.run_id), c_.store_client());
    release_round_moves(run, ranks);
  } catch (const std::exception&) {
    // The store is gone: the workers stop on SIGTERM (a withdrawing one fails at its timeout).
  }
}

void Supervisor::move_in_place() {
  move_pending_ = false;
  const JobFailure jf = c_.monitor->failure();
  // Workers may have exited, or this node started stopping, since the failure was read.
  if (!can_move_in_place(jf)) return stop_for(jf);
  std::string why;
  try {
    if (c_.cannot_continue) why = c_.cannot_continue(round_, jf);
  } catch (const std::exception& e) {
    why = std::string("cannot read the job's membership from the store: ") + e.what();
  }
  if (!why.empty()) return stop_for(jf);  // the normal path gives up with this reason
  const RoundInfo old = round_;
  // Claimed before this node joins the next round: a worker that withdraws from moves from here
  // on (the Trainer after its final evaluation) learns that its notice follows, and one that
  // withdrew already fails the claim, which leaves the restart path open.
  std::vector<int> live;
  for (const Worker& w : workers_)
    if (w.alive) live.push_back(w.rank);
  if (!claim_moves(old, live)) return stop_for(jf);
  RoundInfo next;
  bool committed = false;
  try {
    c_.monitor->end_round();
    next = c_.begin_round(c_.next_round(old, jf), [this] { return poll_interrupt(); });
    if (next.job_done) GZ_THROW(Error, "the job ended while this node joined round ", old.round + 1);
    // The claims become final ("moving") only now: a worker that withdrew at its deadline while
    // this node joined the round makes this fail, and no notice is written for anyone.
    committed = commit_moves(old, live);
    if (committed) tell_moves(old, next, jf.text);
  } catch (const std::exception& e) {
    release_moves(old, live);
    fatal_ = std::string("cannot move the workers to the next round in place: ") + e.what();
    failure_ = fatal_;
    begin_stop(interrupt_sig_ ? interrupt_sig_ : SIGTERM);
    return;
  }
  round_ = next;
  job_failure_seen_ = false;
  c_.monitor->start_round(next.round, next.node_rank, next.nnodes);
  enter_round();
  if (!committed) return stop_in_joined_round();
  std::map<int, int> moved;
  for (Worker& w : workers_) {
    const int rank = rank_of(next.node_rank, w.local_rank);
    if (w.alive) moved[w.rank] = rank;
    w.rank = rank;
    if (w.alive) board_.add(WorkerView{rank, w.local_rank, w.pid, true, 0, false, false, 0});
  }
  for (const auto& [was, now] : moved)
    relay_.note_in_log(was, "[gzrun] moved in place to round " + std::to_string(next.round) + " as rank " +
                                std::to_string(now) + " (was rank " + std::to_string(was) + ")");
  relay_.relabel(moved);
  replacements_.assign(static_cast<size_t>(o_.nproc_per_node), 0);
  say("round " + std::to_string(next.round) + ": node " + std::to_string(next.node_rank) + " of " +
      std::to_string(next.nnodes) + "; the local workers keep running as ranks " +
      std::to_string(rank_of(next.node_rank, 0)) + "-" + std::to_string(rank_of(next.node_rank + 1, -1)) +
      " (were " + std::to_string(rank_of(old.node_rank, 0)) + "-" +
      std::to_string(rank_of(old.node_rank + 1, -1)) + ")");
}

void Supervisor::enter_round() {
  attempt_ = AttemptInfo{};
  attempt_.attempt = round_.round;
  attempt_.run_id = round_.run_id;
  attempt_.node_rank = round_.node_rank;
  attempt_.nnodes = round_.nnodes;
  attempt_.master_addr = round_.master_addr.empty() ? c_.master_addr : round_.master_addr;
  attempt_.master_port = c_.master_port;
  attempt_.store_port = c_.store_port;
  attempt_.cores = c_.cores;
  board_.start_round(round_.run_id, c_.base_env.get("GZ_DUMP_DIR", dump_dir_for(o_, round_.run_id)),
                     round_.node_rank, round_.nnodes, round_.round);
  collected_ = false;
  report_.clear();
}

void Supervisor::start_workers() {
  enter_round();
  for (int lr = 0; lr < o_.nproc_per_node; ++lr)
    if (!start_worker(lr, 0)) return;
}

bool Supervisor::start_worker(int lr, int replacement) {
  const int rank = rank_of(round_.node_rank, lr);
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  try {
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
      throw SystemError("pipe2 for rank " + std::to_string(rank), errno);
    SpawnRequest r;
    r.path = c_.program_path;
    r.argv = {o_.program};
    r.argv.insert(r.argv.end(), o_.args.begin(), o_.args.end());
    r.envp = to_envp(worker_env(c_.base_env, o_, attempt_, lr, replacement));
    r.stdin_fd = devnull_;
    r.stdout_fd = out[1];
    r.stderr_fd = err[1];
    pid_t pid = spawn_worker(r);
    ::close(out[1]);
    ::close(err[1]);
    relay_.add_pipe(rank, Stream::out, out[0]);
    relay_.add_pipe(rank, Stream::err, err[0]);
    workers_.push_back(Worker{lr, rank, pid, true, 0});
    board_.add(WorkerView{rank, lr, pid, true, 0, false, false, replacement});
    return true;
  } catch (const std::exception& e) {
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) ::close(fd);
    failure_ = "rank " + std::to_string(rank) + " could not be started: " + e.what();
    say(failure_);
    publish_local(static_cast<int>(JobFailure::Kind::worker), failure_);
    begin_stop(SIGTERM);
    return false;
  }
}

bool Supervisor::replace_in_place(const Worker& w, const std::string& what) {
  // A job failure recorded already (another node's, its wake-up not read yet) ends the round.
  if (replaced() >= o_.max_restarts || (c_.monitor && c_.monitor->failure().failed())) return false;
  // A worker that finished (exit 0) means the job is ending: a replacement would wait for peers
  // that are gone (a crash in teardown, after training): the round's normal failure path instead.
  if (any_finished()) return false;
  const int n = ++replacements_[static_cast<size_t>(w.local_rank)];
  say(what + "; replacing it in place (replacement " + std::to_string(replaced()) + " of " +
      std::to_string(o_.max_restarts) + "): the other workers keep running");
  relay_.note_in_log(w.rank, "[gzrun] " + what + "; replacement " + std::to_string(n) + " of rank " +
                                 std::to_string(w.rank) + " in place");
  start_worker(w.local_rank, n);  // when it cannot start, the round fails (start_worker said why)
  return true;
}

int Supervisor::replaced() const { return std::accumulate(replacements_.begin(), replacements_.end(), 0); }

bool Supervisor::all_reaped() const {
  return std::none_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.alive; });
}

void Supervisor::kill_all_groups(int sig, bool only_alive) {
  for (const Worker& w : workers_) {
    if (only_alive && !w.alive) continue;
    // The group holds the worker and whatever it started; fall back to the pid alone when
    // the group is already gone.
    if (::kill(-w.pid, sig) != 0 && w.alive) ::kill(w.pid, sig);
  }
}

void Supervisor::begin_stop(int sig) {
  if (!stopping_) {
    stopping_ = true;
    kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<long long>(o_.grace_period_s * 1000));
  }
  kill_all_groups(sig, true);
}

void Supervisor::on_exit(const Worker& w) {
  const int st = w.status;
  const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  board_.ended(w.pid, st, !ok && !stopping_, stopping_);
  if (ok) return;
  std::string d =
      "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") " + describe_status(st);
  if (!stopping_) {
    // Not stopping: gzrun sent no signal yet, so a SIGKILL came from elsewhere.
    const std::string hint = unexpected_death_hint(st);
    if (o_.in_place() && replace_in_place(w, d + hint)) return;
    failure_ = d + hint;
    say(failure_);
    if (o_.in_place() && replaced() >= o_.max_restarts)
      say("the in-place budget is spent (" + std::to_string(replaced()) +
          " replacement(s) of --max-restarts " + std::to_string(o_.max_restarts) +
          " on this node in this round): stopping every worker instead");
    publish_local(static_cast<int>(JobFailure::Kind::worker),
                  "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) +
                      ", pid " + std::to_string(w.pid) + ") " + describe_status(st) + hint);
    collect_for_verdict();
    if (!all_reaped())
      say("stopping the other local workers (SIGTERM, then SIGKILL after " +
          format_duration(std::chrono::milliseconds(static_cast<long long>(o_.grace_period_s * 1000))) + ")");
    begin_stop(SIGTERM);
  } else {
    // Stopping, but before the grace period's SIGKILL: that SIGKILL was not gzrun's either.
    say("stopped: " + d + (escalated_ ? std::string() : unexpected_death_hint(st)));
  }
}

void Supervisor::reap() {
  // waitpid(-1): gzrun is a child subreaper, so besides workers it may have adopted orphans
  // (descendants of a dead worker); reap those too so no zombies pile up.
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(-1, &st, WNOHANG);
    if (r <= 0) break;
    for (Worker& w : workers_) {
      if (w.pid != r || !w.alive) continue;
      w.alive = false;
      w.status = st;
      // The worker's group dies with it (its leftover children). Done right away: once the
      // group is empty its id may be reused by an unrelated process group later.
      ::kill(-w.pid, SIGKILL);
      // A copy: on_exit may start a replacement, which grows workers_ (w would dangle).
      const Worker dead = w;
      on_exit(dead);
      break;
    }
  }
}

void Supervisor::kill_adopted() {
  // Bounded: each round kills one generation of adopted descendants.
  for (int round = 0; round < 5; ++round) {
    std::vector<pid_t> kids = list_children(::getpid());
    bool any = false;
    for (pid_t p : kids) {
      bool worker = std::any_of(workers_.begin(), workers_.end(),
                                [&](const Worker& w) { return w.alive && w.pid == p; });
      if (worker) continue;
      ::kill(p, SIGKILL);
      any = true;
    }
    if (!any) break;
    ::usleep(10000);
    reap();
  }
  reap();
}

void Supervisor::on_signal(int sig) {
  if (sig == SIGCHLD) return;  // reap() runs after every wake-up
  if (sig == SIGUSR1) return on_status_signal();
  if (interrupt_sig_ == 0) {
    interrupt_sig_ = sig;
    publish_local(static_cast<int>(JobFailure::Kind::interrupted), "gzrun received " + signal_name(sig));
    if (workers_.empty() || all_reaped()) return;
    collect_for_verdict();
    say("received " + signal_name(sig) + ": forwarding it to the workers");
    begin_stop(sig);
  } else {
    say("received " + signal_name(sig) + " again: killing the workers now (SIGKILL)");
    stopping_ = true;
    escalated_ = true;
    kill_all_groups(SIGKILL, true);
  }
}

Supervisor::Outcome Supervisor::run_attempt() {
  stopping_ = false;
  escalated_ = false;
  move_pending_ = false;
  failure_.clear();
  workers_.clear();
  replacements_.assign(static_cast<size_t>(o_.nproc_per_node), 0);
  relay_.reset();
  open_logs();
  start_workers();

  std::vector<pollfd> fds;
  while (!all_reaped()) {
    fds.clear();
    fds.push_back(pollfd{signals_.fd(), POLLIN, 0});
    fds.push_back(pollfd{c_.monitor ? c_.monitor->fd() : -1, POLLIN, 0});
    relay_.append_pollfds(fds);
    // Wake up at least once a second (SIGCHLD is the normal wake-up), sooner for the SIGKILL.
    int timeout_ms = 1000;
    if (stopping_ && !escalated_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, 1000));
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      say(std::string("poll failed: ") + std::strerror(errno) + "; stopping the workers");
      if (failure_.empty()) failure_ = "gzrun's poll() failed";
      begin_stop(SIGKILL);
      escalated_ = true;
    }
    if (n > 0) {
      if (fds[0].revents)
        for (int s : signals_.take()) on_signal(s);
      if (fds[1].revents) {
        char buf[64];
        while (::read(fds[1].fd, buf, sizeof buf) > 0) {
        }
        on_job_failure();
      }
      for (size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents) relay_.on_ready(fds[i]);
    }
    reap();
    if (move_pending_) move_in_place();
    if (stopping_ && !escalated_ && Clock::now() >= kill_at_ && !all_reaped()) {
      for (const Worker& w : workers_)
        if (w.alive)
          say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
              ") still running after the grace period: sending SIGKILL");
      kill_all_groups(SIGKILL, true);
      escalated_ = true;
    }
  }

  // Every worker is gone (and its group, see reap()): kill descendants that escaped their group,
  // then collect the output
  // still in flight (bounded: a process that escaped its group may hold a pipe open).
  kill_adopted();
  Deadline drain = Deadline::after(std::chrono::milliseconds(1000));
  while (relay_.open_pipes() > 0 && !drain.expired()) {
    fds.clear();
    relay_.append_pollfds(fds);
    int n = ::poll(fds.data(), fds.size(), drain.remaining_ms());
    if (n <= 0) continue;
    for (const pollfd& p : fds)
      if (p.revents) relay_.on_ready(p);
  }
  relay_.drain_all();
  for (int s : signals_.take()) on_signal(s);

  if (interrupt_sig_) return Outcome::interrupted;
  if (!failure_.empty()) return Outcome::failed;
  return Outcome::success;
}

// ---------------------------------------------------------------- flight-recorder verdict

void Supervisor::collect_for_verdict() {
  if (collected_) return;
  collected_ = true;
  // Requests of failures are numbered apart from status requests (a job-wide counter from 1).
  const int64_t request = (int64_t{1} << 30) + round_.round;
  const Duration wait(static_cast<long long>(o_.dump_wait_s * 1000));
  report_ = collect_node_report(board_.snapshot(), c_.hostname, request, wait);
  // Without a store (this node lost it) the report has nowhere to go; trying would only delay
  // this gzrun's exit by a connect timeout.
  if (!c_.store_client || (c_.monitor && c_.monitor->failure().kind == JobFailure::Kind::store_lost)) return;
  // Nor while the store has been silent for half the heartbeat timeout: this node is most likely
  // cut off, and the upload's connect and set would each wait their timeout before the exit.
  // (The silence includes the wait between two heartbeats: an interval on top.)
  const double silent_s = o_.heartbeat_timeout_s / 2 + o_.effective_heartbeat_interval_s();
  if (c_.monitor && c_.monitor->store_silent_for() > Duration(static_cast<long long>(silent_s * 1000)))
    return;
  // In the background: a node cut off from the store must not delay stopping its workers.
  if (upload_.joinable()) upload_.join();
  upload_ = std::thread(
      [connect = c_.store_client, key = report_key(round_.round, round_.node_rank), text = report_] {
        try {
          connect()->set(key, to_bytes(text));
        } catch (const std::exception&) {  // the verdict will say this node sent nothing
        }
      });
}

void Supervisor::print_verdict(const JobFailure& failure) {
  if (upload_.joinable()) upload_.join();
  // A round ended to admit nodes is no failure: a local worker that failed first only lost its
  // connection to a peer stopped for the new round. A verdict would blame that peer, and node 0
  // would wait --verdict-wait for reports the other nodes never send (they collect none for an
  // admission), joining the new round that much later: past the join window, a round later.
  if (!collected_ || failure.kind == JobFailure::Kind::admit) return;
  const std::string dir = board_.snapshot().dump_dir;
  // After a failure every op still running is part of the picture, however young.
  const double stuck_ms = 0;
  const std::string what = "verdict-round" + std::to_string(round_.round);
  if (!c_.store_client) {
    say_lines(judge_reports(report_ + job_line(round_.run_id, 1, o_.nproc_per_node, &failure, {}), stuck_ms,
                            dir, what));
    return;
  }
  if (round_.node_rank != 0) {
    say("the verdict of this failure is printed by node 0's gzrun");
    return;
  }
  // Node 0 judges in the background: the other nodes join the next round at once, and a node 0
  // that waited --verdict-wait for their reports first would miss its join window (a round later,
  // a second restart of every worker).
  if (verdict_.joinable()) verdict_.join();
  // TEST ONLY: GZ_TEST_VERDICT_DELAY_MS holds the verdict up (tests/launcher/multihost_etcd.sh).
  const long long delay_ms = std::max(0LL, c_.base_env.get_int("GZ_TEST_VERDICT_DELAY_MS", 0));
  // Every store op on the thread too: against an etcd cluster that just lost a member, each may
  // take its attempt timeout.
  auto judge = [this, round = round_, failure, dir, what, stuck_ms, delay_ms] {
    try {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      auto store = c_.store_client();
      // Every node still there has acknowledged the failure by now (the store host waited for
      // that in end_round()): wait for their reports only, not for dead or cut-off nodes'.
      std::vector<int> alive{round.node_rank}, silent;
      for (int n = 0; n < round.nnodes; ++n)
        if (n != round.node_rank &&
            store->check({JobMonitor::round_key(round.round, "acked/" + std::to_string(n))}))
          alive.push_back(n);
      std::string input = gather_reports(
          *store, [r = round.round](int n) { return report_key(r, n); }, round.nnodes,
          Deadline::after(Duration(static_cast<long long>(o_.verdict_wait_s * 1000))), &silent, alive);
      input += job_line(round.run_id, round.nnodes, o_.nproc_per_node, &failure, silent);
      say_lines(judge_reports(input, stuck_ms, dir, what));
    } catch (const std::exception& e) {
      say(std::string("no verdict: cannot gather the nodes' reports: ") + e.what());
    }
  };
  try {
    verdict_ = std::thread(judge);
  } catch (const std::exception& e) {  // no thread: no verdict, but the job goes on
    say(std::string("no verdict: ") + e.what());
  }
}

void Supervisor::on_status_signal() {
  if (c_.ask_status) return c_.ask_status();  // several nodes: the StatusWatcher asks them all
  const WorkerBoard::Snapshot b = board_.snapshot();
  if (b.run_id.empty()) return;
  static int64_t next = 1;
  const std::string report =
      collect_node_report(b, c_.hostname, next++, Duration(static_cast<long long>(o_.dump_wait_s * 1000)));
  say("status of the job (asked by SIGUSR1):");
  say_lines(judge_reports(report + job_line(b.run_id, 1, o_.nproc_per_node, nullptr, {}), o_.stuck_s * 1000,
                          b.dump_dir, "status"));
}

}  // namespace gz::launcher
