// The verdict (verdict.h). Three questions, in this order:
//  1. Did the ranks of a group call different collectives at the same position (a mismatch, or a
//     rank that skipped one)? The records' signatures, aligned by collective number, say so.
//  2. Who waits for whom? Every stuck op gives edges "rank a waits for rank b" (the peer a backend
//     is blocked on, the peer an error names, a member that has not entered the op the others are
//     in). The ranks waited for that wait for nobody are the culprits; what gzrun saw of their
//     processes (dead, stopped, silent node) or their own dump (phase, step) says why.
//  3. If everyone waits for someone (a cycle), all of them entered the op: the link between them.
#include "verdict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "dump_reader.h"

namespace gz::doctor {

std::string OpRec::signature() const {
  if (op == "barrier") return "barrier()";
  std::string s = op + "(" + dtype + " x " + std::to_string(count);
  if (!reduce.empty()) s += ", " + reduce;
  if (root >= 0 && (op == "broadcast" || op == "reduce")) s += ", root " + std::to_string(root);
  return s + ")";
}

namespace {

bool collective(const OpRec& o) { return !o.queued && o.op != "send" && o.op != "recv" && o.op != "task"; }

std::string fmt_s(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  return buf;
}

// "0-3, 6"
std::string ranges(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(v[i]) +
         (j > i ? (j == i + 1 ? ", " : "-") + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return s;
}

std::string differs(const OpRec& a, const OpRec& b) {
  if (a.op != b.op) return "the op differs";
  if (a.count != b.count) return "the count differs";
  if (a.dtype != b.dtype) return "the dtype differs";
  if (a.reduce != b.reduce) return "the reduction differs";
  if (a.root != b.root) return "the root differs";
  return "they differ";
}

struct Member {
  const RankDump* dump = nullptr;
  const CommDump* comm = nullptr;
  int global = -1;
  std::map<uint64_t, const OpRec*> by_coll;  // collectives
  const OpRec* frontier = nullptr;           // last op with a number
};

struct Group {
  std::string name;
  int size = 0;
  bool root = false;
  std::string backend;
  std::vector<int> ranks;         // global rank per member, -1 unknown
  std::map<int, Member> members;  // group rank -> member with a dump
  int global(int g) const { return g >= 0 && g < static_cast<int>(ranks.size()) ? ranks[g] : -1; }
};

// One "a waits for b" fact.
struct Wait {
  int from = -1, to = -1;
  const Group* group = nullptr;
  const OpRec* op = nullptr;  // the waiter's op
  bool error = false;         // from an error naming the peer
  std::string error_kind;
};

class Judge {
 public:
  Judge(const Picture& p, const JudgeOptions& o) : pic_(p), opt_(o) { index(); }

  Verdict run() {
    Verdict v;
    if (pic_.dumps.empty() && pic_.nodes.empty()) {
      v.headline = "nothing to judge: no dump and no node report was read";
      return v;
    }
    if (find_mismatch(v) || find_blocked(v) || find_died(v) || find_failure(v)) return v;
    healthy(v);
    return v;
  }

 private:
  // ------------------------------------------------------------ indexing

  void index() {
    for (const auto& n : pic_.nodes)
      for (const auto& f : n.ranks) {
        facts_[f.rank] = &f;
        node_[f.rank] = n.node;
        reported_.insert(n.node);
      }
    for (const auto& d : pic_.dumps) {
      if (d.rank >= 0) dump_[d.rank] = &d;
      if (d.rank >= 0 && d.node >= 0) node_[d.rank] = d.node;
      for (const auto& c : d.comms) add_member(d, c);
    }
    for (auto& [key, g] : groups_) order_.push_back(&g);
    // Root groups first, the largest first: their op numbers are the ones users see.
    std::stable_sort(order_.begin(), order_.end(), [](const Group* a, const Group* b) {
      return a->root != b->root ? a->root : a->size > b->size;
    });
  }

  void add_member(const RankDump& d, const CommDump& c) {
    const std::string key = c.name + "#" + std::to_string(c.size);
    Group& g = groups_[key];
    g.name = c.name, g.size = c.size, g.root = c.parent == 0, g.backend = c.backend;
    if (g.ranks.empty() && !c.ranks.empty()) g.ranks = c.ranks;
    if (g.ranks.empty() && g.root && d.world == c.size)
      for (int r = 0; r < c.size; ++r) g.ranks.push_back(r);
    auto it = g.members.find(c.rank);
    if (it != g.members.end() && !it->second.comm->retired && c.retired) return;  // keep the live one
    Member m;
    m.dump = &d, m.comm = &c, m.global = global_rank(d, c);
    for (const auto& o : c.ops) {
      if (o.queued) continue;
      m.frontier = &o;
      if (collective(o)) m.by_coll[o.coll] = &o;
    }
    g.members[c.rank] = m;
  }

  int node_of(int r) const {
    if (auto it = node_.find(r); it != node_.end()) return it->second;
    if (pic_.job.nproc_per_node > 0 && r >= 0) return r / pic_.job.nproc_per_node;
    return -1;
  }

  std::string who(int r) const {
    const int n = node_of(r);
    return "rank " + std::to_string(r) + (n >= 0 ? " (node " + std::to_string(n) + ")" : "");
  }

  std::string who_all(const std::vector<int>& rs, bool with_node = true) const {
    std::set<int> u(rs.begin(), rs.end());
    if (u.size() == 1) return with_node ? who(*u.begin()) : "rank " + std::to_string(*u.begin());
    std::set<int> nodes;
    for (int r : u) nodes.insert(node_of(r));
    std::string s = "ranks " + ranges({u.begin(), u.end()});
    if (with_node && nodes.size() == 1 && *nodes.begin() >= 0)
      s += " (node " + std::to_string(*nodes.begin()) + ")";
    return s;
  }

  const RankFacts* facts(int r) const {
    auto it = facts_.find(r);
    return it == facts_.end() ? nullptr : it->second;
  }

  bool node_silent(int n) const {
    if (n < 0) return false;
    const auto& s = pic_.job.silent_nodes;
    if (std::find(s.begin(), s.end(), n) != s.end()) return true;
    return pic_.have_job && pic_.job.nnodes > 0 && n < pic_.job.nnodes && !reported_.count(n);
  }

  std::vector<int> ranks_of_node(int n) const {
    std::vector<int> out;
    const int world = pic_.job.world;
    for (int r = 0; r < world; ++r)
      if (node_of(r) == n) out.push_back(r);
    return out;
  }

  std::string op_text(const Group& g, const OpRec& o) const {
    std::string s = o.signature() + " #" + std::to_string(o.seq);
    if (!order_.empty() && &g != order_.front()) s += " of group " + g.name;
    return s;
  }

  static bool stuck_op(const OpRec& o, double stuck_ms) {
    if (o.state == "running") return !(o.age_ms < stuck_ms);
    return o.state == "failed" && (o.error_kind == "timeout" || o.error_kind == "peer");
  }

  // ------------------------------------------------------------ 1. mismatched collectives

  bool find_mismatch(Verdict& v) {
    for (const Group* g : order_) {
      if (g->members.size() < 2) continue;
      std::set<uint64_t> colls;
      for (const auto& [r, m] : g->members)
        for (const auto& [c, o] : m.by_coll) colls.insert(c);
      for (uint64_t c : colls) {
        std::map<std::string, std::vector<int>> by_sig;  // signature -> group ranks
        std::map<int, const OpRec*> ops;
        for (const auto& [r, m] : g->members)
          if (auto it = m.by_coll.find(c); it != m.by_coll.end())
            by_sig[it->second->signature()].push_back(r), ops[r] = it->second;
        if (by_sig.size() > 1) return explain_mismatch(v, *g, c, by_sig, ops);
      }
    }
    return false;
  }

  // What the group's history says comes at collective `c`: after the last op all agreed on, the
  // op that followed it the previous time it was called.
  std::string expected_at(const Group& g, uint64_t c, int ref) const {
    const Member& m = g.members.at(ref);
    auto prev = m.by_coll.find(c - 1);
    if (c == 0 || prev == m.by_coll.end()) return "";
    const std::string last = prev->second->signature();
    for (auto it = std::make_reverse_iterator(prev); it != m.by_coll.rend(); ++it) {
      if (it->second->signature() != last) continue;
      auto next = m.by_coll.find(it->first + 1);
      if (next != m.by_coll.end()) return next->second->signature();
    }
    return "";
  }

  // True when, in rank `ref`'s history, `skipped` was directly followed by `called`.
  bool follows(const Group& g, int ref, const std::string& skipped, const std::string& called,
               uint64_t before) const {
    const Member& m = g.members.at(ref);
    for (const auto& [c, o] : m.by_coll) {
      if (c >= before) break;
      auto next = m.by_coll.find(c + 1);
      if (o->signature() == skipped && next != m.by_coll.end() && next->second->signature() == called)
        return true;
    }
    return false;
  }

  bool explain_mismatch(Verdict& v, const Group& g, uint64_t c,
                        const std::map<std::string, std::vector<int>>& by_sig,
                        const std::map<int, const OpRec*>& ops) {
    // The expected op: from history where it speaks, else the majority's.
    std::string expected;
    size_t most = 0;
    for (const auto& [sig, rs] : by_sig)
      if (rs.size() > most) expected = sig, most = rs.size();
    for (const auto& [sig, rs] : by_sig) {
      const std::string h = expected_at(g, c, rs.front());
      if (!h.empty() && by_sig.count(h)) {
        expected = h;
        break;
      }
    }
    const std::vector<int>& good = by_sig.at(expected);
    std::vector<int> bad, bad_global, good_global;
    std::string called;
    for (const auto& [sig, rs] : by_sig)
      if (sig != expected)
        for (int r : rs) bad.push_back(r), bad_global.push_back(g.global(r)), called = sig;
    for (int r : good) good_global.push_back(g.global(r));
    const OpRec& want = *ops.at(good.front());
    const OpRec& got = *ops.at(bad.front());
    const bool skipped = follows(g, good.front(), expected, called, c);
    v.cause = skipped ? "skipped" : "mismatch";
    v.ranks = bad_global;
    v.node = node_of(bad_global.front());
    const std::string culprit = who_all(bad_global);
    const std::string step = want.step >= 0 ? "; step " + std::to_string(want.step) : "";
    if (skipped)
      v.headline = culprit + " skipped a collective: it called " + called + " where " + who_all(good_global) +
                   " called " + op_text(g, want) + " (the op that comes before it)" + step;
    else
      v.headline = culprit + " called a mismatched collective: " + called + " as #" +
                   std::to_string(want.seq) + (&g != order_.front() ? " of group " + g.name : "") +
                   " where " + who_all(good_global) + " called " + expected + " (" + differs(got, want) +
                   ")" + step;
    v.details.push_back("collective number " + std::to_string(c) + " of group " + g.name + " (" + g.backend +
                        ")");
    for (int r : bad)
      v.details.push_back(who(g.global(r)) + ": " + ops.at(r)->signature() + ", state " + ops.at(r)->state +
                          (ops.at(r)->error.empty() ? "" : ": " + ops.at(r)->error));
    return true;
  }

  // ------------------------------------------------------------ 2. who waits for whom

  std::vector<Wait> waits() const {
    std::vector<Wait> out;
    for (const Group* g : order_) {
      uint64_t kmax = 0;
      bool any = false;
      for (const auto& [r, m] : g->members) {
        const OpRec* o = m.frontier;
        if (!o || !stuck_op(*o, opt_.stuck_ms)) continue;
        add_op_waits(*g, m, *o, out);
        if (collective(*o)) kmax = std::max(kmax, o->coll), any = true;
      }
      if (any) add_behind(*g, kmax, out);
    }
    return out;
  }

  void add_op_waits(const Group& g, const Member& m, const OpRec& o, std::vector<Wait>& out) const {
    auto edge = [&](int peer, bool err) {
      const int to = g.global(peer);
      if (to >= 0 && to != m.global) out.push_back(Wait{m.global, to, &g, &o, err, o.error_kind});
    };
    if (o.waiting_for >= 0) edge(o.waiting_for, false);
    if (o.state == "failed" && o.error_peer >= 0) edge(o.error_peer, true);
    // The shm backend sees every peer's arrival: a peer not seen is awaited.
    if (o.state == "running" && g.backend == "shm")
      for (size_t p = 0; p < o.late_us.size(); ++p)
        if (std::isnan(o.late_us[p])) edge(static_cast<int>(p), false);
  }

  // Members that have not entered collective kmax, which others are stuck in.
  void add_behind(const Group& g, uint64_t kmax, std::vector<Wait>& out) const {
    std::vector<const Member*> in_op;
    for (const auto& [r, m] : g.members)
      if (auto it = m.by_coll.find(kmax); it != m.by_coll.end() && stuck_op(*it->second, opt_.stuck_ms))
        in_op.push_back(&m);
    for (int r = 0; r < g.size; ++r) {
      const int to = g.global(r);
      auto it = g.members.find(r);
      bool behind;
      if (it != g.members.end()) {
        behind = !it->second.by_coll.count(kmax) &&
                 (it->second.by_coll.empty() || it->second.by_coll.rbegin()->first < kmax);
      } else {  // no dump: behind when gzrun saw it stopped, dead or silent
        const RankFacts* f = facts(to);
        behind = to >= 0 && (node_silent(node_of(to)) || (f && f->state != "running") || (f && !f->answered));
      }
      if (!behind || to < 0) continue;
      for (const Member* w : in_op) out.push_back(Wait{w->global, to, &g, w->by_coll.at(kmax), false, ""});
    }
  }

  bool find_blocked(Verdict& v) {
    const std::vector<Wait> ws = waits();
    if (ws.empty()) return false;
    std::set<int> waiting;
    std::map<int, std::vector<const Wait*>> waited;
    for (const auto& w : ws) waiting.insert(w.from), waited[w.to].push_back(&w);
    std::vector<int> roots;
    for (const auto& [r, in] : waited)
      if (!waiting.count(r)) roots.push_back(r);
    if (roots.empty()) return explain_cycle(v, ws);
    // Several roots on one silent node: the node is the culprit.
    std::set<int> nodes;
    for (int r : roots) nodes.insert(node_of(r));
    if (nodes.size() == 1 && node_silent(*nodes.begin()))
      return explain_silent_node(v, *nodes.begin(), roots, waited);
    // Else the root gzrun saw die or stop first, then the one most ranks wait for.
    auto weight = [&](int r) {
      const RankFacts* f = facts(r);
      if (f && f->first_failure && !f->stopped_by_gzrun && f->state != "running") return 0;
      if (f && f->state == "stopped") return 1;
      return 2;
    };
    std::sort(roots.begin(), roots.end(), [&](int a, int b) {
      return weight(a) != weight(b) ? weight(a) < weight(b) : waited[a].size() > waited[b].size();
    });
    explain_root(v, roots.front(), waited[roots.front()]);
    for (size_t i = 1; i < roots.size(); ++i)
      v.details.push_back("also waited for: " + who(roots[i]) + " (" +
                          std::to_string(waited[roots[i]].size()) + " wait(s))");
    return true;
  }

  // The op most telling about a wait: in the most root-level group, the oldest.
  const Wait* best(const std::vector<const Wait*>& in) const {
    const Wait* b = nullptr;
    auto rank_of = [&](const Group* g) {
      return std::find(order_.begin(), order_.end(), g) - order_.begin();
    };
    for (const Wait* w : in)
      if (!b || rank_of(w->group) < rank_of(b->group)) b = w;
    return b;
  }

  double longest(const std::vector<const Wait*>& in) const {
    double ms = NAN;
    for (const Wait* w : in) {
      const double t = w->op->state == "running" ? w->op->age_ms : w->op->dur_ms;
      if (!std::isnan(t) && !(t <= ms)) ms = t;
    }
    return ms;
  }

  std::vector<int> waiters(const std::vector<const Wait*>& in) const {
    std::vector<int> out;
    for (const Wait* w : in) out.push_back(w->from);
    return out;
  }

  void explain_root(Verdict& v, int r, const std::vector<const Wait*>& in) {
    const Wait* w = best(in);
    const std::string op = op_text(*w->group, *w->op);
    const double ms = longest(in);
    const std::string waited = who_all(waiters(in)) + " wait for it in " + op +
                               (std::isnan(ms) || ms < 100 ? "" : " (for " + fmt_s(ms) + ")");
    v.ranks = {r};
    v.node = node_of(r);
    const RankFacts* f = facts(r);
    auto it = dump_.find(r);
    const RankDump* d = it == dump_.end() ? nullptr : it->second;
    if (f &&
        (f->state == "killed" || (f->state == "exited" && f->status.find("code 0") == std::string::npos)) &&
        !f->stopped_by_gzrun) {
      v.cause = "died";
      v.headline = who(r) + " died (" + (f->status.empty() ? f->state : f->status) + ") while " +
                   who_all(waiters(in)) + " were in " + op + " with it";
    } else if (node_silent(v.node)) {
      explain_silent_node(v, v.node, {r}, {{r, in}});
      return;
    } else if (f && f->state == "stopped") {
      v.cause = "stopped";
      v.headline = who(r) + (entered(r, *w) ? " stopped in " + op : " has not entered " + op) +
                   ": its process is stopped (state T: SIGSTOP or a debugger); " + waited;
    } else if (d) {
      explain_alive(v, r, *d, *w, waited, ms);
    } else {
      v.cause = "hung";
      v.headline = who(r) + " has not entered " + op + " and did not answer the dump request" +
                   (f ? " (its process is " + f->state + ")" : "") + "; " + waited;
    }
    add_last_op(v, r);
  }

  // Whether rank r (with a dump) has a record of the collective the waiter is in.
  bool entered(int r, const Wait& w) const {
    auto d = dump_.find(r);
    if (d == dump_.end()) return false;
    for (const auto& c : d->second->comms)
      if (c.name == w.group->name)
        for (const auto& o : c.ops)
          if (!o.queued && collective(o) && o.coll == w.op->coll) return true;
    return false;
  }

  void explain_alive(Verdict& v, int r, const RankDump& d, const Wait& w, const std::string& waited,
                     double ms) {
    const std::string op = op_text(*w.group, *w.op);
    const RankFacts* f = facts(r);
    if (f && f->state == "exited") {
      v.cause = "skipped";
      v.headline = who(r) + " exited (" + f->status + ") without calling " + op +
                   ": it issued fewer collectives than the others (one skipped?); " + waited;
      return;
    }
    const int64_t drift = step_drift(r, w);
    if (drift >= 0) {
      v.cause = "skipped";
      v.headline = who(r) + " skipped a collective in step " + std::to_string(drift) +
                   ": its collectives are one ahead of the others' from there on; " + waited;
      return;
    }
    v.cause = "hung";
    std::string where = d.phase.empty() ? "" : "; step " + std::to_string(d.step) + ", phase " + d.phase;
    if (!d.phase.empty() && !std::isnan(d.phase_for_ms)) where += ", " + fmt_s(d.phase_for_ms);
    v.headline = who(r) + (entered(r, w) ? " is stuck in " : " has not entered ") + op + where;
    v.details.push_back(waited);
    (void)ms;
  }

  // The step of the first collective where rank r's step differs from the waiter's at the same
  // collective number (r being ahead), or -1.
  int64_t step_drift(int r, const Wait& w) const {
    auto d = dump_.find(r);
    if (d == dump_.end()) return -1;
    const Member* mine = nullptr;
    for (const auto& [gr, m] : w.group->members)
      if (m.global == r) mine = &m;
    const Member* ref = nullptr;
    for (const auto& [gr, m] : w.group->members)
      if (m.global == w.from) ref = &m;
    if (!mine || !ref) return -1;
    for (const auto& [c, o] : mine->by_coll) {
      auto it = ref->by_coll.find(c);
      if (it == ref->by_coll.end() || o->step < 0 || it->second->step < 0) continue;
      if (o->step > it->second->step) return it->second->step;
      if (o->step < it->second->step) return -1;
    }
    return -1;
  }

  void add_last_op(Verdict& v, int r) const {
    auto d = dump_.find(r);
    if (d == dump_.end()) {
      v.details.push_back(who(r) + " left no dump" +
                          (facts(r) ? " (gzrun saw it " + facts(r)->state + ")" : ""));
      return;
    }
    for (const Group* g : order_)
      for (const auto& [gr, m] : g->members)
        if (m.global == r && m.frontier) {
          const OpRec& o = *m.frontier;
          v.details.push_back(who(r) + "'s last op: " + op_text(*g, o) + ", " + o.state +
                              (o.step >= 0 ? ", step " + std::to_string(o.step) + ", phase " + o.phase : ""));
          return;
        }
  }

  bool explain_silent_node(Verdict& v, int n, const std::vector<int>& roots,
                           const std::map<int, std::vector<const Wait*>>& waited) {
    std::vector<const Wait*> in;
    for (int r : roots)
      if (auto it = waited.find(r); it != waited.end())
        in.insert(in.end(), it->second.begin(), it->second.end());
    bool closed = false;
    for (const Wait* w : in) closed = closed || (w->error && w->error_kind == "peer");
    std::vector<int> rs = ranks_of_node(n);
    if (rs.empty()) rs = roots;
    const Wait* w = best(in);
    const std::string op = w ? op_text(*w->group, *w->op) : std::string("their ops");
    v.node = n;
    v.ranks = rs;
    if (closed) {
      v.cause = "node_died";
      v.headline = "node " + std::to_string(n) + " (" + who_all(rs, false) +
                   ") died: its gzrun went silent and " + who_all(waiters(in)) +
                   " lost their connections to its ranks in " + op;
    } else {
      const double ms = longest(in);
      v.cause = "link";
      v.headline = "node " + std::to_string(n) + " (" + who_all(rs, false) +
                   ") is cut off (a lost link or a frozen host): its gzrun went silent, no connection to it "
                   "was closed, and " +
                   who_all(waiters(in)) + " wait for its ranks in " + op +
                   (std::isnan(ms) ? "" : " (for " + fmt_s(ms) + ")");
    }
    if (!pic_.job.failure.empty()) v.details.push_back("the job's failure record: " + pic_.job.failure);
    return true;
  }

  // ------------------------------------------------------------ 3. everyone waits: the link

  bool explain_cycle(Verdict& v, const std::vector<Wait>& ws) {
    std::map<int, int> touches;  // node -> cross-node waits it takes part in
    std::vector<const Wait*> cross;
    for (const auto& w : ws) {
      const int a = node_of(w.from), b = node_of(w.to);
      if (a == b || a < 0 || b < 0) continue;
      cross.push_back(&w);
      ++touches[a], ++touches[b];
    }
    std::vector<int> all;
    for (const auto& w : ws) all.push_back(w.from), all.push_back(w.to);
    const Wait* w0 = best([&] {
      std::vector<const Wait*> p;
      for (const auto& w : ws) p.push_back(&w);
      return p;
    }());
    const std::string op = op_text(*w0->group, *w0->op);
    if (cross.empty()) {
      v.cause = "mismatch";
      v.ranks = all;
      v.headline = who_all(all) + " wait for each other in " + op +
                   " (a deadlock: each has entered an op another has not; ops on different groups?)";
      return true;
    }
    std::vector<int> always;
    for (const auto& [n, k] : touches)
      if (k == static_cast<int>(cross.size())) always.push_back(n);
    v.cause = "link";
    std::vector<const Wait*> in(cross.begin(), cross.end());
    const double ms = longest(in);
    if (always.size() == 1) {
      v.node = always.front();
      v.ranks = ranks_of_node(v.node);
      v.headline = "the link of node " + std::to_string(v.node) + " is down or stalled: its ranks and " +
                   "the other nodes' all entered " + op + " and wait for each other across it" +
                   (std::isnan(ms) ? "" : " (for " + fmt_s(ms) + ")");
    } else {
      v.ranks = all;
      v.headline = who_all(all) + " all entered " + op +
                   " and wait for each other across nodes: a lost link" +
                   (std::isnan(ms) ? "" : " (for " + fmt_s(ms) + ")");
    }
    for (const Wait* w : cross)
      if (v.details.size() < 8)
        v.details.push_back(who(w->from) + " waits for " + who(w->to) + " in " + op_text(*w->group, *w->op));
    return true;
  }

  // ------------------------------------------------------------ 4. deaths gzrun saw, failures

  bool find_died(Verdict& v) {
    for (const auto& [r, f] : facts_) {
      if (!f->first_failure || f->stopped_by_gzrun || f->state == "running" || f->state == "stopped")
        continue;
      if (f->status.find("code 0") != std::string::npos) continue;
      auto d = dump_.find(r);
      if (d != dump_.end() && has_failed_op(*d->second)) continue;  // it died of a failed op: a symptom
      v.cause = "died";
      v.ranks = {r};
      v.node = node_of(r);
      v.headline = who(r) + " died (" + f->status + ") outside any failed collective";
      add_last_op(v, r);
      return true;
    }
    return false;
  }

  static bool has_failed_op(const RankDump& d) {
    for (const auto& c : d.comms)
      for (const auto& o : c.ops)
        if (o.state == "failed") return true;
    return false;
  }

  bool find_failure(Verdict& v) {
    for (const Group* g : order_)
      for (const auto& [gr, m] : g->members)
        for (const auto& o : m.comm->ops)
          if (o.state == "failed") {
            v.cause = "failed";
            v.ranks = {m.global};
            v.node = node_of(m.global);
            v.headline = op_text(*g, o) + " failed on " + who(m.global) + ": " + o.error;
            return true;
          }
    return false;
  }

  void healthy(Verdict& v) {
    v.cause = "healthy";
    const Group* g = order_.empty() ? nullptr : order_.front();
    if (!g || g->members.empty()) {
      v.cause = "unknown";
      v.headline = "no communicator in the dumps: nothing recorded yet";
      return;
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& [r, m] : g->members)
      if (m.frontier) lo = std::min(lo, m.frontier->seq), hi = std::max(hi, m.frontier->seq);
    v.headline = "no rank is stuck: " + std::to_string(g->members.size()) + " rank(s) of group " + g->name +
                 " are at ops #" + std::to_string(lo) + (hi != lo ? "-" + std::to_string(hi) : "") +
                 ", none waiting longer than " + fmt_s(opt_.stuck_ms);
    for (const auto& d : pic_.dumps)
      if (!d.phase.empty() && v.details.size() < 16)
        v.details.push_back(who(d.rank) + ": step " + std::to_string(d.step) + ", phase " + d.phase);
  }

  const Picture& pic_;
  JudgeOptions opt_;
  std::map<std::string, Group> groups_;
  std::vector<const Group*> order_;
  std::map<int, const RankFacts*> facts_;
  std::map<int, const RankDump*> dump_;
  std::map<int, int> node_;
  std::set<int> reported_;
};

}  // namespace

Verdict judge(const Picture& pic, const JudgeOptions& options) { return Judge(pic, options).run(); }

std::string render(const Verdict& v, const Picture& pic) {
  std::ostringstream out;
  out << "verdict: " << v.headline << "\n";
  for (const auto& d : v.details) out << "  " << d << "\n";
  if (!pic.notes.empty()) {
    out << "  input (" << pic.dumps.size() << " dump(s) read):\n";
    for (const auto& n : pic.notes) out << "    " << n << "\n";
  }
  return out.str();
}

}  // namespace gz::doctor
