// create_communicator: the only place that knows every backend and how to choose between them.
#include "gz/comm/factory.h"

#include <unistd.h>

#include <algorithm>
#include <climits>

#include "gz/comm/hierarchical.h"
#include "gz/comm/shm.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"
#ifdef GZ_HAVE_GLOO
#include "gz/comm/net_address.h"
#include "gz/comm/gloo.h"
#endif
#ifdef GZ_HAVE_MPI
#include "gz/comm/mpi.h"
#endif
#ifdef GZ_HAVE_NCCL
#include "gz/comm/nccl.h"
#endif

namespace gz::comm {
namespace {

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool under_mpirun(const Env& env) { return env.has("OMPI_COMM_WORLD_SIZE") || env.has("PMI_SIZE"); }

// Every rank publishes its node id; returns all of them in rank order.
std::vector<std::string> exchange_node_ids(Store& store, int rank, int size, const std::string& mine,
                                           Duration timeout) {
  // One gather (a constant number of store round trips per rank, whatever the world size).
  std::vector<std::string> ids(size);
  try {
    auto all = store_allgather(store, "node_id", rank, size, to_bytes(mine), Deadline::after(timeout));
    for (int r = 0; r < size; ++r) ids[r] = to_string(all[r]);
  } catch (const TimeoutError& e) {
    GZ_THROW(TimeoutError, "create_communicator: rank ", rank, "/", size, " did not hear from every rank within ",
             format_duration(timeout), " (is every rank started with the same world size?): ", e.what());
  }
  return ids;
}

[[noreturn]] void no_backend(const std::string& name) {
  if (name == "nccl")
    GZ_THROW(InvalidArgument, "NCCL backend not built (configure with -DGZ_WITH_NCCL=ON on a CUDA machine)");
  GZ_THROW(InvalidArgument, "backend '", name, "' is not available in this build (available: auto, hier, ",
           joined(available_backends()), ")");
}

#ifdef GZ_HAVE_GLOO
// The address peers on other nodes can reach: the interface given, else the local address on
// the route to the master (MASTER_ADDR), else the one on the route to our own hostname.
// `hosts_differ`: node ids are host names, so ranks on different nodes are on different machines
// (with explicit node ids, "nodes" may be simulated on one machine, where loopback is right).
GlooOptions gloo_options(const CommOptions& o, const Env& env, bool multi_node, bool hosts_differ) {
  GlooOptions g;
  g.timeout = o.timeout;
  // GZ_SOCKET_IFNAME as GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME; GZ_IFACE is the older name.
  g.iface = o.iface.empty() ? env.get("GZ_SOCKET_IFNAME", env.get("GZ_IFACE", "")) : o.iface;
  if (!g.iface.empty()) {
    const std::string what = o.iface.empty() ? "GZ_SOCKET_IFNAME" : "CommOptions::iface";
    g.hostname = listen_address_for(g.iface, what);
    // Other nodes would connect to their own loopback: refuse now, not as a connect timeout.
    if (multi_node && hosts_differ && is_loopback_address(g.hostname))
      GZ_THROW(InvalidArgument, what, "=", g.iface, " gives ", g.hostname,
               ", a loopback address that the other nodes of this job cannot reach; name the interface or "
               "address of the network between the nodes");
    return g;
  }
  if (!multi_node) {
    g.hostname = "127.0.0.1";
    return g;
  }
  std::string target = env.get("MASTER_ADDR", "");
  if (target.empty()) target = host_name();
  try {
    g.hostname = local_address_towards(target);
  } catch (const Error& e) {
    GZ_THROW(InvalidArgument, "gloo: cannot pick the address other nodes reach this rank on (", e.what(),
             "); set GZ_SOCKET_IFNAME to an interface name or address");
  }
  return g;
}
#endif

CommPtr make_shm(int rank, int size, std::shared_ptr<Store> store, Duration timeout) {
  ShmOptions s;
  s.timeout = timeout;
  return create_shm_communicator(rank, size, std::move(store), s);
}

InterMaker inter_maker(const CommOptions& o, const Env& env, bool hosts_differ) {
#ifdef GZ_HAVE_MPI
  if (under_mpirun(env) && env.get("GZ_INTER_BACKEND", "") != "gloo") {
    Duration t = o.timeout;
    // MPI sub-groups are split from MPI_COMM_WORLD, so the hierarchical backend keeps a flat one.
    InterMaker m;
    m.make = [t](int rank, int size, std::shared_ptr<Store>) {
      MpiOptions mo;
      mo.timeout = t;
      return create_mpi_communicator(rank, size, mo);
    };
    m.backend = "mpi";
    return m;
  }
#endif
#ifdef GZ_HAVE_GLOO
  GlooOptions g = gloo_options(o, env, true, hosts_differ);
  InterMaker m;
  m.make = [g](int rank, int size, std::shared_ptr<Store> store) {
    return create_gloo_communicator(rank, size, std::move(store), g);
  };
  g.p2p_only = true;  // the flat one: point-to-point and new_group only (groups get their own)
  m.make_flat = [g](int rank, int size, std::shared_ptr<Store> store) {
    return create_gloo_communicator(rank, size, std::move(store), g);
  };
  m.backend = "gloo";
  m.any_group = true;  // rails and groups connect their members only
  // GZ_HIER_FLAT=0: no mesh over every rank (collectives only; cross-node send/recv refused).
  m.flat = env.get("GZ_HIER_FLAT", "1") != "0";
  return m;
#else
  (void)o;
  (void)env;
  (void)hosts_differ;
  GZ_THROW(InvalidArgument, "ranks span several nodes but no inter-node backend (gloo or mpi) is built");
#endif
}

// The flight recorder's name of a communicator the factory built (the same on every rank: each
// rank counts its own calls on the same store).
CommPtr named(CommPtr comm, const std::string& name) {
  comm->set_flight_identity(name);
  return comm;
}

}  // namespace

std::vector<std::string> available_backends() {
  // Built up from empty: GCC 14 warns falsely (-Warray-bounds) on push_back after a braced init.
  std::vector<std::string> b;
  b.reserve(4);
  b.emplace_back("shm");
#ifdef GZ_HAVE_GLOO
  b.push_back("gloo");
#endif
#ifdef GZ_HAVE_MPI
  b.push_back("mpi");
#endif
#ifdef GZ_HAVE_NCCL
  b.push_back("nccl");
#endif
  return b;
}

CommPtr create_communicator(const CommOptions& options) {
  GZ_CHECK_ARG(options.size >= 1, "create_communicator: size ", options.size);
  GZ_CHECK_ARG(options.rank >= 0 && options.rank < options.size, "create_communicator: rank ", options.rank,
               " of ", options.size);
  GZ_CHECK_ARG(options.store != nullptr, "create_communicator: a rendezvous store is required");
  GZ_CHECK_ARG(options.timeout.count() > 0, "create_communicator: timeout must be positive");
  const Env env = Env::from_process();
  std::string backend = options.backend.empty() ? "auto" : options.backend;
  if (backend == "auto") backend = env.get("GZ_BACKEND", "auto");
  if (backend.empty()) backend = "auto";
  const auto avail = available_backends();
  const bool known = backend == "auto" || backend == "hier" ||
                     std::find(avail.begin(), avail.end(), backend) != avail.end();
  if (!known) no_backend(backend);  // before touching the store: nothing to undo

  const int rank = options.rank, size = options.size;
  // A fresh namespace per call (each rank counts its own calls), so a second communicator on the
  // same store never reads the first one's rendezvous keys.
  const int64_t gen = options.store->add("factory/calls/" + std::to_string(rank), 1);
  auto store = std::make_shared<PrefixStore>("comm" + std::to_string(gen), options.store);
  auto sub = [&](const std::string& p) { return std::make_shared<PrefixStore>(p, store); };
  const std::string name = options.name.empty() ? "comm" + std::to_string(gen) : options.name;

  std::string node_id = options.node_id;
  if (node_id.empty()) node_id = env.get("GZ_NODE_ID", "");
  const bool hosts_differ = node_id.empty();
  if (node_id.empty()) node_id = host_name();
  auto ids = exchange_node_ids(*store, rank, size, node_id, options.timeout);
  NodeLayout layout = NodeLayout::from_labels(ids);
  const bool multi_node = layout.num_nodes() > 1;
  GZ_LOG(debug, "create_communicator: rank ", rank, "/", size, " backend ", backend, ", ", layout.num_nodes(),
         " node(s)");

  if (backend == "shm") {
    if (multi_node)
      GZ_THROW(InvalidArgument, "backend 'shm' needs every rank on one node, but the ranks report ",
               layout.num_nodes(), " node ids (", joined([&] {
                 std::vector<std::string> u;
                 for (const auto& n : layout.ranks_of_node) u.push_back(ids[n.front()]);
                 return u;
               }()), "); use 'auto' or 'gloo'");
    return named(make_shm(rank, size, sub("shm"), options.timeout), name);
  }
  if (backend == "gloo") {
#ifdef GZ_HAVE_GLOO
    return named(create_gloo_communicator(rank, size, sub("gloo"),
                                          gloo_options(options, env, multi_node, hosts_differ)),
                 name);
#endif
  }
  if (backend == "mpi") {
#ifdef GZ_HAVE_MPI
    MpiOptions m;
    m.timeout = options.timeout;
    return named(create_mpi_communicator(rank, size, m), name);
#endif
  }
  if (backend == "nccl") {
#ifdef GZ_HAVE_NCCL
    return named(create_nccl_communicator(rank, size, sub("nccl"), options.timeout), name);
#endif
  }
  if (backend == "auto" && !multi_node) return named(make_shm(rank, size, sub("shm"), options.timeout), name);
  if (backend == "auto" || backend == "hier") {
    Duration t = options.timeout;
    CommMaker local = [t](int r, int s, std::shared_ptr<Store> st) { return make_shm(r, s, std::move(st), t); };
    return named(create_hierarchical_communicator(rank, layout, sub("hier"), local,
                                                  inter_maker(options, env, hosts_differ), t),
                 name);
  }
  no_backend(backend);
}

}  // namespace gz::comm
