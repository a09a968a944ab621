// The dump's JSON lines (schema: docs/debugging.md, "The dump format"). Written by hand: the
// comm layer stays free of a JSON library, and the writer is a few string appends per record.
#include <limits.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>

#include "gz/comm/flight_dump.h"
#include "gz/core/env.h"

namespace gz::comm {

namespace {

void add_escaped(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);  // UTF-8 passes through
        }
    }
  }
  out += '"';
}

// A JSON line built field by field: {"a":1,"b":"x"}.
class Line {
 public:
  explicit Line(const char* type) { s_ = std::string("{\"type\":\"") + type + "\""; }
  Line& str(const char* k, const std::string& v) {
    key(k);
    add_escaped(s_, v);
    return *this;
  }
  Line& num(const char* k, long long v) {
    key(k);
    s_ += std::to_string(v);
    return *this;
  }
  Line& real(const char* k, double v, int digits = 3) {
    key(k);
    if (!std::isfinite(v)) {
      s_ += "null";
      return *this;
    }
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    s_ += buf;
    return *this;
  }
  Line& raw(const char* k, const std::string& json) {
    key(k);
    s_ += json;
    return *this;
  }
  Line& boolean(const char* k, bool v) { return raw(k, v ? "true" : "false"); }
  std::string done() { return s_ + "}\n"; }

 private:
  void key(const char* k) {
    s_ += ",\"";
    s_ += k;
    s_ += "\":";
  }
  std::string s_;
};

std::string int_array(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Set once the launcher moved this process (set_flight_dump_identity); read by every dump.
std::mutex g_identity_mu;
std::optional<FlightDumpIdentity> g_moved_identity;

std::optional<FlightDumpIdentity> moved_identity() {
  std::lock_guard<std::mutex> lock(g_identity_mu);
  return g_moved_identity;
}

long long env_int(const Env& env, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto v = env.get_int(n)) return *v;
  return -1;
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The members of a group without a parent: its own list, else, for a group as large as the world
// on the rank the launcher gave this process, the world's ranks.
std::vector<int> root_ranks(const FlightSnapshot& s, long long rank, long long world) {
  std::vector<int> ranks = s.identity.ranks;
  if (ranks.empty() && world == s.identity.size && rank == s.identity.rank)
    for (int r = 0; r < s.identity.size; ++r) ranks.push_back(r);
  return ranks;
}

// Global ranks of every snapshot's members: its own list, mapped through its parents'.
std::map<uint64_t, std::vector<int>> resolve_ranks(const std::vector<FlightSnapshot>& snaps, long long rank,
                                                   long long world) {
  std::map<uint64_t, const FlightSnapshot*> by_id;
  for (const auto& s : snaps) by_id[s.id] = &s;
  std::map<uint64_t, std::vector<int>> out;
  for (const auto& s : snaps) {
    std::vector<int> ranks = s.identity.parent == 0 ? root_ranks(s, rank, world) : s.identity.ranks;
    uint64_t parent = s.identity.parent;
    for (int depth = 0; parent != 0 && !ranks.empty() && depth < 8; ++depth) {
      auto it = by_id.find(parent);
      const std::vector<int> up = it == by_id.end()                  ? std::vector<int>()
                                  : it->second->identity.parent == 0 ? root_ranks(*it->second, rank, world)
                                                                     : it->second->identity.ranks;
      if (up.empty()) {
        ranks.clear();
        break;
      }
      for (int& r : ranks) r = r >= 0 && r < static_cast<int>(up.size()) ? up[r] : -1;
      parent = it->second->identity.parent;
    }
    out[s.id] = ranks;
  }
  return out;
}

std::string op_name(const OpInfo& i) { return i.task ? "task" : op_kind_name(i.kind); }

bool reducing(OpKind k) {
  return k == OpKind::allreduce || k == OpKind::reduce || k == OpKind::reduce_scatter;
}

std::string op_line(uint64_t comm, const OpRecord& r, int64_t now) {
  Line l("op");
  l.num("comm", static_cast<long long>(comm));
  if (r.state == OpState::queued)
    l.raw("seq", "null");
  else
    l.num("seq", static_cast<long long>(r.seq)).num("coll", static_cast<long long>(r.coll));
  l.str("op", op_name(r.info));
  if (!r.info.task) {
    l.str("dtype", dtype_name(r.info.dtype)).num("count", static_cast<long long>(r.info.count));
    if (reducing(r.info.kind)) l.str("reduce", reduce_op_name(r.info.reduce));
    if (r.info.kind == OpKind::broadcast || r.info.kind == OpKind::reduce) l.num("root", r.info.root);
    if (r.info.kind == OpKind::send || r.info.kind == OpKind::recv)
      l.num("peer", r.info.root).num("tag", r.info.tag);
  }
  l.str("state", op_state_name(r.state));
  l.num("issue_ns", r.issue_ns).num("start_ns", r.start_ns).num("end_ns", r.end_ns);
  // Ages on this host's clock, computed at dump time: readers never compare clocks across hosts.
  const int64_t since = r.state == OpState::queued ? r.issue_ns : r.start_ns;
  if (r.end_ns == 0 && since > 0) l.real("age_ms", (now - since) / 1e6);
  if (r.end_ns > 0 && r.start_ns > 0) l.real("dur_ms", (r.end_ns - r.start_ns) / 1e6, 4);
  if (r.state != OpState::queued) l.str("phase", phase_name(r.phase)).num("step", r.step);
  if (r.waiting_for >= 0) l.num("waiting_for", r.waiting_for);
  if (!r.arrival_ns.empty()) {
    std::string a = "[";
    for (size_t p = 0; p < r.arrival_ns.size(); ++p) {
      a += p ? "," : "";
      if (r.arrival_ns[p] < 0) {
        a += "null";
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f", r.arrival_ns[p] / 1e3);
        a += buf;
      }
    }
    l.raw("late_us", a + "]");
  }
  if (r.state == OpState::failed) {
    l.str("error", r.error).str("error_kind", r.error_kind.empty() ? "error" : r.error_kind);
    if (r.error_peer >= 0) l.num("error_peer", r.error_peer);
  }
  return l.done();
}

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace

const char* dump_reason_name(DumpReason r) {
  switch (r) {
    case DumpReason::request:
      return "request";
    case DumpReason::signal:
      return "signal";
    case DumpReason::failure:
      return "failure";
    case DumpReason::exit:
      return "exit";
  }
  return "unknown";
}

std::string format_flight_dump(const std::vector<FlightSnapshot>& snaps, DumpReason reason, int64_t request,
                               const std::string& note) {
  const Env env = Env::from_process();
  const int64_t now = steady_now_ns();
  const long long wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  const PhaseMark pm = current_phase();
  std::string out;
  Line h("header");
  h.str("schema", kFlightDumpSchema).num("version", kFlightDumpVersion);
  const std::optional<FlightDumpIdentity> moved = moved_identity();
  h.str("job", moved ? moved->run_id : env.get("GZ_RUN_ID", env.get("TORCHELASTIC_RUN_ID", "")));
  const long long rank = moved ? moved->rank : env_int(env, {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"});
  const long long world =
      moved ? moved->world : env_int(env, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  h.num("rank", rank).num("world", world);
  h.num("local_rank", env_int(env, {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}));
  h.num("node", moved ? moved->node : env_int(env, {"GROUP_RANK", "NODE_RANK"}));
  h.str("host", host_name()).num("pid", getpid());
  h.str("reason", dump_reason_name(reason)).num("request", request);
  if (!note.empty()) h.str("note", note);
  h.num("time_unix_ms", wall_ms).num("steady_ns", now);
  h.raw("clock", std::string("{\"source\":\"") + flight_clock_source() +
                     "\",\"ticks_per_ns\":" + std::to_string(flight_ticks_per_ns()) + "}");
  {
    std::string ph = "{\"name\":\"" + std::string(phase_name(pm.phase)) +
                     "\",\"step\":" + std::to_string(pm.step) +
                     ",\"since_ns\":" + std::to_string(pm.since_ns);
    if (pm.since_ns > 0) {
      char buf[48];
      std::snprintf(buf, sizeof buf, ",\"for_ms\":%.3f", (now - pm.since_ns) / 1e6);
      ph += buf;
    }
    h.raw("phase", ph + "}");
  }
  h.num("comms", static_cast<long long>(snaps.size()));
  out += h.done();
  const auto global = resolve_ranks(snaps, rank, world);
  size_t ops = 0;
  for (const FlightSnapshot& s : snaps) {
    Line c("comm");
    c.num("id", static_cast<long long>(s.id)).str("name", s.identity.name).str("backend", s.identity.backend);
    c.num("rank", s.identity.rank).num("size", s.identity.size);
    const std::vector<int>& ranks = global.at(s.id);
    c.raw("ranks", ranks.empty() ? "null" : int_array(ranks));
    c.num("parent", static_cast<long long>(s.identity.parent));
    c.num("capacity", static_cast<long long>(s.capacity)).num("next_seq", static_cast<long long>(s.next_seq));
    c.num("records", static_cast<long long>(s.records.size())).boolean("retired", s.retired);
    out += c.done();
    for (const OpRecord& r : s.records) out += op_line(s.id, r, now);
    ops += s.records.size();
  }
  out += Line("end")
             .num("comms", static_cast<long long>(snaps.size()))
             .num("ops", static_cast<long long>(ops))
             .done();
  return out;
}

namespace {
std::string folder_name(std::string id) {
  for (char& c : id)
    if (c == '/' || c == '\0') c = '_';
  if (id.empty() || id == "." || id == "..") id = "pid-" + std::to_string(getpid());
  return id;
}
}  // namespace

std::string flight_dump_dir() {
  const Env env = Env::from_process();
  const std::string started = env.get("GZ_RUN_ID", env.get("TORCHELASTIC_RUN_ID", ""));
  const std::optional<FlightDumpIdentity> moved = moved_identity();
  std::string dir = env.get("GZ_DUMP_DIR", "");
  if (dir.empty()) return "/tmp/gz-dumps/" + folder_name(moved ? moved->run_id : started);
  if (!moved || started.empty()) return dir;
  // gzrun's folder per round ends in the round's run id (dump_dir_for); a folder of the user's
  // own is the same for every round.
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  if (slash == std::string::npos || dir.substr(slash + 1) != folder_name(started)) return dir;
  return dir.substr(0, slash + 1) + folder_name(moved->run_id);
}

namespace {
std::string dump_stem() {
  const Env env = Env::from_process();
  const std::optional<FlightDumpIdentity> moved = moved_identity();
  const long long rank = moved ? moved->rank : env_int(env, {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"});
  return flight_dump_dir() + "/" +
         (rank >= 0 ? "rank-" + std::to_string(rank) : "pid-" + std::to_string(getpid()));
}
}  // namespace

void set_moved_identity(const FlightDumpIdentity& id) {
  std::lock_guard<std::mutex> lock(g_identity_mu);
  g_moved_identity = id;
}

std::string flight_dump_path() { return dump_stem() + ".jsonl"; }
std::string flight_ready_path() { return dump_stem() + ".ready"; }

}  // namespace gz::comm
