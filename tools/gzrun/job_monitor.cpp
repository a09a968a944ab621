#include "job_monitor.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>

#include "gz/core/deadline.h"
#include "gz/core/error.h"
#include "gz/store/store.h"
#include "joiners.h"
#include "output_relay.h"  // say()

namespace gz::launcher {

namespace {

using std::chrono::steady_clock;

std::chrono::milliseconds ms_of(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

struct Finally {  // runs f on every way out of a scope
  std::function<void()> f;
  ~Finally() { f(); }
};

}  // namespace

std::string JobMonitor::round_key(int round, const std::string& what) {
  return "gzrun/round" + std::to_string(round) + "/" + what;
}

std::string JobFailure::encode() const {
  return std::to_string(static_cast<int>(kind)) + "|" + std::to_string(node) + "|" + text;
}

JobFailure JobFailure::decode(const std::string& record) {
  JobFailure f;
  auto a = record.find('|');
  auto b = a == std::string::npos ? a : record.find('|', a + 1);
  if (b == std::string::npos) {
    f.kind = Kind::worker;
    f.text = record;
    return f;
  }
  int k = std::atoi(record.substr(0, a).c_str());
  f.kind = (k >= 1 && k <= 5) ? static_cast<Kind>(k) : Kind::worker;
  f.node = std::atoi(record.substr(a + 1, b - a - 1).c_str());
  f.text = record.substr(b + 1);
  return f;
}

JobMonitor::JobMonitor(const LaunchOptions& options, Connect connect, std::string store_where,
                       bool hosts_store, std::string store_kind)
    : o_(options),
      connect_(std::move(connect)),
      where_(std::move(store_where)),
      kind_(std::move(store_kind)),
      hosts_store_(hosts_store),
      waiting_(joiner_lease(options)) {
  if (pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw SystemError("pipe2 for the job monitor", errno);
}

JobMonitor::~JobMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (int fd : pipe_)
    if (fd >= 0) ::close(fd);
}

Store& JobMonitor::store() {
  if (!store_) store_ = connect_();
  return *store_;
}

void JobMonitor::start_round(int round, int node_rank, int nnodes) {
  if (thread_.joinable()) end_round();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    round_ = round;
    node_rank_ = node_rank;
    nnodes_ = nnodes;
    failure_ = JobFailure{};
    pending_.clear();
  }
  char buf[64];
  while (::read(pipe_[0], buf, sizeof buf) > 0) {
  }
  const auto now = steady_clock::now();
  peers_.clear();
  for (int n = 0; n < nnodes_; ++n)
    if (n != node_rank_) peers_[n] = Peer{-1, now};
  last_ok_ = now;
  store_lost_ = false;
  thread_ = std::thread([this] { loop(); });
}

void JobMonitor::report_local(JobFailure f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    pending_.push_back(std::move(f));
  }
  cv_.notify_all();
}

Duration JobMonitor::store_silent_for() const {
  if (!thread_.joinable()) return Duration(0);
  return std::chrono::duration_cast<Duration>(steady_clock::now() - last_ok_.load());
}

JobFailure JobMonitor::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void JobMonitor::learn(const JobFailure& f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.failed()) return;
    failure_ = f;
  }
  char c = 1;
  ssize_t ignored = ::write(pipe_[1], &c, 1);
  (void)ignored;
  // Tell node 0 this gzrun has seen the failure (it keeps the store up until everyone has).
  if (f.kind != JobFailure::Kind::store_lost) {
    try {
      store().set(round_key(round_, "acked/" + std::to_string(node_rank_)), to_bytes("1"));
    } catch (const std::exception&) {
      // Not worth more: node 0 stops waiting after the heartbeat timeout anyway.
    }
  }
}

void JobMonitor::publish(const JobFailure& f) {
  // First writer wins: every gzrun then reports the same (first) failure of the round.
  Bytes stored = store().compare_set(round_key(round_, "failure"), Bytes{}, to_bytes(f.encode()));
  learn(JobFailure::decode(to_string(stored)));
}

void JobMonitor::loop() {
  const auto interval = ms_of(o_.effective_heartbeat_interval_s());
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    tick();
    lock.lock();
    if (store_lost_) break;  // nothing left to talk to; the supervisor stops the workers
    cv_.wait_for(lock, interval, [this] { return stop_ || !pending_.empty(); });
  }
}

Store& JobMonitor::store_until_silent() {
  // An operation may not outlast the silence budget: one begun just before the store went quiet
  // would otherwise wait its own full timeout on top, and a cut-off node would learn it is cut off
  // up to twice the heartbeat timeout late (seen: 5.0 s for a 3 s timeout).
  const auto timeout = ms_of(o_.heartbeat_timeout_s);
  const auto left = std::chrono::duration_cast<Duration>(last_ok_.load() + timeout - steady_clock::now());
  // At least an interval: a monitor thread that woke late (a loaded host) still gives the store a
  // fair chance, and detection stays within timeout + interval.
  Store& s = store();
  s.set_timeout(std::max(left, Duration(ms_of(o_.effective_heartbeat_interval_s()))));
  return s;
}

void JobMonitor::restore_full_timeout() {
  if (store_) store_->set_timeout(ms_of(o_.heartbeat_timeout_s));
}

void JobMonitor::tick() {
  const auto timeout = ms_of(o_.heartbeat_timeout_s);
  // end_round(), advance_round() and the next round's first tick get the whole timeout.
  Finally restore{[this] { restore_full_timeout(); }};
  std::vector<JobFailure> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  try {
    while (!pending.empty()) {
      ask([&](Store&) { publish(pending.front()); });
      pending.erase(pending.begin());
    }
    ask([&](Store& s) { return s.add(round_key(round_, "hb/" + std::to_string(node_rank_)), 1); });
    const std::string fkey = round_key(round_, "failure");
    const bool known = failure().failed();
    if (!known && ask([&](Store& s) { return s.check({fkey}); }))
      learn(JobFailure::decode(
          to_string(ask([&](Store& s) { return s.get(fkey, Deadline::after(s.timeout())); }))));
    if (known || failure().failed()) return;
    for (auto& [node, peer] : peers_) {
      const std::string key = round_key(round_, "hb/" + std::to_string(node));  // (a lambda may not
      const int64_t beats = ask([&](Store& s) { return s.add(key, 0); });      // capture `node`)
      const auto now = last_ok_.load();
      if (beats != peer.beats) {
        peer.beats = beats;
        peer.changed = now;
        continue;
      }
      const auto silent = std::chrono::duration_cast<Duration>(now - peer.changed);
      if (silent < timeout) continue;
      JobFailure f;
      f.kind = JobFailure::Kind::node_lost;
      f.node = node;
      f.text = "node " + std::to_string(node) + " lost: no heartbeat from its gzrun for " +
               format_duration(silent) + " (seen by node " + std::to_string(node_rank_) +
               "; its gzrun was killed or stopped, its host is down or its network is cut)";
      ask([&](Store&) { publish(f); });
      return;
    }
    if (o_.elastic) admit_waiting();
  } catch (const std::exception& e) {
    const auto silent = std::chrono::duration_cast<Duration>(steady_clock::now() - last_ok_.load());
    if (silent < timeout) {                   // a blip: try again next interval, until the deadline
      std::lock_guard<std::mutex> lock(mu_);  // with the local failures not yet published
      pending_.insert(pending_.begin(), pending.begin(), pending.end());
      return;
    }
    store_lost_ = true;
    JobFailure f;
    f.kind = JobFailure::Kind::store_lost;
    f.node = 0;
    f.text = "lost the " + kind_ + " (" + where_ + "): no answer for " + format_duration(silent) +
             " (last error: " + e.what() + ")";
    learn(f);
  }
}

void JobMonitor::end_round() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // A report that came after the thread's last tick.
  std::vector<JobFailure> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  const JobFailure f = failure();
  if (store_lost_) return;
  Finally restore{[this] { restore_full_timeout(); }};  // also when a publish throws
  try {
    for (const JobFailure& p : pending) ask([&](Store&) { publish(p); });
    restore_full_timeout();
    if (!f.failed() || !hosts_store_) return;
    // This gzrun hosts the store: keep it up until every node that is still there has seen the
    // failure, so nobody reports "lost the store host" instead of the real cause. A node is
    // waited for until it acknowledged, or until its heartbeat stood still for 3 intervals (a live
    // gzrun heartbeats until it has acknowledged): a dead, stopped or cut-off node is not waited
    // for the whole timeout.
    const auto interval = ms_of(o_.effective_heartbeat_interval_s());
    Deadline deadline = Deadline::after(ms_of(o_.heartbeat_timeout_s));
    struct Waiting {
      int64_t beats;
      steady_clock::time_point changed;
    };
    std::map<int, Waiting> waiting;
    for (int n = 0; n < nnodes_; ++n)
      if (n != node_rank_ && !(f.kind == JobFailure::Kind::node_lost && n == f.node))
        waiting[n] = Waiting{-1, steady_clock::now()};
    while (!waiting.empty() && !deadline.expired()) {
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (store().check({round_key(round_, "acked/" + std::to_string(it->first))})) {
          it = waiting.erase(it);
          continue;
        }
        const int64_t beats = store().add(round_key(round_, "hb/" + std::to_string(it->first)), 0);
        const auto now = steady_clock::now();
        if (beats != it->second.beats) it->second = Waiting{beats, now};
        if (now - it->second.changed >= 3 * interval) {
          it = waiting.erase(it);
          continue;
        }
        ++it;
      }
      if (!waiting.empty()) ::usleep(20000);
    }
  } catch (const std::exception& e) {
    say(std::string("warning: while ending the round in the store: ") + e.what());
  }
}

bool JobMonitor::admit_waiting() {
  // One round trip per interval while nobody waits. A full round cannot take anyone in (the
  // joiner waits for a place), and once a node's workers all succeeded the job is finishing.
  // Each request is bounded by what is left of the silence budget (ask()).
  if (nnodes_ >= o_.max_nodes) return false;
  const std::string joined = round_key(round_ + 1, "joined");
  if (!ask([&](Store& s) { return s.check({joined}); })) return false;
  if (ask([&](Store& s) { return s.check({round_key(round_, "exit/arrived")}); })) return false;
  // Only joiners that still beat: one that gave up or was killed while waiting would end the
  // round for nothing (and is never made a member of the next).
  const auto list =
      parse_entries(to_string(ask([&](Store& s) { return s.get(joined, Deadline::after(s.timeout())); })));
  ask([&](Store& s) { waiting_.observe(s, list); });
  const auto alive = waiting_.alive(list);
  if (alive.empty()) return false;
  std::string who;
  for (const std::string& entry : alive)  // "seq:host:id"
    who += (who.empty() ? "" : ", ") + entry.substr(entry.find(':') + 1);
  JobFailure f;
  f.kind = JobFailure::Kind::admit;
  f.text = "node(s) waiting to join (" + who + "): new round with more nodes (" + std::to_string(nnodes_) +
           " now, at most " + std::to_string(o_.max_nodes) + ")";
  ask([&](Store&) { publish(f); });
  return true;
}

int JobMonitor::advance_round(int round) {
  const std::string expected = round == 0 ? std::string() : std::to_string(round);
  Bytes stored = store().compare_set("gzrun/round", to_bytes(expected), to_bytes(std::to_string(round + 1)));
  const std::string now = to_string(stored);
  if (now != std::to_string(round + 1))
    GZ_THROW(Error, "the job's round in the store is ", now, ", expected ", round + 1, " after round ", round,
             " (another gzrun moved it)");
  return round + 1;
}

}  // namespace gz::launcher
