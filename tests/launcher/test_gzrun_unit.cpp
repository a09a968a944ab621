// Unit tests of gzrun's pieces: option parsing, line splitting, worker environment, helpers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "dump_collector.h"
#include "gz/core/error.h"
#include "job_monitor.h"
#include "options.h"
#include "output_relay.h"
#include "process.h"
#include "worker_env.h"

using namespace gz;
using namespace gz::launcher;

namespace {
LaunchOptions parse(std::vector<std::string> args) { return parse_options(args, 6); }

std::vector<std::string> split(const std::vector<std::string>& chunks, size_t max_line = 1 << 16) {
  LineSplitter s(max_line);
  std::vector<std::string> out;
  auto emit = [&](const std::string& l) { out.push_back(l); };
  for (const auto& c : chunks) s.feed(c.data(), c.size(), emit);
  s.flush(emit);
  return out;
}
}  // namespace

TEST(GzrunOptions, Defaults) {
  auto o = parse({"prog"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);  // free port on one node
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_DOUBLE_EQ(o.grace_period_s, 5.0);
  EXPECT_EQ(o.program, "prog");
  EXPECT_TRUE(o.args.empty());
}

TEST(GzrunOptions, SpellingsAndForms) {
  auto a = parse({"--nproc-per-node", "3", "--max_restarts=2", "--grace-period=0.5", "--log_dir", "/tmp/x",
                  "--rdzv-timeout", "30", "prog", "--nproc-per-node", "9"});
  EXPECT_EQ(a.nproc_per_node, 3);
  EXPECT_EQ(a.max_restarts, 2);
  EXPECT_DOUBLE_EQ(a.grace_period_s, 0.5);
  EXPECT_EQ(a.log_dir, "/tmp/x");
  EXPECT_DOUBLE_EQ(a.rdzv_timeout_s, 30);
  EXPECT_EQ(a.program, "prog");
  EXPECT_EQ(a.args, (std::vector<std::string>{"--nproc-per-node", "9"}));

  auto b = parse({"--nproc_per_node=auto", "--", "--weird-prog", "x"});
  EXPECT_TRUE(b.nproc_auto);
  EXPECT_EQ(b.nproc_per_node, 6);
  EXPECT_EQ(b.program, "--weird-prog");
  EXPECT_EQ(b.args, std::vector<std::string>{"x"});
}

TEST(GzrunOptions, MultiNode) {
  auto o = parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "prog"});
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_port, kDefaultMultiNodePort);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.world_size(), 2);
  auto e = parse({"--nnodes=3:3", "--rdzv_endpoint=host:1234", "prog"});
  EXPECT_EQ(e.nnodes, 3);
  EXPECT_EQ(e.master_addr, "host");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_THROW(parse({"--nnodes", "2", "--master-port", "0", "prog"}), InvalidArgument);
  EXPECT_FALSE(e.elastic);  // N:N is a fixed size
  EXPECT_THROW(parse({"--nnodes", "2", "--node-rank", "2", "prog"}), InvalidArgument);
}

TEST(GzrunOptions, Elastic) {
  auto o = parse({"--nnodes", "2:4", "--master-addr", "10.0.0.1", "--rdzv-join-window", "1.5", "prog"});
  EXPECT_TRUE(o.elastic);
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.max_nodes, 4);
  EXPECT_EQ(o.nnodes, 4);  // the most there can be
  EXPECT_DOUBLE_EQ(o.join_window_s, 1.5);
  EXPECT_EQ(o.master_port, kDefaultMultiNodePort);
  EXPECT_DOUBLE_EQ(parse({"--nnodes=1:2", "prog"}).join_window_s, 10.0);
  EXPECT_TRUE(parse({"--nnodes=1:2", "prog"}).elastic);
  // Ranks come from the rendezvous; a range must be ordered; one node cannot be elastic alone.
  EXPECT_THROW(parse({"--nnodes", "1:4", "--node-rank", "0", "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--nnodes", "4:2", "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--nnodes", "1:2", "--standalone", "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--nnodes", "1:2", "--master-port", "0", "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--rdzv-join-window", "-1", "prog"}), InvalidArgument);
}

TEST(GzrunOptions, Standalone) {
  auto o = parse({"--standalone", "--nproc-per-node", "4", "prog"});
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.master_port, 0);
  EXPECT_THROW(parse({"--standalone", "--nnodes", "2", "prog"}), InvalidArgument);
}

TEST(GzrunOptions, ErrorsNameTheOption) {
  auto message = [](std::vector<std::string> args) {
    try {
      parse(args);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({"--bogus", "prog"}).find("--bogus"), std::string::npos);
  EXPECT_NE(message({"--master-port", "x", "prog"}).find("--master-port"), std::string::npos);
  EXPECT_NE(message({"--master-port", "65536", "prog"}).find("--master-port"), std::string::npos);
  EXPECT_NE(message({"--grace-period", "-1", "prog"}).find("--grace-period"), std::string::npos);
  EXPECT_NE(message({"--rdzv-timeout", "0", "prog"}).find("--rdzv-timeout"), std::string::npos);
  EXPECT_NE(message({"--max-restarts", "-2", "prog"}).find("--max-restarts"), std::string::npos);
  EXPECT_NE(message({"--log-dir"}).find("needs a value"), std::string::npos);
  EXPECT_NE(message({"--help=1"}).find("takes no value"), std::string::npos);
  EXPECT_NE(message({}).find("no program"), std::string::npos);
  EXPECT_NE(message({"--rdzv-endpoint", "nohostport", "p"}).find("HOST:PORT"), std::string::npos);
}

TEST(GzrunOptions, HeartbeatKnobs) {
  auto d = parse({"prog"});
  EXPECT_DOUBLE_EQ(d.heartbeat_timeout_s, 10.0);
  EXPECT_DOUBLE_EQ(d.effective_heartbeat_interval_s(), 1.0);
  auto o = parse({"--heartbeat-timeout", "3", "prog"});
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout_s, 3.0);
  EXPECT_DOUBLE_EQ(o.effective_heartbeat_interval_s(), 0.3);
  EXPECT_DOUBLE_EQ(parse({"--heartbeat_timeout=0.2", "prog"}).effective_heartbeat_interval_s(), 0.05);
  EXPECT_DOUBLE_EQ(parse({"--heartbeat-interval", "5", "--heartbeat-timeout", "4", "prog"})
                       .effective_heartbeat_interval_s(),
                   2.0);
  EXPECT_THROW(parse({"--heartbeat-timeout", "0", "prog"}), InvalidArgument);
  // The environment fills in what the command line left out, never more.
  auto e = parse({"prog"});
  apply_env_defaults(e, "2.5", "0.1");
  EXPECT_DOUBLE_EQ(e.heartbeat_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(e.effective_heartbeat_interval_s(), 0.1);
  apply_env_defaults(o, "7", "");
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout_s, 3.0);
  EXPECT_THROW(apply_env_defaults(d, "soon", ""), InvalidArgument);
}

TEST(GzrunJobFailure, RecordRoundTrip) {
  JobFailure f;
  f.kind = JobFailure::Kind::node_lost;
  f.node = 2;
  f.text = "node 2 lost: a|b";
  JobFailure g = JobFailure::decode(f.encode());
  EXPECT_EQ(g.kind, JobFailure::Kind::node_lost);
  EXPECT_EQ(g.node, 2);
  EXPECT_EQ(g.text, "node 2 lost: a|b");
  JobFailure raw = JobFailure::decode("no separators");
  EXPECT_TRUE(raw.failed());
  EXPECT_EQ(raw.text, "no separators");
}

TEST(GzrunOptions, HelpAndVersionNeedNoProgram) {
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"--help"}).help);
  EXPECT_TRUE(parse({"--version"}).version);
  EXPECT_NE(usage_text().find("--max-restarts"), std::string::npos);
}

TEST(GzrunOptions, AutoNprocIsPositive) {
  EXPECT_GE(detect_auto_nproc(), 1);
  EXPECT_GE(usable_cores(), 1);
}

TEST(GzrunLineSplitter, SplitsOnNewlineAndCarriageReturn) {
  EXPECT_EQ(split({"a\nb\n"}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split({"a\r\nb\rc\n\n"}), (std::vector<std::string>{"a", "b", "c", ""}));
  EXPECT_EQ(split({"a\r", "\nb"}), (std::vector<std::string>{"a", "b"}));  // CRLF across chunks
  EXPECT_EQ(split({"\r\r"}), (std::vector<std::string>{"", ""}));
  EXPECT_EQ(split({"par", "tial", " line"}), (std::vector<std::string>{"partial line"}));
  EXPECT_EQ(split({}), std::vector<std::string>{});
}

TEST(GzrunLineSplitter, CutsOverlongLines) {
  EXPECT_EQ(split({"abcdefg\nxy"}, 3), (std::vector<std::string>{"abc", "def", "g", "xy"}));
  std::string big(10000, 'z');
  auto pieces = split({big.substr(0, 777), big.substr(777)}, 4096);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].size() + pieces[1].size() + pieces[2].size(), big.size());
}

TEST(GzrunLineSplitter, EveryByteSplitMatchesTheWholeFeed) {
  const std::string text = "one\r\ntwo\rthree\n\nfour\r\r\nfive";
  auto reference = split({text});
  for (size_t cut = 0; cut <= text.size(); ++cut)
    EXPECT_EQ(split({text.substr(0, cut), text.substr(cut)}), reference) << "cut at " << cut;
}

TEST(GzrunWorkerEnv, TorchrunNamesAndRanks) {
  LaunchOptions o = parse({"--nnodes", "3", "--node-rank", "2", "--nproc-per-node", "4", "prog"});
  AttemptInfo a;
  a.attempt = 2;
  a.run_id = "77-2";
  a.master_addr = "10.1.1.1";
  a.master_port = 1234;
  a.store_port = 4321;
  a.cores = 16;
  Env base({{"PATH", "/bin"}, {"RANK", "stale"}});
  auto env = worker_env(base, o, a, 3);
  EXPECT_EQ(env["RANK"], "11");  // 2 * 4 + 3
  EXPECT_EQ(env["LOCAL_RANK"], "3");
  EXPECT_EQ(env["WORLD_SIZE"], "12");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "2");
  EXPECT_EQ(env["NODE_RANK"], "2");
  EXPECT_EQ(env["ROLE_RANK"], "11");
  EXPECT_EQ(env["MASTER_ADDR"], "10.1.1.1");
  EXPECT_EQ(env["MASTER_PORT"], "1234");  // the program's
  EXPECT_EQ(env["GZ_STORE_ADDR"], "10.1.1.1");
  EXPECT_EQ(env["GZ_STORE_PORT"], "4321");  // gzrun's store
  EXPECT_EQ(env["GZ_LAUNCHER"], "gzrun");
  EXPECT_EQ(env["GZ_STORE_HOSTED"], "1");
  EXPECT_EQ(env["GZ_NNODES"], "3");
  EXPECT_EQ(env["GZ_RUN_ID"], "77-2");
  EXPECT_EQ(env["GZ_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");  // 16 cores / 4 workers
  EXPECT_EQ(env["PATH"], "/bin");
  base.set("OMP_NUM_THREADS", "7");
  EXPECT_EQ(worker_env(base, o, a, 0)["OMP_NUM_THREADS"], "7");
  a.cores = 2;
  base = Env();
  EXPECT_EQ(worker_env(base, o, a, 0)["OMP_NUM_THREADS"], "1");  // never 0
  // Elastic: the round's node rank and node count replace the command line's.
  LaunchOptions e = parse({"--nnodes", "1:3", "--nproc-per-node", "2", "prog"});
  AttemptInfo ea = a;
  ea.node_rank = 1;
  ea.nnodes = 2;
  auto eenv = worker_env(base, e, ea, 1);
  EXPECT_EQ(eenv["RANK"], "3");
  EXPECT_EQ(eenv["WORLD_SIZE"], "4");
  EXPECT_EQ(eenv["GROUP_RANK"], "1");
  EXPECT_EQ(eenv["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(eenv["GZ_NNODES"], "2");
  EXPECT_EQ(eenv["GZ_MIN_NODES"], "1");
  EXPECT_EQ(eenv["GZ_MAX_NODES"], "3");
  auto envp = to_envp({{"A", "1"}, {"B", "x=y"}});
  EXPECT_EQ(envp, (std::vector<std::string>{"A=1", "B=x=y"}));
}

TEST(GzrunProcess, ResolveProgram) {
  EXPECT_EQ(resolve_program("sh", "/nonexistent:/bin:/usr/bin"), "/bin/sh");
  EXPECT_THROW(resolve_program("gzrun-no-such-prog", "/bin:/usr/bin"), InvalidArgument);
  EXPECT_THROW(resolve_program("/etc/hostname-not-there", ""), InvalidArgument);
  EXPECT_THROW(resolve_program("/etc/passwd", ""), InvalidArgument);  // not executable
  EXPECT_THROW(resolve_program("", "/bin"), InvalidArgument);
  EXPECT_EQ(resolve_program("/bin/sh", ""), "/bin/sh");
}

TEST(GzrunProcess, DescribeStatus) {
  pid_t p = fork();
  if (p == 0) _exit(3);
  int st = 0;
  waitpid(p, &st, 0);
  EXPECT_EQ(describe_status(st), "exited with code 3");
  p = fork();
  if (p == 0) {
    raise(SIGKILL);
    _exit(0);
  }
  waitpid(p, &st, 0);
  EXPECT_EQ(describe_status(st), "killed by signal 9 (SIGKILL)");
  EXPECT_NE(unexpected_death_hint(st).find("lack of memory"), std::string::npos) << unexpected_death_hint(st);
  EXPECT_EQ(unexpected_death_hint(3 << 8), "");  // exited with code 3
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
}

TEST(GzrunOptions, EtcdBackend) {
  auto d = parse({"prog"});
  EXPECT_EQ(d.rdzv_backend, "tcp");
  EXPECT_FALSE(d.etcd());
  auto o = parse({"--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379,h2:2379, https://h3:2379",
                  "--rdzv_id", "job-7", "--rdzv-conf",
                  "user=gz,cacert=/ca.pem,cert=/c.pem,key=/k.pem,root=/jobs", "--nnodes", "2:4", "prog"});
  EXPECT_TRUE(o.etcd());
  EXPECT_EQ(o.rdzv_endpoints, (std::vector<std::string>{"h1:2379", "h2:2379", "https://h3:2379"}));
  EXPECT_EQ(o.etcd_prefix(), "/jobs/job-7");
  EXPECT_EQ(o.etcd_user, "gz");
  EXPECT_EQ(o.etcd_cacert, "/ca.pem");
  EXPECT_EQ(o.etcd_cert, "/c.pem");
  EXPECT_EQ(o.etcd_key, "/k.pem");
  // torchrun's spelling: --rdzv-endpoint names etcd, not node 0.
  auto t = parse({"--rdzv-backend=etcd", "--rdzv-endpoint", "e1:2379", "--rdzv-id", "j", "--nnodes", "2",
                  "--node-rank", "1", "prog"});
  EXPECT_EQ(t.rdzv_endpoints, std::vector<std::string>{"e1:2379"});
  EXPECT_EQ(t.master_addr, "127.0.0.1");
  EXPECT_EQ(t.master_port, 29500);  // the program's default, not etcd's port
  EXPECT_EQ(parse({"--rdzv-backend", "c10d", "prog"}).rdzv_backend, "tcp");
  EXPECT_THROW(parse({"--rdzv-backend", "zookeeper", "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--rdzv-backend", "etcd", "--rdzv-id", "j", "prog"}), InvalidArgument);  // no endpoints
  EXPECT_THROW(parse({"--rdzv-backend", "etcd", "--rdzv-endpoints", "h:1", "prog"}),
               InvalidArgument);                                                                // no id
  EXPECT_THROW(parse({"--rdzv-endpoints", "h:1", "--rdzv-id", "j", "prog"}), InvalidArgument);  // tcp backend
  EXPECT_THROW(parse({"--rdzv-backend", "etcd", "--rdzv-endpoints", "h:1", "--rdzv-id", "a/b", "prog"}),
               InvalidArgument);
  EXPECT_THROW(parse({"--rdzv-backend", "etcd", "--rdzv-endpoints", "h:1", "--rdzv-id", "j", "--rdzv-conf",
                      "colour=red", "prog"}),
               InvalidArgument);
  EXPECT_THROW(parse({"--rdzv-backend", "etcd", "--rdzv-endpoints", "ftp://h:1", "--rdzv-id", "j", "prog"}),
               InvalidArgument);
}

TEST(GzrunWorkerEnv, EtcdSendsWorkersToTheCluster) {
  LaunchOptions o =
      parse({"--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379,h2:2379", "--rdzv-id", "j1",
             "--rdzv-conf", "user=gz,cacert=/ca.pem", "--nnodes", "2", "--node-rank", "1", "prog"});
  AttemptInfo a;
  a.run_id = "5-0";
  a.master_addr = "h0";
  Env base({{"GZ_STORE_PORT", "1"}, {"GZ_STORE_ADDR", "stale"}});
  auto env = worker_env(base, o, a, 0);
  EXPECT_EQ(env["GZ_STORE_BACKEND"], "etcd");
  EXPECT_EQ(env["GZ_STORE_ENDPOINTS"], "h1:2379,h2:2379");
  EXPECT_EQ(env["GZ_STORE_PREFIX"], "/gz/j1");
  EXPECT_EQ(env["GZ_STORE_USER"], "gz");
  EXPECT_EQ(env["GZ_STORE_CACERT"], "/ca.pem");
  EXPECT_EQ(env.count("GZ_STORE_CERT"), 0u);
  EXPECT_EQ(env["MASTER_ADDR"], "h0");
  // The TCP backend never inherits a stray etcd setting from gzrun's environment.
  LaunchOptions t = parse({"prog"});
  auto tenv = worker_env(Env({{"GZ_STORE_BACKEND", "etcd"}, {"GZ_STORE_ENDPOINTS", "x:1"}}), t, a, 0);
  EXPECT_EQ(tenv.count("GZ_STORE_BACKEND"), 0u);
  EXPECT_EQ(tenv.count("GZ_STORE_ENDPOINTS"), 0u);
}

// Every variable gzrun decides is its own: a stale one in gzrun's environment (an etcd user or
// certificate from the shell, another job's elastic bounds) never reaches the workers. Before,
// only the backend, endpoints and prefix were dropped, and only with the TCP backend.
TEST(GzrunWorkerEnv, StaleStoreVariablesNeverReachWorkers) {
  Env base({{"GZ_STORE_USER", "someone"},
            {"GZ_STORE_CACERT", "/old/ca.pem"},
            {"GZ_STORE_CERT", "/old/c.pem"},
            {"GZ_STORE_KEY", "/old/c.key"},
            {"GZ_MIN_NODES", "3"},
            {"GZ_MAX_NODES", "9"},
            {"GZ_STORE_ADDR", "stale"},
            {"GZ_STORE_PORT", "1"},
            {"GZ_STORE_PREFIX", "/gz/old"}});
  AttemptInfo a;
  a.master_addr = "h0";
  a.store_port = 29501;
  const char* gone[] = {"GZ_STORE_USER", "GZ_STORE_CACERT", "GZ_STORE_CERT",  "GZ_STORE_KEY",
                        "GZ_MIN_NODES",  "GZ_MAX_NODES",    "GZ_STORE_PREFIX"};
  // etcd without a user or certificates: none of the old ones, no store address.
  LaunchOptions e =
      parse({"--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379", "--rdzv-id", "j2", "prog"});
  auto eenv = worker_env(base, e, a, 0);
  for (const char* v : {"GZ_STORE_USER", "GZ_STORE_CACERT", "GZ_STORE_CERT", "GZ_STORE_KEY", "GZ_MIN_NODES",
                        "GZ_MAX_NODES", "GZ_STORE_ADDR", "GZ_STORE_PORT"})
    EXPECT_EQ(eenv.count(v), 0u) << v << " leaked to an etcd job's workers";
  EXPECT_EQ(eenv["GZ_STORE_PREFIX"], "/gz/j2");
  // The TCP backend, fixed nodes.
  auto tenv = worker_env(base, parse({"prog"}), a, 0);
  for (const char* v : gone) EXPECT_EQ(tenv.count(v), 0u) << v << " leaked to a TCP job's workers";
  EXPECT_EQ(tenv["GZ_STORE_ADDR"], "h0");
  EXPECT_EQ(tenv["GZ_STORE_PORT"], "29501");
}

// Mutation check: parse_recovery accepting any value, or the option missing from kSpecs.
TEST(GzrunOptions, Recovery) {
  EXPECT_EQ(parse({"prog"}).recovery, LaunchOptions::Recovery::restart);
  EXPECT_FALSE(parse({"prog"}).in_place());
  EXPECT_TRUE(parse({"--recovery", "in-place", "prog"}).in_place());
  EXPECT_TRUE(parse({"--recovery=in-place", "prog"}).in_place());
  EXPECT_TRUE(parse({"--recovery=in_place", "prog"}).in_place());
  EXPECT_FALSE(parse({"--recovery", "restart", "prog"}).in_place());
  try {
    parse({"--recovery", "sometimes", "prog"});
    ADD_FAILURE() << "--recovery sometimes was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--recovery 'sometimes'"), std::string::npos) << m;
    EXPECT_NE(m.find("restart"), std::string::npos) << m;
    EXPECT_NE(m.find("in-place"), std::string::npos) << m;
  }
  EXPECT_THROW(parse({"--recovery", "prog"}), InvalidArgument);  // "prog" is taken as the mode
  EXPECT_NE(usage_text().find("--recovery"), std::string::npos);
  EXPECT_NE(usage_text().find("GZ_REPLACEMENT"), std::string::npos);
}

// Mutation check: worker_env keeping an inherited GZ_RECOVERY, or a replacement changing the
// restart count or run id.
TEST(GzrunWorkerEnv, RecoveryAndReplacement) {
  AttemptInfo a;
  a.attempt = 1;
  a.run_id = "9-1";
  Env base({{"GZ_RECOVERY", "in_place"}, {"GZ_REPLACEMENT", "5"}});
  auto r = worker_env(base, parse({"prog"}), a, 0);
  EXPECT_EQ(r["GZ_RECOVERY"], "restart");
  EXPECT_EQ(r["GZ_REPLACEMENT"], "0");
  auto i = worker_env(base, parse({"--recovery", "in-place", "--nproc-per-node", "2", "prog"}), a, 1, 2);
  EXPECT_EQ(i["GZ_RECOVERY"], "in_place");
  EXPECT_EQ(i["GZ_REPLACEMENT"], "2");
  EXPECT_EQ(i["GZ_RESTART_COUNT"], "1");
  EXPECT_EQ(i["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(i["GZ_RUN_ID"], "9-1");
}

// Mutation check: WorkerBoard::add appending a second entry for a replaced rank.
TEST(GzrunWorkerBoard, ReplacementTakesItsRanksEntry) {
  WorkerBoard b;
  b.start_round("9-0", "/tmp/d", 0, 1, 0);
  b.add(WorkerView{0, 0, 100, true, 0, false, false, 0});
  b.add(WorkerView{1, 1, 101, true, 0, false, false, 0});
  b.ended(101, 9, true, false);
  b.add(WorkerView{1, 1, 102, true, 0, false, false, 1});
  auto s = b.snapshot();
  ASSERT_EQ(s.workers.size(), 2u);
  EXPECT_EQ(s.workers[1].pid, 102);
  EXPECT_TRUE(s.workers[1].alive);
  EXPECT_FALSE(s.workers[1].first_failure);
  EXPECT_EQ(s.workers[1].replacement, 1);
  EXPECT_EQ(s.workers[0].pid, 100);
}

// A move in place: live workers' lines take their new rank, each keeps its log file, and a gone
// worker's log never takes a moved one's number. Mutation check: relabel() remapping only the
// pipes (logs_ keyed by the old ranks) sends the moved workers' lines to other files or none.
TEST(GzrunOutputRelay, RelabelMovesLinesAndKeepsEachWorkersLog) {
  int con[2], p4[2], p5[2];
  ASSERT_EQ(::pipe(con), 0);
  ASSERT_EQ(::pipe(p4), 0);
  ASSERT_EQ(::pipe(p5), 0);
  char tmpl[] = "/tmp/gz_relabel_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto log_fd = [&](int r) {
    return ::open((dir + "/rank_" + std::to_string(r) + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  };
  auto read_file = [&](int r) {
    std::string s, path = dir + "/rank_" + std::to_string(r) + ".log";
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[256];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
      std::fclose(f);
    }
    return s;
  };
  {
    OutputRelay relay(con[1], con[1]);
    relay.add_pipe(4, Stream::out, p4[0]);
    relay.add_pipe(5, Stream::out, p5[0]);
    relay.set_log(2, log_fd(2));  // a gone worker of rank 2 (another node's, say)
    relay.set_log(4, log_fd(4));
    relay.set_log(5, log_fd(5));
    relay.relabel({{4, 2}, {5, 3}});
    ASSERT_EQ(::write(p4[1], "a\n", 2), 2);
    ASSERT_EQ(::write(p5[1], "b\n", 2), 2);
    ::close(p4[1]);
    ::close(p5[1]);
    relay.drain_all();
  }
  ::close(con[1]);
  std::string console;
  char buf[256];
  ssize_t n;
  while ((n = ::read(con[0], buf, sizeof buf)) > 0) console.append(buf, static_cast<size_t>(n));
  ::close(con[0]);
  EXPECT_NE(console.find("[2] a\n"), std::string::npos) << console;
  EXPECT_NE(console.find("[3] b\n"), std::string::npos) << console;
  EXPECT_EQ(read_file(4), "a\n");  // each worker's lines stay in the file it started with
  EXPECT_EQ(read_file(5), "b\n");
  EXPECT_EQ(read_file(2), "");
  std::filesystem::remove_all(dir);
}
