#include "elastic_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "gz/core/deadline.h"
#include "gz/core/error.h"
#include "gz/store/store.h"
#include "joiners.h"
#include "output_relay.h"  // say()

namespace gz::launcher {

namespace {

using std::chrono::steady_clock;

// compare_set with an expectation no key ever holds returns the value, or the expectation itself
// when the key is missing: a read of an optional key in one round trip.
const Bytes kAbsent = to_bytes(std::string("\x01gzrun-absent"));

std::string join_entries(const std::vector<std::string>& entries) {
  std::string out;
  for (const auto& e : entries) out += e + ";";
  return out;
}

std::string names_of(const std::vector<std::string>& entries) {
  std::string out;
  for (const auto& e : entries) {
    auto c = e.find(':');
    out += (out.empty() ? "" : ", ") + (c == std::string::npos ? e : e.substr(c + 1));
  }
  return out;
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(const LaunchOptions& options, Store& store, std::string me)
    : o_(options), s_(store), me_(std::move(me)) {}

std::string ElasticRendezvous::peek(const std::string& key) {
  Bytes v = s_.compare_set(key, kAbsent, kAbsent);
  return v == kAbsent ? std::string() : to_string(v);
}

int ElasticRendezvous::current_round() {
  std::string v = peek("gzrun/round");
  return v.empty() ? 0 : std::atoi(v.c_str());
}

void ElasticRendezvous::append_me(int round) {
  s_.append(JobMonitor::round_key(round, "joined"), to_bytes(entry_ + ";"));
}

void ElasticRendezvous::close_round(int round, const std::vector<std::string>& joined) {
  std::vector<std::string> members = joined;
  // Node ranks by first arrival in the job: nodes that stay keep their order across rounds.
  std::stable_sort(members.begin(), members.end(),
                   [](const std::string& a, const std::string& b) { return seq_of(a) < seq_of(b); });
  if (static_cast<int>(members.size()) > o_.max_nodes) members.resize(static_cast<size_t>(o_.max_nodes));
  s_.compare_set(JobMonitor::round_key(round, "members"), Bytes{}, to_bytes(join_entries(members)));
}

RoundInfo ElasticRendezvous::placed(int q, const std::string& members, const std::vector<std::string>& list,
                                    int node_rank) {
  RoundInfo r;
  r.round = q;
  r.node_rank = node_rank;
  r.nnodes = static_cast<int>(list.size());
  const std::string restarts = peek(JobMonitor::round_key(q, "restarts"));
  r.restarts = restarts.empty() ? 0 : std::atoi(restarts.c_str());
  if (job_.empty()) {
    // The job's id: the launch_id() of round 0's first node, the same for every node and round.
    const std::vector<std::string> first =
        parse_entries(q == 0 ? members : peek(JobMonitor::round_key(0, "members")));
    job_ = first.empty() ? std::string("0") : first.front().substr(first.front().rfind(':') + 1);
  }
  r.run_id = job_ + "-" + std::to_string(q);
  r.master_addr = host_of(list.front());  // used where no store host is the obvious one (etcd)
  say("elastic round " + std::to_string(q) + ": node " + std::to_string(r.node_rank) + " of " +
      std::to_string(r.nnodes) + " (" + names_of(list) + ")");
  return r;
}

bool ElasticRendezvous::try_close(int q, JoinerBeats& beats, JoinWindow& window, int& joined) {
  // Nodes that gave up or were killed while waiting stay in the list: count the live ones.
  std::vector<std::string> list = parse_entries(peek(JobMonitor::round_key(q, "joined")));
  if (static_cast<int>(list.size()) >= o_.min_nodes) {
    // Only the live joiner with the lowest seq closes the round: the others read the beats below
    // their own, in order, only until one is alive (or may be), and leave it to that one. Reads
    // per poll are then about 2N for the whole job instead of N per joiner.
    for (const std::string& e : list) {
      if (seq_of(e) >= seq_) continue;
      beats.observe(s_, {e});
      if (!beats.alive({e}).empty() || beats.undecided({e})) {
        joined = static_cast<int>(list.size());
        window.open = false;
        return false;
      }
    }
    std::vector<std::string> rest;
    for (const std::string& e : list)
      if (seq_of(e) >= seq_) rest.push_back(e);
    beats.observe(s_, rest);
  }
  // A joiner read only once may be alive: decide it (within a lease) before closing without it.
  const bool undecided = beats.undecided(list, entry_);
  list = beats.alive(list, entry_);
  joined = static_cast<int>(list.size());
  if (joined < o_.min_nodes) {
    window.open = false;
    return false;
  }
  const auto now = steady_clock::now();
  if (!window.open) window.start = now;
  window.open = true;
  const auto waited = std::chrono::milliseconds(static_cast<long long>(o_.join_window_s * 1000));
  if (joined < o_.max_nodes && (now - window.start < waited || undecided)) return false;
  close_round(q, list);
  return true;
}

RoundInfo ElasticRendezvous::join(const Cancelled& cancelled) {
  Stopwatch sw;
  const Deadline deadline =
      Deadline::after(std::chrono::milliseconds(static_cast<long long>(o_.rdzv_timeout_s * 1000)));
  if (seq_ < 0) {
    seq_ = s_.add("gzrun/seq", 1);
    entry_ = std::to_string(seq_) + ":" + me_;
  }

  // The first round that has not started yet: the one being formed, or the next after a running one.
  int q = current_round();
  while (!peek(JobMonitor::round_key(q, "members")).empty()) ++q;
  append_me(q);
  if (q > 0 && q > current_round())
    say("waiting to join the job at round " + std::to_string(q) + " (round " + std::to_string(q - 1) +
        " runs)");
  JoinWindow window;
  JoinerBeats beats(joiner_lease(o_));
  for (;;) {
    // While waiting, beat: only joiners seen beating may become members (joiners.h).
    s_.add(joiner_beat_key(seq_), 1);
    const std::string ended = peek("gzrun/ended");
    if (!ended.empty()) {
      if (ended.rfind("done|", 0) == 0) {
        RoundInfo r;
        r.round = q;
        r.job_done = true;
        return r;
      }
      GZ_THROW(Error, "the job has ended: ", ended.substr(ended.find('|') + 1));
    }
    const std::string members = peek(JobMonitor::round_key(q, "members"));
    if (!members.empty()) {
      std::vector<std::string> list = parse_entries(members);
      auto it = std::find(list.begin(), list.end(), entry_);
      if (it != list.end()) return placed(q, members, list, static_cast<int>(it - list.begin()));
      // Round q started without this node (it came too late, or q was full): wait for the next.
      ++q;
      append_me(q);
      window.open = false;
      say("waiting to join the job at round " + std::to_string(q) + " (round " + std::to_string(q - 1) +
          " runs with " + std::to_string(list.size()) + " node(s))");
      continue;
    }
    const int cur = current_round();
    int joined = 0;
    if (cur == q) {
      if (try_close(q, beats, window, joined)) continue;
    } else if (cur > q) {
      // The job moved past q while this node waited for it (q was never formed): go to the current one.
      q = cur;
      while (!peek(JobMonitor::round_key(q, "members")).empty()) ++q;
      append_me(q);
      window.open = false;
      continue;
    }
    if (cancelled && cancelled()) GZ_THROW(Aborted, "cancelled while waiting for the nodes of round ", q);
    if (deadline.expired()) {
      if (cur != q)
        GZ_THROW(TimeoutError, "waited ", format_duration(sw.elapsed()),
                 " (--rdzv-timeout) to join the job at round ", q, ", but round ", cur, " still runs (with ",
                 o_.max_nodes, " nodes there is no place to admit one)");
      GZ_THROW(TimeoutError, "only ", joined, " node(s) joined round ", q, " within --rdzv-timeout (",
               format_duration(sw.elapsed()), "); the job needs at least ", o_.min_nodes, " (--nnodes ",
               o_.min_nodes, ":", o_.max_nodes, ")");
    }
    ::usleep(50000);
  }
}

void ElasticRendezvous::advance(const RoundInfo& r, const JobFailure& f) {
  const int restarts = r.restarts + (f.kind == JobFailure::Kind::admit ? 0 : 1);
  s_.compare_set(JobMonitor::round_key(r.round + 1, "restarts"), Bytes{}, to_bytes(std::to_string(restarts)));
  const std::string expected = r.round == 0 ? std::string() : std::to_string(r.round);
  s_.compare_set("gzrun/round", to_bytes(expected), to_bytes(std::to_string(r.round + 1)));
}

std::string ElasticRendezvous::cannot_continue(const RoundInfo& r, const JobFailure& f) {
  if (f.kind != JobFailure::Kind::node_lost) return "";
  const int left = r.nnodes - 1;
  // Nodes waiting for the next round that are not r's own members (those may have joined already).
  const std::vector<std::string> members = parse_entries(peek(JobMonitor::round_key(r.round, "members")));
  std::vector<std::string> candidates;
  for (const auto& e : parse_entries(peek(JobMonitor::round_key(r.round + 1, "joined"))))
    if (std::find(members.begin(), members.end(), e) == members.end()) candidates.push_back(e);
  if (left >= o_.min_nodes) return "";
  // Only joiners that still beat count (one that gave up or was killed would never come); wait
  // at most the lease to see enough of them.
  const int waiting = static_cast<int>(
      wait_for_alive(s_, candidates, static_cast<size_t>(o_.min_nodes - left), joiner_lease(o_)).size());
  if (left + waiting >= o_.min_nodes) return "";
  return "node " + std::to_string(f.node) + " lost: " + std::to_string(left) + " node(s) left" +
         (waiting ? " and " + std::to_string(waiting) + " waiting" : "") + ", fewer than the minimum of " +
         std::to_string(o_.min_nodes) + " (--nnodes " + std::to_string(o_.min_nodes) + ":" +
         std::to_string(o_.max_nodes) + ")";
}

void ElasticRendezvous::end_job(const std::string& reason, bool success) {
  try {
    s_.compare_set("gzrun/ended", Bytes{}, to_bytes((success ? "done|" : "failed|") + reason));
  } catch (const std::exception&) {
    // The store is gone: waiting nodes learn that by themselves.
  }
}

}  // namespace gz::launcher
