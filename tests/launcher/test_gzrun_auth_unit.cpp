// gzrun's rendezvous authentication, in pieces: the token options, the decision of which token
// to use (or to refuse to start), where the store binds, and hiding --rdzv-token from ps.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "gz/core/deadline.h"
#include "gz/core/error.h"
#include "gz/store/store.h"
#include "launch_auth.h"
#include "options.h"
#include "store_host.h"

using namespace gz;
using namespace gz::launcher;

namespace {
LaunchOptions parse(std::vector<std::string> args) { return parse_options(args, 1); }
const std::string kStrong = "0123456789abcdef0123456789abcdef";

bool has_warning(const LaunchAuth& a, const std::string& part) {
  for (const auto& w : a.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST(GzrunAuthUnit, Options) {
  auto o = parse({"--rdzv-token", "abc", "--rdzv_insecure", "prog"});
  EXPECT_EQ(o.rdzv_token, "abc");
  EXPECT_TRUE(o.rdzv_insecure);
  EXPECT_EQ(parse({"--rdzv-token-file=/x/y", "prog"}).rdzv_token_file, "/x/y");
  EXPECT_THROW(parse({"--rdzv-token", "a", "--rdzv-token-file", "f", "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--rdzv-token=", "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--rdzv-token", std::string(300, 't'), "prog"}), InvalidArgument);
  EXPECT_THROW(parse({"--rdzv-insecure=1", "prog"}), InvalidArgument);
}

TEST(GzrunAuthUnit, OneNodeGetsAFreshTokenUnlessOneIsGiven) {
  auto a = resolve_launch_auth(parse({"prog"}), "");
  EXPECT_TRUE(a.generated);
  EXPECT_EQ(a.token.size(), 64u);
  EXPECT_NE(resolve_launch_auth(parse({"prog"}), "").token, a.token);
  auto e = resolve_launch_auth(parse({"prog"}), kStrong);
  EXPECT_FALSE(e.generated);
  EXPECT_EQ(e.token, kStrong);
  EXPECT_TRUE(e.warnings.empty());
  // The command line wins over the environment; a short token works but is called weak.
  auto c = resolve_launch_auth(parse({"--rdzv-token", "short", "prog"}), kStrong);
  EXPECT_EQ(c.token, "short");
  EXPECT_TRUE(has_warning(c, "easy to guess"));
}

TEST(GzrunAuthUnit, SeveralNodesBeyondLoopbackNeedATokenOrInsecure) {
  auto multi = parse({"--nnodes", "3", "--node-rank", "1", "--master-addr", "10.0.0.1", "prog"});
  try {
    resolve_launch_auth(multi, "");
    FAIL() << "several nodes beyond loopback started without a token";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("--nnodes 3"), std::string::npos) << m;
    EXPECT_NE(m.find("10.0.0.1:29501"), std::string::npos) << m;  // the store: MASTER_PORT + 1
    EXPECT_NE(m.find("--rdzv-token-file"), std::string::npos) << m;
    EXPECT_NE(m.find("GZ_RDZV_TOKEN"), std::string::npos) << m;
    EXPECT_NE(m.find("--rdzv-insecure"), std::string::npos) << m;
  }
  EXPECT_EQ(resolve_launch_auth(multi, kStrong).token, kStrong);
  auto insecure =
      parse({"--nnodes", "3", "--node-rank", "0", "--master-addr", "10.0.0.1", "--rdzv-insecure", "prog"});
  auto a = resolve_launch_auth(insecure, "");
  EXPECT_TRUE(a.insecure);
  EXPECT_EQ(a.token, "");
  EXPECT_TRUE(has_warning(a, "admits anyone")) << (a.warnings.empty() ? "" : a.warnings[0]);
  // A token makes --rdzv-insecure moot (and says so).
  auto both = resolve_launch_auth(insecure, kStrong);
  EXPECT_FALSE(both.insecure);
  EXPECT_TRUE(has_warning(both, "ignored"));
}

TEST(GzrunAuthUnit, SeveralNodesOnLoopbackNeedATokenOrInsecureToo) {
  // Several gzruns on one machine, store on loopback: every local user reaches it, and no gzrun can
  // make the token up for the others (each would make a different one).
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--nnodes", "2", "--node-rank", "1", "prog"},
           {"--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "prog"},
           {"--nnodes", "1:3", "--master-addr", "localhost", "prog"}}) {
    try {
      resolve_launch_auth(parse(args), "");
      FAIL() << "several nodes on loopback started without a token";
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("every local user"), std::string::npos) << m;
      EXPECT_NE(m.find("--rdzv-token-file"), std::string::npos) << m;
      EXPECT_NE(m.find("--rdzv-insecure"), std::string::npos) << m;
    }
    EXPECT_EQ(resolve_launch_auth(parse(args), kStrong).token, kStrong);
  }
  auto elastic = parse({"--nnodes", "1:3", "--rdzv-insecure", "prog"});
  auto a = resolve_launch_auth(elastic, "");
  EXPECT_TRUE(a.insecure);
  EXPECT_TRUE(has_warning(a, "every local user"));
  // One node still gets a generated token.
  auto one = resolve_launch_auth(parse({"prog"}), "");
  EXPECT_TRUE(one.generated);
  EXPECT_EQ(one.token.size(), 64u);
}

TEST(GzrunAuthUnit, TokenFile) {
  char tmpl[] = "/tmp/gz_au_gzrun_token_XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(tmpl) << kStrong << "\n";
  ::chmod(tmpl, 0600);
  auto o = parse({"--nnodes", "2", "--master-addr", "10.0.0.1", "--rdzv-token-file", tmpl, "prog"});
  auto a = resolve_launch_auth(o, "from-env-loses");
  EXPECT_EQ(a.token, kStrong);
  EXPECT_TRUE(a.warnings.empty());
  ::chmod(tmpl, 0644);
  EXPECT_TRUE(has_warning(resolve_launch_auth(o, ""), "readable by other users"));
  std::remove(tmpl);
  EXPECT_THROW(resolve_launch_auth(o, ""), InvalidArgument);
}

TEST(GzrunAuthUnit, WhereTheStoreBinds) {
  EXPECT_EQ(store_bind_addr(parse({"prog"})), "127.0.0.1");
  EXPECT_EQ(store_bind_addr(parse({"--nnodes", "2", "prog"})), "127.0.0.1");
  EXPECT_EQ(store_bind_addr(parse({"--master-addr", "127.0.0.2", "prog"})), "127.0.0.2");
  EXPECT_EQ(store_bind_addr(parse({"--master-addr", "localhost", "prog"})), "127.0.0.1");
  EXPECT_EQ(store_bind_addr(parse({"--master-addr", "10.0.0.1", "prog"})), "0.0.0.0");
  EXPECT_EQ(store_bind_addr(parse({"--master-addr", "node0.example", "prog"})), "0.0.0.0");
  EXPECT_TRUE(store_beyond_loopback(parse({"--master-addr", "node0.example", "prog"})));
  EXPECT_FALSE(store_beyond_loopback(parse({"prog"})));
}

// A writable argv (what main() gets), for the functions that overwrite arguments in place.
struct MutableArgv {
  explicit MutableArgv(const std::vector<std::string>& args) {
    for (const auto& a : args) {
      bufs.emplace_back(a.begin(), a.end());
      bufs.back().push_back('\0');
    }
    for (auto& b : bufs) argv.push_back(b.data());
  }
  std::vector<std::vector<char>> bufs;
  std::vector<char*> argv;
};

TEST(GzrunAuthUnit, TokenValueIsHiddenFromPs) {
  std::vector<std::string> args = {"gzrun", "--rdzv-token", "sekrit", "--rdzv_token=sekrit2", "--nnodes", "2",
                                   "prog",  "--rdzv-token", "mine"};
  MutableArgv mutable_argv(args);
  std::vector<char*>& argv = mutable_argv.argv;
  hide_token_args(static_cast<int>(argv.size()), argv.data(), 6);
  EXPECT_STREQ(argv[2], "******");
  EXPECT_STREQ(argv[3], "--rdzv_token=*******");
  EXPECT_STREQ(argv[5], "2");
  EXPECT_STREQ(argv[8], "mine");  // the program's own arguments are its business
}

// `gzrun --status --rdzv-token T` has no PROGRAM: the token is the last argument and must be
// hidden too (it was not: the end was taken as argc - 1, one short).
TEST(GzrunAuthUnit, TokenHiddenWithoutAProgram) {
  for (const std::vector<std::string>& line :
       {std::vector<std::string>{"--status", "--master-addr", "127.0.0.1", "--master-port", "29500",
                                 "--rdzv-token", "sekrit"},
        std::vector<std::string>{"--preflight", "--rdzv-token=sekrit"}}) {
    std::vector<std::string> args{"gzrun"};
    args.insert(args.end(), line.begin(), line.end());
    MutableArgv mutable_argv(args);
    std::vector<char*>& argv = mutable_argv.argv;
    const int argc = static_cast<int>(argv.size());
    const LaunchOptions o = parse(line);
    hide_token_args(argc, argv.data(), program_arg_index(argc, o));
    EXPECT_EQ(std::string(argv.back()).find("sekrit"), std::string::npos) << argv.back();
  }
  // With a program, its own arguments stay untouched.
  const LaunchOptions p = parse({"--rdzv-token", "t", "prog", "--rdzv-token", "mine"});
  EXPECT_EQ(program_arg_index(6, p), 3);
}

TEST(GzrunAuthUnit, EtcdPasswordOnlyOverVerifiedTlsOrLoopback) {
  auto etcd = [](std::vector<std::string> extra) {
    std::vector<std::string> a{"--rdzv-backend", "etcd", "--rdzv-id",   "j",
                               "--nnodes",       "2",    "--node-rank", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back("prog");
    return parse(a);
  };
  // Plain http beyond loopback with a password: refused, saying what to do instead.
  auto clear = etcd({"--rdzv-endpoints", "10.0.0.1:2379,10.0.0.2:2379", "--rdzv-conf", "user=gz"});
  try {
    resolve_launch_auth(clear, kStrong);
    FAIL() << "the password would go in clear text beyond loopback";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("clear text"), std::string::npos) << m;
    EXPECT_NE(m.find("http://10.0.0.1:2379"), std::string::npos) << m;
    EXPECT_NE(m.find("cacert"), std::string::npos) << m;
    EXPECT_NE(m.find("--rdzv-insecure"), std::string::npos) << m;
  }
  // ... unless --rdzv-insecure, which warns.
  auto forced = etcd({"--rdzv-endpoints", "10.0.0.1:2379", "--rdzv-conf", "user=gz", "--rdzv-insecure"});
  auto f = resolve_launch_auth(forced, kStrong);
  EXPECT_EQ(f.token, kStrong);
  EXPECT_TRUE(has_warning(f, "clear text"));
  // https (the certificate verified against the CA) and loopback are fine.
  EXPECT_TRUE(resolve_launch_auth(etcd({"--rdzv-endpoints", "https://10.0.0.1:2379", "--rdzv-conf",
                                        "user=gz,cacert=/ca.pem"}),
                                  kStrong)
                  .warnings.empty());
  EXPECT_EQ(
      resolve_launch_auth(etcd({"--rdzv-endpoints", "127.0.0.1:2379", "--rdzv-conf", "user=gz"}), kStrong)
          .token,
      kStrong);
  // Beyond loopback nobody authenticates: refused; a user without the token: refused.
  EXPECT_THROW(resolve_launch_auth(etcd({"--rdzv-endpoints", "10.0.0.1:2379"}), ""), InvalidArgument);
  EXPECT_THROW(
      resolve_launch_auth(etcd({"--rdzv-endpoints", "https://10.0.0.1:2379", "--rdzv-conf", "user=gz"}), ""),
      InvalidArgument);
  // No token is generated for etcd (etcd would not know it); a token without a user is unused.
  auto local = resolve_launch_auth(etcd({"--rdzv-endpoints", "127.0.0.1:2379"}), "");
  EXPECT_EQ(local.token, "");
  EXPECT_FALSE(local.generated);
  auto unused = resolve_launch_auth(etcd({"--rdzv-endpoints", "127.0.0.1:2379"}), kStrong);
  EXPECT_EQ(unused.token, "");
  EXPECT_TRUE(has_warning(unused, "not used"));
}

// Two elastic jobs on one host with the same token (one exported GZ_RDZV_TOKEN) and the same
// --master-port: the second gzrun finds the store port taken and joins what holds it, thinking
// it another gzrun of its job. The store proves the job's --rdzv-id, so a gzrun of another job
// refuses it (before, both proved "gzrun" and the jobs merged silently); a gzrun of the same job
// joins it.
TEST(GzrunAuthUnit, ElasticJobsSharingATokenAndPortDoNotMerge) {
  int port = 0;
  for (int i = 0; i < 20 && port == 0; ++i) {
    const int p = probe_free_port("127.0.0.1");
    try {
      check_port_free("127.0.0.1", p + 1);
      port = p;
    } catch (const SystemError&) {
    }
  }
  ASSERT_NE(port, 0) << "no two free ports in a row";
  auto job = [&](const std::string& id) {
    return parse({"--nnodes", "1:2", "--master-addr", "127.0.0.1", "--master-port", std::to_string(port),
                  "--rdzv-id", id, "--rdzv-timeout", "3", "--heartbeat-timeout", "3", "prog"});
  };
  const LaunchOptions a = job("job-a"), b = job("job-b"), a2 = job("job-a");
  EXPECT_EQ(a.store_name(), "gzrun/job-a");
  StoreHost host(a, kStrong);
  host.start();
  ASSERT_TRUE(host.hosts_store());
  host.client().set("k", to_bytes("a"));
  StoreHost other(b, kStrong);
  other.start();
  EXPECT_FALSE(other.hosts_store());
  try {
    other.client().set("k", to_bytes("b"));
    FAIL() << "a gzrun of job-b joined job-a's store";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("not by this job's store"), std::string::npos) << m;
    EXPECT_NE(m.find("gzrun/job-a"), std::string::npos) << m;
  }
  StoreHost same(a2, kStrong);
  same.start();
  EXPECT_FALSE(same.hosts_store());
  EXPECT_EQ(to_string(same.client().get("k", Deadline::after(std::chrono::seconds(3)))), "a");
}
