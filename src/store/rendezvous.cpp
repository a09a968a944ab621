#include "gz/store/rendezvous.h"

#include <algorithm>
#include <cerrno>
#include <functional>
#include <thread>
#include <vector>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/etcd_store.h"
#include "gz/store/file_store.h"
#include "gz/store/mem_store.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rdzv_auth.h"

namespace gz {

namespace {

constexpr int kDefaultMasterPort = 29500;

/// Integer variable within [lo, hi]; InvalidArgument naming it otherwise.
std::optional<long long> int_var(const Env& env, const std::string& name, long long lo, long long hi) {
  auto v = env.get_int(name);
  if (v && (*v < lo || *v > hi))
    GZ_THROW(InvalidArgument, "environment variable ", name, "=", *v, " is out of range [", lo, ", ", hi,
             "]");
  return v;
}

/// Names of the variables of one launcher family, for messages.
struct Names {
  std::string rank, world, local_rank, local_world, node_rank, num_nodes;
};

/// Fill the derived fields and check that everything is consistent.
void complete(WorldInfo& w, std::optional<long long> local_rank, std::optional<long long> local_world,
              std::optional<long long> node_rank, std::optional<long long> num_nodes, const Names& n) {
  if (w.world_size < 1) GZ_THROW(InvalidArgument, n.world, "=", w.world_size, " must be at least 1");
  if (w.rank < 0 || w.rank >= w.world_size)
    GZ_THROW(InvalidArgument, n.rank, "=", w.rank, " must be in [0, ", n.world, "=", w.world_size, ")");
  if (num_nodes && (*num_nodes < 1 || *num_nodes > w.world_size))
    GZ_THROW(InvalidArgument, n.num_nodes, "=", *num_nodes, " must be in [1, ", n.world, "=", w.world_size,
             "]");
  if (local_world) {
    if (*local_world < 1 || *local_world > w.world_size)
      GZ_THROW(InvalidArgument, n.local_world, "=", *local_world, " must be in [1, ", n.world, "=",
               w.world_size, "]");
    w.local_world_size = static_cast<int>(*local_world);
  } else if (num_nodes && w.world_size % *num_nodes == 0) {
    w.local_world_size = static_cast<int>(w.world_size / *num_nodes);
  } else {
    w.local_world_size = w.world_size;  // no node information: one node
  }
  const bool uniform = w.world_size % w.local_world_size == 0;
  if (local_rank) {
    if (*local_rank < 0 || *local_rank >= w.local_world_size)
      GZ_THROW(InvalidArgument, n.local_rank, "=", *local_rank, " must be in [0, ", n.local_world, "=",
               w.local_world_size, ")");
    w.local_rank = static_cast<int>(*local_rank);
  } else {
    w.local_rank = w.rank % w.local_world_size;
  }
  if (num_nodes)
    w.num_nodes = static_cast<int>(*num_nodes);
  else
    w.num_nodes = (w.world_size + w.local_world_size - 1) / w.local_world_size;
  if (node_rank) {
    w.node_rank = static_cast<int>(*node_rank);
  } else if (uniform) {
    w.node_rank = w.rank / w.local_world_size;
  } else {
    GZ_LOG(warn, "detect_world: ranks per node differ (", n.world, "=", w.world_size, ", ", n.local_world,
           "=", w.local_world_size, "): node index unknown, set ",
           n.node_rank.empty() ? "NODE_RANK" : n.node_rank);
    w.node_rank = std::min(w.rank / w.local_world_size, w.num_nodes - 1);
  }
  if (w.node_rank < 0 || w.node_rank >= w.num_nodes)
    GZ_THROW(InvalidArgument, n.node_rank.empty() ? "node rank" : n.node_rank, "=", w.node_rank,
             " must be in [0, ", n.num_nodes.empty() ? "number of nodes" : n.num_nodes, "=", w.num_nodes,
             ")");
}

void read_master(WorldInfo& w, const Env& env) {
  if (auto a = env.get("MASTER_ADDR"); a && !a->empty()) w.master_addr = *a;
  if (auto p = int_var(env, "MASTER_PORT", 0, 65535)) w.master_port = static_cast<int>(*p);
}

/// "4", "2(x3),1" (SLURM_TASKS_PER_NODE) -> tasks on node `node`.
std::optional<long long> slurm_tasks_on_node(const std::string& spec, long long node) {
  long long first = 0;
  size_t i = 0;
  while (i < spec.size()) {
    size_t j = i;
    while (j < spec.size() && std::isdigit(static_cast<unsigned char>(spec[j]))) ++j;
    if (j == i) return std::nullopt;
    long long count = parse_int(spec.substr(i, j - i), "SLURM_TASKS_PER_NODE");
    long long repeat = 1;
    if (j < spec.size() && spec[j] == '(') {
      size_t close = spec.find(')', j);
      if (close == std::string::npos || spec.compare(j, 2, "(x") != 0) return std::nullopt;
      repeat = parse_int(spec.substr(j + 2, close - j - 2), "SLURM_TASKS_PER_NODE");
      j = close + 1;
    }
    if (node >= first && node < first + repeat) return count;
    first += repeat;
    if (j < spec.size() && spec[j] != ',') return std::nullopt;
    i = j + 1;
  }
  return std::nullopt;
}

/// Split on commas outside brackets.
std::vector<std::string> split_top(const std::string& s) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) GZ_THROW(InvalidArgument, "SLURM nodelist '", s, "': unbalanced brackets");
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) GZ_THROW(InvalidArgument, "SLURM nodelist '", s, "': unbalanced brackets");
  out.push_back(cur);
  return out;
}

/// One bracket range item "07" or "01-04", validated: the lower bound's text and both bounds.
struct Range {
  std::string lo_text;
  long long lo, hi;
};

Range parse_range(const std::string& item, const std::string& all) {
  auto dash = item.find('-');
  std::string lo = item.substr(0, dash);
  std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
  auto digits = [](const std::string& x) {
    return !x.empty() && x.size() < 18 &&
           std::all_of(x.begin(), x.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(lo) || !digits(hi))
    GZ_THROW(InvalidArgument, "SLURM nodelist '", all, "': bad range '", item, "'");
  Range r{lo, std::stoll(lo), std::stoll(hi)};
  if (r.hi < r.lo) GZ_THROW(InvalidArgument, "SLURM nodelist '", all, "': descending range '", item, "'");
  return r;
}

std::string padded(long long v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

/// Items of the bracket group "[a,b-c]" starting at `open`; sets `close` to the ']' position.
std::vector<Range> bracket_group(const std::string& entry, size_t open, size_t& close,
                                 const std::string& all) {
  close = entry.find(']', open);
  if (close == std::string::npos)
    GZ_THROW(InvalidArgument, "SLURM nodelist '", all, "': unbalanced brackets");
  std::string inner = entry.substr(open + 1, close - open - 1);
  std::vector<Range> out;
  size_t start = 0;
  for (;;) {
    size_t comma = inner.find(',', start);
    out.push_back(parse_range(
        inner.substr(start, comma == std::string::npos ? std::string::npos : comma - start), all));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::optional<long long> first_of(const Env& env, std::initializer_list<const char*> names,
                                  std::string& which, long long lo, long long hi) {
  for (const char* n : names)
    if (env.get(n) && !env.get(n)->empty()) {
      which = n;
      return int_var(env, n, lo, hi);
    }
  return std::nullopt;
}

/// Rethrow `e` as its own type with `prefix` in front.
[[noreturn]] void rethrow_with(const std::string& prefix) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(prefix + e.what());
  } catch (const PeerError& e) {
    throw PeerError(prefix + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(prefix + e.what());
  } catch (const SystemError& e) {
    throw Error(prefix + e.what());
  } catch (const Error& e) {
    throw Error(prefix + e.what());
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist, size_t max_hosts) {
  std::vector<std::string> hosts;
  for (const std::string& entry : split_top(nodelist)) {
    if (entry.empty()) continue;
    std::vector<std::string> partial{""};
    size_t i = 0;
    while (i < entry.size()) {
      if (entry[i] == '[') {
        size_t close = 0;
        std::vector<std::string> values;
        for (const Range& r : bracket_group(entry, i, close, nodelist)) {
          if (static_cast<unsigned long long>(r.hi - r.lo) >= max_hosts)
            GZ_THROW(InvalidArgument, "SLURM nodelist '", nodelist, "': more than ", max_hosts, " hosts");
          for (long long v = r.lo; v <= r.hi; ++v) values.push_back(padded(v, r.lo_text.size()));
        }
        if (partial.size() * values.size() > max_hosts)
          GZ_THROW(InvalidArgument, "SLURM nodelist '", nodelist, "': more than ", max_hosts, " hosts");
        std::vector<std::string> next;
        for (auto& p : partial)
          for (auto& v : values) next.push_back(p + v);
        partial.swap(next);
        i = close + 1;
      } else {
        size_t j = entry.find('[', i);
        if (j == std::string::npos) j = entry.size();
        for (auto& p : partial) p += entry.substr(i, j - i);
        i = j;
      }
    }
    for (auto& p : partial) hosts.push_back(p);
    if (hosts.size() > max_hosts)
      GZ_THROW(InvalidArgument, "SLURM nodelist '", nodelist, "': more than ", max_hosts, " hosts");
  }
  if (hosts.empty()) GZ_THROW(InvalidArgument, "SLURM nodelist '", nodelist, "' names no host");
  return hosts;
}

std::string slurm_first_host(const std::string& nodelist) {
  std::string first;
  bool found = false;
  // Validate every entry (cheaply, without expanding) and keep the first host.
  for (const std::string& entry : split_top(nodelist)) {
    if (entry.empty()) continue;
    std::string host;
    size_t i = 0;
    while (i < entry.size()) {
      if (entry[i] == '[') {
        size_t close = 0;
        auto ranges = bracket_group(entry, i, close, nodelist);
        host += ranges.front().lo_text;
        i = close + 1;
      } else {
        host += entry[i++];
      }
    }
    if (!found) first = host;
    found = true;
  }
  if (!found) GZ_THROW(InvalidArgument, "SLURM nodelist '", nodelist, "' names no host");
  return first;
}

WorldInfo detect_world(const Env& env) {
  WorldInfo w;
  const long long kMax = 1 << 30;
  auto present = [&](const char* n) { return env.get(n) && !env.get(n)->empty(); };

  if (present("RANK") || present("WORLD_SIZE")) {
    // torchrun / gzrun / hand-written env://
    if (!present("RANK")) GZ_THROW(InvalidArgument, "WORLD_SIZE is set but RANK is not");
    if (!present("WORLD_SIZE")) GZ_THROW(InvalidArgument, "RANK is set but WORLD_SIZE is not");
    w.rank = static_cast<int>(*int_var(env, "RANK", 0, kMax));
    w.world_size = static_cast<int>(*int_var(env, "WORLD_SIZE", 1, kMax));
    std::string node_var = "GROUP_RANK", nodes_var = "GZ_NNODES";
    auto node = first_of(env, {"GROUP_RANK", "NODE_RANK", "GZ_NODE_RANK"}, node_var, 0, kMax);
    auto nodes = first_of(env, {"GZ_NNODES", "GROUP_WORLD_SIZE"}, nodes_var, 1, kMax);
    complete(w, int_var(env, "LOCAL_RANK", 0, kMax), int_var(env, "LOCAL_WORLD_SIZE", 1, kMax), node, nodes,
             {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", node_var, nodes_var});
    if (env.get("GZ_LAUNCHER", "") == "gzrun")
      w.launcher = "gzrun";
    else if (present("TORCHELASTIC_RUN_ID"))
      w.launcher = "torchrun";
    else
      w.launcher = "env";
  } else if (present("OMPI_COMM_WORLD_RANK")) {
    if (!present("OMPI_COMM_WORLD_SIZE"))
      GZ_THROW(InvalidArgument, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    w.rank = static_cast<int>(*int_var(env, "OMPI_COMM_WORLD_RANK", 0, kMax));
    w.world_size = static_cast<int>(*int_var(env, "OMPI_COMM_WORLD_SIZE", 1, kMax));
    // OMPI_COMM_WORLD_NODE_RANK is the rank among the node's processes, not the node index.
    std::string node_var = "GZ_NODE_RANK", nodes_var = "GZ_NNODES";
    auto node = first_of(env, {"GZ_NODE_RANK", "NODE_RANK"}, node_var, 0, kMax);
    complete(w, int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, kMax),
             int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMax), node, int_var(env, "GZ_NNODES", 1, kMax),
             {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE", node_var, nodes_var});
    w.launcher = "openmpi";
  } else if (present("PMI_RANK")) {
    if (!present("PMI_SIZE")) GZ_THROW(InvalidArgument, "PMI_RANK is set but PMI_SIZE is not");
    w.rank = static_cast<int>(*int_var(env, "PMI_RANK", 0, kMax));
    w.world_size = static_cast<int>(*int_var(env, "PMI_SIZE", 1, kMax));
    std::string node_var = "GZ_NODE_RANK", nodes_var = "GZ_NNODES";
    auto node = first_of(env, {"GZ_NODE_RANK", "NODE_RANK"}, node_var, 0, kMax);
    complete(w, int_var(env, "MPI_LOCALRANKID", 0, kMax), int_var(env, "MPI_LOCALNRANKS", 1, kMax), node,
             int_var(env, "GZ_NNODES", 1, kMax),
             {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", node_var, nodes_var});
    w.launcher = "pmi";
  } else if (present("SLURM_PROCID")) {
    if (!present("SLURM_NTASKS")) GZ_THROW(InvalidArgument, "SLURM_PROCID is set but SLURM_NTASKS is not");
    w.rank = static_cast<int>(*int_var(env, "SLURM_PROCID", 0, kMax));
    w.world_size = static_cast<int>(*int_var(env, "SLURM_NTASKS", 1, kMax));
    auto node = int_var(env, "SLURM_NODEID", 0, kMax);
    auto nodes = int_var(env, "SLURM_NNODES", 1, kMax);
    std::optional<long long> local_world;
    std::string local_var = "SLURM_NTASKS_PER_NODE";
    if (present("SLURM_NTASKS_PER_NODE")) {
      local_world = int_var(env, "SLURM_NTASKS_PER_NODE", 1, kMax);
    } else if (present("SLURM_TASKS_PER_NODE") && node) {
      local_var = "SLURM_TASKS_PER_NODE";
      local_world = slurm_tasks_on_node(*env.get("SLURM_TASKS_PER_NODE"), *node);
      if (!local_world)
        GZ_THROW(InvalidArgument, "SLURM_TASKS_PER_NODE='", *env.get("SLURM_TASKS_PER_NODE"),
                 "' has no entry for SLURM_NODEID=", *node);
    }
    complete(w, int_var(env, "SLURM_LOCALID", 0, kMax), local_world, node, nodes,
             {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_var, "SLURM_NODEID", "SLURM_NNODES"});
    w.launcher = "slurm";
    auto list = env.get("SLURM_JOB_NODELIST");
    if (!list || list->empty()) list = env.get("SLURM_NODELIST");
    if (list && !list->empty()) w.master_addr = slurm_first_host(*list);
  } else {
    w.launcher = "single";
  }
  read_master(w, env);
  return w;
}

namespace {

/// WorldInfo for tcp:// and file://: explicit rank/world from the options, else the environment.
WorldInfo explicit_world(const InitOptions& o, const Env& env, const std::string& method) {
  WorldInfo w = detect_world(env);
  const bool detected = w.launcher != "single";
  if (!detected && (o.rank < 0 || o.world_size < 0))
    GZ_THROW(InvalidArgument, "rendezvous ", method,
             " needs InitOptions::rank and world_size (or RANK/WORLD_SIZE)");
  int rank = o.rank >= 0 ? o.rank : w.rank;
  int world = o.world_size >= 0 ? o.world_size : w.world_size;
  if (world < 1)
    GZ_THROW(InvalidArgument, "rendezvous ", method, ": world_size=", world, " must be at least 1");
  if (rank < 0 || rank >= world)
    GZ_THROW(InvalidArgument, "rendezvous ", method, ": rank=", rank, " must be in [0, world_size=", world,
             ")");
  if (!detected || world != w.world_size) {
    // Nothing says which ranks share a node: assume none do (never wrongly share memory).
    w.local_rank = 0;
    w.local_world_size = 1;
    w.node_rank = rank;
    w.num_nodes = world;
    if (!detected) w.launcher = "env";
  }
  w.rank = rank;
  w.world_size = world;
  return w;
}

std::shared_ptr<TcpStoreServer> host_server(const std::string& host, int port, const std::string& token,
                                            bool insecure, const std::string& port_name) {
  TcpStoreServerOptions so;
  so.bind_addr = is_loopback_host(host) ? host : (host.find(':') != std::string::npos ? "::" : "0.0.0.0");
  so.port = port;
  so.token = token;
  so.allow_insecure = insecure;
  try {
    return std::make_shared<TcpStoreServer>(so);
  } catch (const SystemError& e) {
    if (e.code() == EADDRINUSE)
      GZ_THROW(Error, "rendezvous: rank 0 cannot host the store on port ", port, " (", port_name,
               "): the port is already in use (another job, or a previous run still exiting?); pick a free ",
               port_name);
    throw;
  }
}

void split_host_port(const std::string& rest, const std::string& method, std::string& host, int& port) {
  size_t colon;
  if (!rest.empty() && rest[0] == '[') {
    size_t close = rest.find(']');
    if (close == std::string::npos) GZ_THROW(InvalidArgument, "init_method '", method, "': unclosed '['");
    host = rest.substr(1, close - 1);
    colon = close + 1;
    if (colon >= rest.size() || rest[colon] != ':')
      GZ_THROW(InvalidArgument, "init_method '", method, "' needs host:port");
  } else {
    colon = rest.rfind(':');
    if (colon == std::string::npos) GZ_THROW(InvalidArgument, "init_method '", method, "' needs host:port");
    host = rest.substr(0, colon);
  }
  std::string p = rest.substr(colon + 1);
  while (!p.empty() && p.back() == '/') p.pop_back();
  long long v = parse_int(p, "port of init_method '" + method + "'");
  if (host.empty() || v < 0 || v > 65535)
    GZ_THROW(InvalidArgument, "init_method '", method, "': bad host or port");
  port = static_cast<int>(v);
}

/// A store beyond loopback needs a token: every rank checks (not only the one hosting it), so a
/// job without one fails at once everywhere instead of timing out on the clients.
void require_token(const std::string& host, int port, const std::string& token, bool insecure) {
  if (!token.empty() || insecure || is_loopback_host(host)) return;
  GZ_THROW(InvalidArgument, "rendezvous: the store at ", host, ":", port,
           " is reachable beyond loopback, so every rank needs the same rendezvous token: set GZ_RDZV_TOKEN "
           "(e.g. to the output of `openssl rand -hex 32`) on every node (mpirun -x GZ_RDZV_TOKEN; srun and "
           "torchrun pass the environment on), or GZ_RDZV_INSECURE=1 on a network you trust completely");
}

}  // namespace

namespace {
// meet()'s arrivals: one fixed-size record per arrival (the rank, 4 bytes little-endian) appended
// to one key, so a rank is counted in one store step.
constexpr size_t kArrivalBytes = 4;
const char* const kArrivals = "rdzv/arrivals";

Bytes arrival_record(int rank) {
  Bytes b(kArrivalBytes);
  for (size_t i = 0; i < kArrivalBytes; ++i)
    b[i] = static_cast<uint8_t>(static_cast<uint32_t>(rank) >> (8 * i));
  return b;
}

// Which ranks of `world` arrived, from the arrivals' bytes (repeats counted once).
std::vector<bool> arrived_ranks(const Bytes& list, int world) {
  std::vector<bool> in(static_cast<size_t>(world), false);
  for (size_t at = 0; at + kArrivalBytes <= list.size(); at += kArrivalBytes) {
    uint32_t r = 0;
    for (size_t i = 0; i < kArrivalBytes; ++i) r |= static_cast<uint32_t>(list[at + i]) << (8 * i);
    if (r < in.size()) in[r] = true;
  }
  return in;
}
}  // namespace

/// Every rank announces itself, the last one releases everyone. On timeout say who is missing.
bool meet(Store& store, const WorldInfo& w, Deadline deadline, const std::string& where,
          const std::function<bool()>& leave) {
  Stopwatch sw;
  // A rank counts once however often it arrives (a retried meet: a worker following gzrun's move
  // again after a peer was lost; a replacement of a rank), and in one step: a rank that dies
  // while it arrives either counted or did not. Whoever finds every rank in the list releases
  // them, a replacement of a rank that died before releasing too. Only a list with at least
  // world_size records can hold every rank: in a first meeting, only the last to arrive reads it.
  const int64_t bytes = store.append(kArrivals, arrival_record(w.rank));
  if (bytes >= static_cast<int64_t>(kArrivalBytes) * w.world_size) {
    const std::vector<bool> in = arrived_ranks(store.get(kArrivals, deadline), w.world_size);
    if (std::all_of(in.begin(), in.end(), [](bool b) { return b; })) store.set("rdzv/done", to_bytes("1"));
  }
  try {
    if (!leave) {
      store.wait({"rdzv/done"}, deadline);
      return true;
    }
    // In slices, asking between them whether to give up on this run (the job moved on).
    for (;;) {
      const Deadline slice = Deadline::after(std::min(deadline.remaining(), Duration(200)));
      try {
        store.wait({"rdzv/done"}, slice);
        return true;
      } catch (const TimeoutError&) {
        if (deadline.expired()) throw;
      }
      if (leave()) return false;
    }
  } catch (const TimeoutError&) {
    std::string arrived = "?", missing, note;
    try {
      const Bytes list =
          store.check({kArrivals}) ? store.get(kArrivals, Deadline::after(Duration(5000))) : Bytes{};
      const std::vector<bool> in = arrived_ranks(list, w.world_size);
      arrived = std::to_string(std::count(in.begin(), in.end(), true));
      int listed = 0;
      for (int r = 0; r < w.world_size && listed < 32; ++r)
        if (!in[static_cast<size_t>(r)]) missing += (listed++ ? ", " : "") + std::to_string(r);
      if (listed == 32) missing += ", ...";
    } catch (const Error& e) {
      missing.clear();
      note = " (could not ask the store who is missing: " + std::string(e.what()) + ")";
    }
    GZ_THROW(TimeoutError, "rendezvous timed out after ", format_duration(sw.elapsed()), " at rank ", w.rank,
             ": ", arrived, " of ", w.world_size, " ranks arrived",
             missing.empty() ? "" : " (missing ranks: " + missing + ")", "; store ", where, note);
  }
}

namespace {

/// The etcd store named by `endpoints` (GZ_STORE_ENDPOINTS or an etcd:// init method) and the
/// GZ_STORE_* variables; the rendezvous token is the etcd user's password. Throws what EtcdStore
/// throws, with the rendezvous context in front.
std::shared_ptr<Store> connect_etcd(const std::string& endpoints, const std::string& prefix, const Env& env,
                                    const std::string& token, bool insecure, Deadline deadline,
                                    std::string& where) {
  EtcdStoreOptions o;
  o.endpoints = parse_etcd_endpoints(endpoints);
  o.prefix = prefix;
  o.user = env.get("GZ_STORE_USER", "");
  if (!o.user.empty()) o.password = token;  // without a user the token has no use in etcd
  o.ca_file = env.get("GZ_STORE_CACERT", "");
  o.cert_file = env.get("GZ_STORE_CERT", "");
  o.key_file = env.get("GZ_STORE_KEY", "");
  o.allow_insecure = insecure;
  o.timeout = std::max(deadline.remaining(), Duration(1));
  where = "etcd " + endpoints + " under " + prefix;
  for (const auto& w : check_etcd_options(o)) GZ_LOG(warn, "rendezvous: ", w);
  try {
    return std::make_shared<EtcdStore>(o);
  } catch (const Error&) {
    rethrow_with("rendezvous (store " + where + "): ");
  }
}

/// "etcd://h1:2379,h2:2379/gz/job" -> endpoints and prefix ("/gz/default" when none is given).
void split_etcd_method(const std::string& method, std::string& endpoints, std::string& prefix) {
  const std::string rest = method.substr(7);
  const size_t slash = rest.find('/');
  endpoints = rest.substr(0, slash);
  prefix = slash == std::string::npos ? "/gz/default" : rest.substr(slash);
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  if (endpoints.empty()) GZ_THROW(InvalidArgument, "init_method '", method, "' names no etcd endpoint");
}

}  // namespace

namespace {

/// What a rendezvous needs to reach its store: the secret, and how long it may take.
struct StoreAccess {
  std::string token;
  bool insecure = false;
  Deadline deadline{Clock::time_point{}};
};

/// The TcpStore at host:port, hosting its server first when `host_it` (into out.server).
std::shared_ptr<Store> connect_tcp(Rendezvous& out, const StoreAccess& a, const std::string& host, int port,
                                   bool host_it, const std::string& port_name, std::string& where) {
  where = "tcp://" + host + ":" + std::to_string(port);
  const std::string ctx = "rendezvous (rank " + std::to_string(out.world.rank) + " of " +
                          std::to_string(out.world.world_size) + ", store " + where + "): ";
  require_token(host, port, a.token, a.insecure);
  if (host_it) out.server = host_server(host, port, a.token, a.insecure, port_name);
  if (port == 0) port = out.server->port();  // only possible for a one-rank world
  TcpStoreOptions co;
  co.token = a.token;
  co.timeout = std::max(a.deadline.remaining(), Duration(1));
  try {
    return std::make_shared<TcpStore>(host, port, co);
  } catch (const Error&) {
    rethrow_with(ctx);
  }
}

/// env:// with TCP: a one-rank world keeps its store in memory; otherwise the store gzrun hosts
/// (GZ_STORE_*), or one rank 0 hosts on MASTER_PORT (torchrun: MASTER_PORT+1, next to its own).
std::shared_ptr<Store> env_tcp_store(Rendezvous& out, const StoreAccess& a, const Env& env, bool hosted,
                                     std::string& where) {
  const WorldInfo& w = out.world;
  if (w.world_size == 1 && !hosted) {
    where = "in-memory";
    return std::make_shared<MemStore>();
  }
  if (w.num_nodes > 1 && !env.get("MASTER_ADDR"))
    GZ_THROW(InvalidArgument, "rendezvous env:// with ", w.num_nodes,
             " nodes needs MASTER_ADDR (the host of rank 0), e.g. mpirun -x MASTER_ADDR=...");
  int port = w.master_port ? w.master_port : kDefaultMasterPort;
  std::string port_name = "MASTER_PORT";
  std::string host = w.master_addr;
  if (hosted && env.get("GZ_STORE_PORT")) {
    // gzrun hosts our store next to (not on) the program's MASTER_PORT, which torch's own
    // TCPStore may bind.
    port = static_cast<int>(*int_var(env, "GZ_STORE_PORT", 1, 65535));
    port_name = "GZ_STORE_PORT";
    if (auto addr = env.get("GZ_STORE_ADDR"); addr && !addr->empty()) host = *addr;
  } else if (w.launcher == "torchrun") {
    // torchrun's own store holds MASTER_PORT; ours lives next door.
    if (port >= 65535) GZ_THROW(InvalidArgument, "MASTER_PORT=", port, " leaves no room for MASTER_PORT+1");
    ++port;
    port_name = "MASTER_PORT+1";
  }
  return connect_tcp(out, a, host, port, !hosted && w.rank == 0, port_name, where);
}

/// The store the init method names (out.world filled in on the way).
std::shared_ptr<Store> open_store(Rendezvous& out, const InitOptions& options, const Env& env,
                                  const StoreAccess& a, std::string& where) {
  const std::string& method = options.init_method;
  const bool hosted = env.get_bool("GZ_STORE_HOSTED", false);
  const bool etcd_env = env.get("GZ_STORE_BACKEND", "") == "etcd";
  if ((method.empty() || method == "env://") && etcd_env) {
    // The job's store is an etcd cluster (gzrun --rdzv-backend etcd, or set by hand): nobody hosts.
    out.world = detect_world(env);
    const std::string endpoints = env.get("GZ_STORE_ENDPOINTS", "");
    if (endpoints.empty())
      GZ_THROW(InvalidArgument, "GZ_STORE_BACKEND=etcd needs GZ_STORE_ENDPOINTS (host:2379,host:2379,...)");
    return connect_etcd(endpoints, env.get("GZ_STORE_PREFIX", "/gz/default"), env, a.token, a.insecure,
                        a.deadline, where);
  }
  if (method.rfind("etcd://", 0) == 0) {
    out.world = explicit_world(options, env, method);
    std::string endpoints, prefix;
    split_etcd_method(method, endpoints, prefix);
    return connect_etcd(endpoints, prefix, env, a.token, a.insecure, a.deadline, where);
  }
  if (method.empty() || method == "env://") {
    out.world = detect_world(env);
    return env_tcp_store(out, a, env, hosted, where);
  }
  if (method.rfind("tcp://", 0) == 0) {
    out.world = explicit_world(options, env, method);
    std::string host;
    int port = 0;
    split_host_port(method.substr(6), method, host, port);
    if (port == 0 && (out.world.world_size > 1 || hosted))
      GZ_THROW(InvalidArgument, "init_method '", method, "': port 0 only works for a one-rank world");
    out.world.master_addr = host;
    out.world.master_port = port;
    auto s = connect_tcp(out, a, host, port, !hosted && out.world.rank == 0, "the init_method port", where);
    if (out.server) out.world.master_port = out.server->port();
    return s;
  }
  if (method.rfind("file://", 0) == 0) {
    out.world = explicit_world(options, env, method);
    std::string path = method.substr(7);
    if (path.empty() || path[0] != '/')
      GZ_THROW(InvalidArgument, "init_method '", method, "' needs an absolute path (file:///dir/file)");
    where = method;
    return std::make_shared<FileStore>(path);
  }
  GZ_THROW(InvalidArgument, "unknown init_method '", method,
           "' (expected env://, tcp://host:port, etcd://host:port,.../prefix or file:///path)");
}

}  // namespace

Rendezvous rendezvous(const InitOptions& options, const Env& env) {
  StoreAccess a;
  a.deadline = Deadline::after(options.timeout);
  a.token = options.token.empty() ? env.get("GZ_RDZV_TOKEN", "") : options.token;
  a.insecure = options.insecure || env.get_bool("GZ_RDZV_INSECURE", false);
  check_rdzv_token(a.token, "rendezvous");
  std::string run_id = env.get("GZ_RUN_ID", "0");
  if (run_id.empty()) run_id = "0";

  Rendezvous out;
  std::string where;
  std::shared_ptr<Store> base = open_store(out, options, env, a, where);
  base->set_timeout(options.timeout);
  auto store = std::make_shared<PrefixStore>(run_prefix(run_id), base);
  store->set_timeout(options.timeout);
  try {
    meet(*store, out.world, a.deadline, where);
  } catch (const TimeoutError&) {
    // Let the other ranks' diagnostics (who is missing) reach our server before it goes away.
    if (out.server) std::this_thread::sleep_for(Duration(300));
    throw;
  }
  out.store = store;
  out.base = base;
  GZ_LOG(info, "rendezvous: rank ", out.world.rank, " of ", out.world.world_size, " via ", where,
         " (launcher ", out.world.launcher, ")");
  return out;
}

}  // namespace gz
