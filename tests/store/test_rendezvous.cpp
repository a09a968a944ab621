// detect_world over every launcher family, SLURM hostlists, and rendezvous over every init
// method with real ranks as threads (each thread gets its own gz::Env).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "gz/core/error.h"
#include "gz/store/file_store.h"
#include "gz/store/mem_store.h"
#include "gz/store/rendezvous.h"
#include "gz/store/tcp_store.h"
#include "store/store_fixtures.h"

namespace gz {
namespace {

using namespace std::chrono_literals;
using Vars = std::map<std::string, std::string>;

void expect_invalid(const Vars& vars, const std::string& needle) {
  try {
    detect_world(Env(vars));
    FAIL() << "accepted; expected an error naming " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- detect_world --------------------------------------------------------------------------

TEST(DetectWorld, NoVariablesIsASingleProcess) {
  WorldInfo w = detect_world(Env());
  EXPECT_EQ(w.launcher, "single");
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.num_nodes, 1);
}

// Every rank of a nodes x per_node layout, described by `vars_for(rank, node, local)`.
void check_layout(int nodes, int per_node, const std::string& launcher,
                  const std::function<Vars(int, int, int)>& vars_for) {
  for (int r = 0; r < nodes * per_node; ++r) {
    int node = r / per_node, local = r % per_node;
    WorldInfo w = detect_world(Env(vars_for(r, node, local)));
    EXPECT_EQ(w.rank, r);
    EXPECT_EQ(w.world_size, nodes * per_node);
    EXPECT_EQ(w.local_rank, local) << "rank " << r;
    EXPECT_EQ(w.local_world_size, per_node);
    EXPECT_EQ(w.node_rank, node) << "rank " << r;
    EXPECT_EQ(w.num_nodes, nodes);
    EXPECT_EQ(w.launcher, launcher);
  }
}

TEST(DetectWorld, Torchrun) {
  check_layout(2, 4, "torchrun", [](int r, int node, int local) {
    return Vars{{"RANK", std::to_string(r)},         {"WORLD_SIZE", "8"},
                {"LOCAL_RANK", std::to_string(local)}, {"LOCAL_WORLD_SIZE", "4"},
                {"GROUP_RANK", std::to_string(node)}, {"TORCHELASTIC_RUN_ID", "job7"},
                {"MASTER_ADDR", "10.1.2.3"},          {"MASTER_PORT", "29400"}};
  });
  WorldInfo w = detect_world(Env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.1.2.3"},
                                  {"MASTER_PORT", "29400"}, {"TORCHELASTIC_RUN_ID", "x"}}));
  EXPECT_EQ(w.master_addr, "10.1.2.3");
  EXPECT_EQ(w.master_port, 29400);
}

TEST(DetectWorld, GzrunWithNodeRankAndNnodes) {
  check_layout(3, 2, "gzrun", [](int r, int node, int local) {
    return Vars{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "6"},         {"LOCAL_RANK", std::to_string(local)},
                {"NODE_RANK", std::to_string(node)}, {"GZ_NNODES", "3"}, {"GZ_LAUNCHER", "gzrun"}};
  });
}

TEST(DetectWorld, PlainEnvMeansOneNode) {
  check_layout(1, 5, "env", [](int r, int, int) { return Vars{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "5"}}; });
}

TEST(DetectWorld, OpenMpiDerivesTheNodeIndex) {
  // OMPI_COMM_WORLD_NODE_RANK is the rank within the node: it must not be taken as the node index.
  check_layout(3, 2, "openmpi", [](int r, int, int local) {
    return Vars{{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                {"OMPI_COMM_WORLD_SIZE", "6"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local)},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                {"OMPI_COMM_WORLD_NODE_RANK", std::to_string(local)}};
  });
}

TEST(DetectWorld, MpichPmi) {
  check_layout(2, 3, "pmi", [](int r, int, int local) {
    return Vars{{"PMI_RANK", std::to_string(r)},
                {"PMI_SIZE", "6"},
                {"MPI_LOCALRANKID", std::to_string(local)},
                {"MPI_LOCALNRANKS", "3"}};
  });
}

TEST(DetectWorld, Slurm) {
  check_layout(4, 2, "slurm", [](int r, int node, int local) {
    return Vars{{"SLURM_PROCID", std::to_string(r)},  {"SLURM_NTASKS", "8"},
                {"SLURM_LOCALID", std::to_string(local)}, {"SLURM_NODEID", std::to_string(node)},
                {"SLURM_NNODES", "4"},                  {"SLURM_NTASKS_PER_NODE", "2"},
                {"SLURM_JOB_NODELIST", "node[01-04,07],gpu5"}};
  });
  Vars v{{"SLURM_PROCID", "3"},  {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
         {"SLURM_NODEID", "1"},  {"SLURM_NNODES", "2"}, {"SLURM_JOB_NODELIST", "gpu[7-8]"}};
  WorldInfo w = detect_world(Env(v));
  EXPECT_EQ(w.master_addr, "gpu7");
  EXPECT_EQ(w.local_world_size, 2);  // SLURM_NTASKS / SLURM_NNODES
  v["MASTER_ADDR"] = "10.0.0.9";  // an explicit master wins
  EXPECT_EQ(detect_world(Env(v)).master_addr, "10.0.0.9");
}

TEST(DetectWorld, SlurmUnevenTasksPerNode) {
  // SLURM_TASKS_PER_NODE "2(x2),1": nodes 0 and 1 run two tasks, node 2 runs one.
  Vars v{{"SLURM_PROCID", "4"},  {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"},
         {"SLURM_NODEID", "2"},  {"SLURM_NNODES", "3"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}};
  WorldInfo w = detect_world(Env(v));
  EXPECT_EQ(w.local_world_size, 1);
  EXPECT_EQ(w.node_rank, 2);
  EXPECT_EQ(w.num_nodes, 3);
  v["SLURM_NODEID"] = "0";
  v["SLURM_PROCID"] = "1";
  v["SLURM_LOCALID"] = "1";
  EXPECT_EQ(detect_world(Env(v)).local_world_size, 2);
}

TEST(DetectWorld, InconsistentValuesNameTheVariable) {
  expect_invalid({{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK=4");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE");
  expect_invalid({{"RANK", "1"}}, "WORLD_SIZE");
  expect_invalid({{"WORLD_SIZE", "2"}}, "RANK");
  expect_invalid({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
                 "LOCAL_RANK=2");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}}, "LOCAL_WORLD_SIZE=8");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "2"}},
                 "GROUP_RANK=2");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT");
  expect_invalid({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                 "OMPI_COMM_WORLD_LOCAL_RANK=3");
  expect_invalid({{"PMI_RANK", "5"}, {"PMI_SIZE", "5"}}, "PMI_RANK=5");
  expect_invalid({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "2"}, {"SLURM_NNODES", "2"},
                  {"SLURM_LOCALID", "0"}},
                 "SLURM_NODEID=2");
  expect_invalid({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NTASKS_PER_NODE", "1"},
                  {"SLURM_LOCALID", "1"}},
                 "SLURM_LOCALID=1");
}

// ---- SLURM hostlists -----------------------------------------------------------------------

TEST(SlurmNodelist, ExpandsCompressedSyntax) {
  EXPECT_EQ(expand_slurm_nodelist("node[01-04,07],gpu5"),
            (std::vector<std::string>{"node01", "node02", "node03", "node04", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]-n[8-9]"), (std::vector<std::string>{"r1-n8", "r1-n9", "r2-n8", "r2-n9"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (std::vector<std::string>{"single"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"), (std::vector<std::string>{"n098", "n099", "n100", "n101"}));
}

TEST(SlurmNodelist, FirstHostAgreesWithExpansion) {
  for (std::string list : {"node[01-04,07],gpu5", "gpu5,node[01-04]", "r[3-4]-n[08-09]", "a", "x[7]", "h-[000-3]"})
    EXPECT_EQ(slurm_first_host(list), expand_slurm_nodelist(list).front()) << list;
  // Huge ranges: the first host needs no expansion.
  EXPECT_EQ(slurm_first_host("big[0001-99999999]"), "big0001");
  EXPECT_THROW(expand_slurm_nodelist("big[0001-99999999]"), InvalidArgument);
}

TEST(SlurmNodelist, BadSyntaxIsInvalidArgument) {
  for (std::string bad : {"node[01-", "node01]", "n[3-1]", "n[a-b]", "n[]", "", "n[[1]]"}) {
    EXPECT_THROW(expand_slurm_nodelist(bad), InvalidArgument) << bad;
    EXPECT_THROW(slurm_first_host(bad), InvalidArgument) << bad;
  }
}

// ---- rendezvous ----------------------------------------------------------------------------

int free_port() {
  TcpStoreServerOptions o;
  o.bind_addr = "127.0.0.1";
  TcpStoreServer s(o);
  return s.port();
}

/// Run rendezvous on `world` threads (vars_for(rank) gives each its environment); then every
/// rank publishes its rank and reads everyone else's through the returned store.
std::vector<Rendezvous> run_world(int world, const std::function<Vars(int)>& vars_for,
                                  const std::function<InitOptions(int)>& opts_for) {
  std::vector<Rendezvous> out(static_cast<size_t>(world));
  std::vector<std::exception_ptr> errs(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        Rendezvous rv = rendezvous(opts_for(r), Env(vars_for(r)));
        rv.store->set("hello/" + std::to_string(rv.world.rank), to_bytes(std::to_string(r)));
        for (int p = 0; p < world; ++p)
          if (to_string(rv.store->get("hello/" + std::to_string(p), Deadline::after(5s))) != std::to_string(p))
            throw Error("wrong value from rank " + std::to_string(p));
        store_barrier(*rv.store, "done", world, Deadline::after(5s));  // keep rank 0's server up
        out[static_cast<size_t>(r)] = std::move(rv);
      } catch (...) {
        errs[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  return out;
}

InitOptions opts(const std::string& method = "", int rank = -1, int world = -1, Duration timeout = 10s) {
  InitOptions o;
  o.init_method = method;
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

TEST(Rendezvous, SingleProcessUsesAnInMemoryStore) {
  Rendezvous rv = rendezvous(opts(), Env());
  EXPECT_EQ(rv.world.world_size, 1);
  EXPECT_EQ(rv.server, nullptr);
  rv.store->set("k", to_bytes("v"));
  EXPECT_EQ(to_string(rv.store->get("k", Deadline::after(1s))), "v");
}

TEST(Rendezvous, EnvRank0HostsTheStore) {
  for (int world : {2, 3, 4, 7}) {
    int port = free_port();
    auto rvs = run_world(
        world,
        [&](int r) {
          return Vars{{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)},
                      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
        },
        [](int) { return opts("env://"); });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(rvs[r].world.rank, r);
      EXPECT_EQ(rvs[r].server != nullptr, r == 0);
    }
    EXPECT_EQ(rvs[0].server->port(), port);
  }
}

TEST(Rendezvous, TorchrunHostsNextToTorchrunsPort) {
  // Something (torchrun's own store) already holds MASTER_PORT.
  std::unique_ptr<TcpStoreServer> torchrun_store;
  int port = 0;
  for (int attempt = 0; attempt < 20 && !torchrun_store; ++attempt) {
    TcpStoreServerOptions o;
    o.bind_addr = "127.0.0.1";
    auto s = std::make_unique<TcpStoreServer>(o);
    TcpStoreServerOptions next = o;
    next.port = s->port() + 1;
    try {
      TcpStoreServer probe(next);  // is MASTER_PORT+1 free?
    } catch (const SystemError&) {
      continue;
    }
    port = s->port();
    torchrun_store = std::move(s);
  }
  ASSERT_TRUE(torchrun_store);
  auto rvs = run_world(
      3,
      [&](int r) {
        return Vars{{"RANK", std::to_string(r)},      {"WORLD_SIZE", "3"},
                    {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "3"},
                    {"MASTER_ADDR", "127.0.0.1"},     {"MASTER_PORT", std::to_string(port)},
                    {"TORCHELASTIC_RUN_ID", "abc"}};
      },
      [](int) { return opts(); });
  EXPECT_EQ(rvs[0].world.launcher, "torchrun");
  ASSERT_NE(rvs[0].server, nullptr);
  EXPECT_EQ(rvs[0].server->port(), port + 1);
}

TEST(Rendezvous, LauncherHostedStoreAndRunIdPrefix) {
  TcpStoreServerOptions so;
  so.bind_addr = "127.0.0.1";
  so.token = "tok";
  TcpStoreServer launcher_store(so);
  auto vars = [&](int r) {
    return Vars{{"RANK", std::to_string(r)},   {"WORLD_SIZE", "3"},  {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(launcher_store.port())}, {"GZ_STORE_HOSTED", "1"},
                {"GZ_LAUNCHER", "gzrun"},      {"GZ_RUN_ID", "attempt2"}, {"GZ_RDZV_TOKEN", "tok"}};
  };
  auto rvs = run_world(3, vars, [](int) { return opts(); });
  for (auto& rv : rvs) EXPECT_EQ(rv.server, nullptr);
  EXPECT_EQ(rvs[1].world.launcher, "gzrun");
  // Keys live under run/<GZ_RUN_ID>/ in the launcher's store.
  TcpStoreOptions co;
  co.token = "tok";
  co.timeout = 2s;
  TcpStore direct("127.0.0.1", launcher_store.port(), co);
  EXPECT_EQ(to_string(direct.get("run/attempt2/hello/2", Deadline::after(1s))), "2");
}

TEST(Rendezvous, GzrunStorePortIsNotMasterPort) {
  // gzrun leaves MASTER_PORT to the program (torch's TCPStore) and names its store in GZ_STORE_*.
  TcpStoreServerOptions so;
  so.bind_addr = "127.0.0.1";
  TcpStoreServer launcher_store(so);
  auto vars = [&](int r) {
    return Vars{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", "1"},  // nothing of ours listens there
                {"GZ_STORE_HOSTED", "1"}, {"GZ_STORE_ADDR", "127.0.0.1"},
                {"GZ_STORE_PORT", std::to_string(launcher_store.port())}, {"GZ_LAUNCHER", "gzrun"},
                {"GZ_RUN_ID", "a0"}};
  };
  auto rvs = run_world(2, vars, [](int) { return opts(); });
  for (auto& rv : rvs) EXPECT_EQ(rv.server, nullptr);
  EXPECT_EQ(rvs[0].world.master_port, 1);  // the program's port is still reported as given
}

TEST(Rendezvous, OpenMpiEnvironment) {
  int port = free_port();
  auto rvs = run_world(
      4,
      [&](int r) {
        return Vars{{"OMPI_COMM_WORLD_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                    {"MASTER_PORT", std::to_string(port)}};
      },
      [](int) { return opts(); });
  EXPECT_EQ(rvs[3].world.launcher, "openmpi");
  EXPECT_EQ(rvs[3].world.local_rank, 3);
}

TEST(Rendezvous, TcpInitMethod) {
  for (int world : {1, 2, 5}) {
    int port = free_port();
    std::string method = "tcp://127.0.0.1:" + std::to_string(port);
    auto rvs = run_world(world, [](int) { return Vars{}; }, [&](int r) { return opts(method, r, world); });
    EXPECT_NE(rvs[0].server, nullptr);
    EXPECT_EQ(rvs[world - 1].world.world_size, world);
    // Nothing says which ranks share a node: none are assumed to.
    EXPECT_EQ(rvs[world - 1].world.local_world_size, 1);
    EXPECT_EQ(rvs[world - 1].world.node_rank, world - 1);
  }
}

TEST(Rendezvous, FileInitMethodAndRunIsolation) {
  test::TempDir dir;
  std::string method = "file://" + dir.file("rdzv");
  auto vars = [](const std::string& run) { return [run](int) { return Vars{{"GZ_RUN_ID", run}}; }; };
  run_world(4, vars("1"), [&](int r) { return opts(method, r, 4); });
  // A second run on the same file does not see the first run's barrier: a missing rank still
  // blocks it.
  try {
    rendezvous(opts(method, 0, 2, 300ms), Env(Vars{{"GZ_RUN_ID", "2"}}));
    FAIL() << "stale keys from run 1 satisfied run 2's barrier";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, MissingRankTimesOutSayingWhoIsMissing) {
  int port = free_port();
  std::string method = "tcp://127.0.0.1:" + std::to_string(port);
  std::vector<std::string> msgs(2);
  std::vector<std::thread> ts;
  Stopwatch sw;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        rendezvous(opts(method, r, 3, 500ms), Env());
      } catch (const TimeoutError& e) {
        msgs[r] = e.what();
      } catch (const std::exception& e) {
        msgs[r] = std::string("wrong error type: ") + e.what();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_LT(sw.elapsed().count(), 3000);
  for (auto& m : msgs) {
    EXPECT_NE(m.find("2 of 3 ranks arrived"), std::string::npos) << m;
    EXPECT_NE(m.find("missing ranks: 2"), std::string::npos) << m;
  }
}

// A store through which a process "dies" after `alive` requests: the later ones throw.
class DyingStore : public Store {
 public:
  DyingStore(std::shared_ptr<Store> base, int alive) : base_(std::move(base)), alive_(alive) {}
  void set(const std::string& k, const Bytes& v) override { live()->set(k, v); }
  Bytes get(const std::string& k, Deadline d) override { return live()->get(k, d); }
  int64_t add(const std::string& k, int64_t d) override { return live()->add(k, d); }
  Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
    return live()->compare_set(k, e, d);
  }
  int64_t append(const std::string& k, const Bytes& v) override { return live()->append(k, v); }
  void wait(const std::vector<std::string>& ks, Deadline d) override { live()->wait(ks, d); }
  bool check(const std::vector<std::string>& ks) override { return live()->check(ks); }
  bool delete_key(const std::string& k) override { return live()->delete_key(k); }
  int64_t num_keys() override { return live()->num_keys(); }

 private:
  Store* live() {
    if (alive_-- <= 0) GZ_THROW(PeerError, "this process died");
    return base_.get();
  }
  std::shared_ptr<Store> base_;
  int alive_;
};

// Rank 1 dies while it arrives (after one or two of its store requests; rank 0 waits already)
// and a replacement of it arrives: the two must meet. Mutation check: counting a rank with two
// adds (a per-rank add, then the arrival count), as before, loses the dead rank's arrival or its
// release: the replacement's per-rank add says "counted already" and both time out.
TEST(Rendezvous, AReplacementOfARankThatDiedArrivingCompletesTheMeeting) {
  for (int alive : {1, 2}) {
    auto store = std::make_shared<MemStore>();
    WorldInfo w0, w1;
    w0.world_size = w1.world_size = 2;
    w1.rank = 1;
    std::string error;
    std::thread first([&] {
      try {
        meet(*store, w0, Deadline::after(3s), "test");
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    std::this_thread::sleep_for(50ms);
    DyingStore dying(store, alive);
    EXPECT_THROW(meet(dying, w1, Deadline::after(3s), "test"), PeerError);
    EXPECT_NO_THROW(meet(*store, w1, Deadline::after(3s), "test")) << "after " << alive << " request(s)";
    first.join();
    EXPECT_EQ(error, "") << "after " << alive << " request(s)";
  }
}

TEST(Rendezvous, AbsentRank0IsATimeoutNamingTheStore) {
  int port = free_port();
  std::string method = "tcp://127.0.0.1:" + std::to_string(port);
  Stopwatch sw;
  try {
    rendezvous(opts(method, 1, 2, 300ms), Env());
    FAIL() << "rendezvous without rank 0 returned";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(port)), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 of 2"), std::string::npos) << m;
  }
  EXPECT_LT(sw.elapsed().count(), 2000);
}

TEST(Rendezvous, WrongTokenIsRefused) {
  int port = free_port();
  std::string method = "tcp://127.0.0.1:" + std::to_string(port);
  std::string err0, err1;
  std::thread t0([&] {
    try {
      rendezvous(opts(method, 0, 2, 1s), Env(Vars{{"GZ_RDZV_TOKEN", "right"}}));
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  try {
    rendezvous(opts(method, 1, 2, 1s), Env(Vars{{"GZ_RDZV_TOKEN", "wrong"}}));
  } catch (const std::exception& e) {
    err1 = e.what();
  }
  t0.join();
  // The rank with another token refuses the store (it cannot prove that token), clearly.
  EXPECT_NE(err1.find("did not prove that it knows the rendezvous token"), std::string::npos) << err1;
  EXPECT_NE(err0.find("1 of 2"), std::string::npos) << err0;
}

TEST(Rendezvous, BusyMasterPortIsAClearError) {
  TcpStoreServerOptions so;
  so.bind_addr = "127.0.0.1";
  TcpStoreServer squatter(so);
  Vars v{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
         {"MASTER_PORT", std::to_string(squatter.port())}};
  try {
    rendezvous(opts("", -1, -1, 1s), Env(v));
    FAIL() << "hosted on a busy port";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(squatter.port())), std::string::npos) << m;
    EXPECT_NE(m.find("MASTER_PORT"), std::string::npos) << m;
  }
}

TEST(Rendezvous, BadInitMethodsAreInvalidArguments) {
  EXPECT_THROW(rendezvous(opts("foo://x", 0, 1), Env()), InvalidArgument);
  EXPECT_THROW(rendezvous(opts("tcp://127.0.0.1:1234"), Env()), InvalidArgument);  // no rank/world
  EXPECT_THROW(rendezvous(opts("tcp://127.0.0.1", 0, 2), Env()), InvalidArgument);
  EXPECT_THROW(rendezvous(opts("tcp://127.0.0.1:0", 0, 2), Env()), InvalidArgument);
  EXPECT_THROW(rendezvous(opts("tcp://127.0.0.1:1234", 2, 2), Env()), InvalidArgument);
  EXPECT_THROW(rendezvous(opts("file://relative/path", 0, 1), Env()), InvalidArgument);
  // Several nodes but no MASTER_ADDR: nobody knows where rank 0 is.
  EXPECT_THROW(rendezvous(opts(), Env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})),
               InvalidArgument);
}

TEST(Rendezvous, StoreBeyondLoopbackNeedsATokenOnEveryRank) {
  // Every rank refuses at once, before any connection or bind: the host, and the clients that
  // would otherwise wait for it until their timeout.
  for (int rank : {0, 1}) {
    Stopwatch sw;
    try {
      rendezvous(opts("tcp://no-such-host.invalid:29999", rank, 2, 5s), Env());
      FAIL() << "rank " << rank << " went on without a token";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("GZ_RDZV_TOKEN"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("GZ_RDZV_INSECURE"), std::string::npos) << e.what();
    }
    EXPECT_LT(sw.elapsed().count(), 500);
  }
  Vars v{
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "no-such-host.invalid"}, {"MASTER_PORT", "29999"}};
  EXPECT_THROW(rendezvous(opts("", -1, -1, 5s), Env(v)), InvalidArgument);
  // With a token, or the explicit opt-out, the rank goes on to connect (nobody there: a timeout).
  v["GZ_RDZV_TOKEN"] = "0123456789abcdef";
  EXPECT_THROW(rendezvous(opts("", -1, -1, 300ms), Env(v)), TimeoutError);
  v.erase("GZ_RDZV_TOKEN");
  v["GZ_RDZV_INSECURE"] = "1";
  EXPECT_THROW(rendezvous(opts("", -1, -1, 300ms), Env(v)), TimeoutError);
  InitOptions o = opts("tcp://no-such-host.invalid:29999", 1, 2, 300ms);
  o.insecure = true;
  EXPECT_THROW(rendezvous(o, Env()), TimeoutError);
}

}  // namespace
}  // namespace gz
