// The pre-flight check across the job's nodes: local facts, compute in turns or at once, the link
// probe over Gloo, everything exchanged through gzrun's store; every node judges the same records
// and so reaches the same verdict (see preflight.h).
#include "preflight.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <thread>

#include "gz/core/deadline.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/store/prefix_store.h"
#include "gz/store/store.h"
#include "output_relay.h"  // say(), write_all()
#include "store_host.h"
#ifdef GZ_HAVE_GLOO
#include "gz/comm/gloo.h"
#include "gz/comm/net_address.h"
#endif

namespace gz::launcher {
namespace {

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

double mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

double shm_free() {
  struct statvfs s {};
  if (statvfs("/dev/shm", &s) != 0) return 0;
  return static_cast<double>(s.f_bavail) * static_cast<double>(s.f_frsize);
}

bool is_loopback(const std::string& a) { return a == "localhost" || a.rfind("127.", 0) == 0 || a == "::1"; }

// The address the other nodes reach this one on, as the workers' Gloo would pick it.
std::string node_address(const LaunchOptions& o, const Env& env) {
#ifdef GZ_HAVE_GLOO
  const std::string iface = env.get("GZ_SOCKET_IFNAME", env.get("GZ_IFACE", ""));
  if (!iface.empty()) return comm::listen_address_for(iface);
  if (is_loopback(o.master_addr)) return "127.0.0.1";
  return comm::local_address_towards(o.master_addr);
#else
  (void)env;
  return is_loopback(o.master_addr) ? "127.0.0.1" : o.master_addr;
#endif
}

NodeFacts local_facts(const LaunchOptions& o, const Env& env) {
  NodeFacts f;
  f.node = o.node_rank;
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) f.host = host;
  f.addr = node_address(o, env);
  f.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  f.shm_free = shm_free();
  f.mem_avail = mem_available();
  return f;
}

std::string how_text(const PreflightOptions& p, size_t pairs, bool in_turns, int nproc) {
  return detail::concat("links: ", pairs, " pair(s), 2 x ", p.link_bytes >> 10, " KiB each way + ", p.pings,
                        " pings; compute: ", nproc, " thread(s) x ", p.compute_s, " s per node",
                        in_turns ? ", in turns (the nodes share one machine)" : "");
}

void print(const std::string& text) {
  const std::string t = text + "\n";
  write_all(1, t.data(), t.size());
}

// Probe this node's pairs over a point-to-point Gloo communicator among the nodes' gzruns.
// `keep` holds the communicator until every node is done: closing it earlier would break the
// connections of peers still probing others.
std::vector<comm::LinkMeasure> probe(const LaunchOptions& o, const std::shared_ptr<Store>& store,
                                     const std::string& addr, const std::vector<std::pair<int, int>>& pairs,
                                     const PreflightOptions& p, std::shared_ptr<void>& keep) {
#ifdef GZ_HAVE_GLOO
  comm::GlooOptions g;
  g.timeout = std::chrono::milliseconds(static_cast<long long>(p.timeout_s * 1000));
  g.hostname = addr;
  g.p2p_only = true;  // connect only the probed pairs
  auto c =
      comm::create_gloo_communicator(o.node_rank, o.nnodes, std::make_shared<PrefixStore>("gloo/", store), g);
  comm::LinkProbeOptions lp;
  lp.bytes = p.link_bytes;
  lp.pings = p.pings;
  lp.timeout = g.timeout;
  keep = c;
  return comm::probe_links(*c, pairs, lp);
#else
  (void)o, (void)store, (void)addr, (void)pairs, (void)p, (void)keep;
  return {};
#endif
}

}  // namespace

int run_preflight(const LaunchOptions& o, StoreHost& host, const PreflightOptions& p) {
  const Env env = Env::from_process();
  const Deadline deadline =
      Deadline::after(std::chrono::milliseconds(static_cast<long long>(p.timeout_s * 1000)));
  Stopwatch clock;
  NodeFacts mine = local_facts(o, env);
  std::vector<NodeFacts> nodes;
  std::vector<comm::LinkMeasure> links;
  bool in_turns = false;
  size_t pair_count = 0;
  if (o.nnodes == 1) {
    mine.gflops = measure_compute(o.nproc_per_node, p.compute_s);
    nodes.push_back(mine);
  } else {
    std::shared_ptr<Store> client = host.monitor_client();
    auto s = std::make_shared<PrefixStore>("gzrun/preflight/", client);
    // 1. Who is where; simulated hosts of one machine share its boot id and its cores.
    auto facts = store_allgather(*s, "facts", o.node_rank, o.nnodes, to_bytes(encode_facts(mine)), deadline);
    in_turns = true;
    for (const auto& b : facts) in_turns = in_turns && decode_facts(to_string(b)).boot_id == mine.boot_id;
    // 2. Compute: in turns on one machine (else every node would measure a share of the same
    // cores), at once on a real cluster. Links are probed only once every node is done.
    if (in_turns && o.node_rank > 0) s->get("compute/" + std::to_string(o.node_rank - 1), deadline);
    mine.gflops = measure_compute(o.nproc_per_node, p.compute_s);
    s->set("compute/" + std::to_string(o.node_rank), to_bytes("1"));
    std::vector<std::string> done;
    for (int i = 0; i < o.nnodes; ++i) done.push_back("compute/" + std::to_string(i));
    s->wait(done, deadline);
    // 3. Links, 4. everyone's results to everyone: each node judges the same records.
    const auto pairs =
        preflight_pairs(o.nnodes, std::hash<std::string>{}(facts.empty() ? "" : to_string(facts[0])));
    pair_count = pairs.size();
    std::shared_ptr<void> probe_comm;
    const auto measured = probe(o, s, mine.addr, pairs, p, probe_comm);
    const std::string record = encode_facts(mine) + "#" + encode_links(measured);
    for (const auto& b : store_allgather(*s, "results", o.node_rank, o.nnodes, to_bytes(record), deadline)) {
      const std::string r = to_string(b);
      const auto hash = r.find('#');
      if (hash == std::string::npos) GZ_THROW(Error, "preflight: malformed result record '", r, "'");
      nodes.push_back(decode_facts(r.substr(0, hash)));
      for (const auto& m : decode_links(r.substr(hash + 1))) links.push_back(m);
    }
    // The store host stays until every node has read the results (the check alone ends here).
    s->add("collected", 1);
    while (host.hosts_store() && s->add("collected", 0) < o.nnodes && !deadline.expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const PreflightResult r =
      judge_preflight(nodes, links, p, how_text(p, pair_count, in_turns, o.nproc_per_node));
  if (o.node_rank == 0)
    print(r.table + " (" + format_duration(clock.elapsed()) + ")");
  else
    print(r.verdict);
  if (r.flagged == 0) return 0;
  if (o.program.empty()) return 4;  // the check alone: its exit status says whether a node is flagged
  if (p.strict) {
    say("--preflight=strict: not starting the job: " + r.verdict.substr(r.verdict.find(':') + 2));
    return 4;
  }
  say("warning: starting the job anyway (--preflight=strict would refuse)");
  return 0;
}

}  // namespace gz::launcher
