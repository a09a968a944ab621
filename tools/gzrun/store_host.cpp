#include "store_host.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "etcd_backend.h"
#include "gz/core/deadline.h"
#include "gz/core/error.h"
#include "gz/store/etcd_store.h"
#include "gz/store/store.h"
#include "gz/store/tcp_store.h"
#include "launch_auth.h"   // store_bind_addr()
#include "output_relay.h"  // say()

namespace gz::launcher {

struct StoreHost::Impl {
  std::unique_ptr<EtcdStore> etcd;  // --rdzv-backend etcd: this gzrun's client (nobody hosts)
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStore> client;
};

StoreHost::StoreHost(const LaunchOptions& options, std::string token)
    : o_(options), token_(std::move(token)), impl_(std::make_unique<Impl>()) {
  port_ = o_.store_port();
  program_port_ = o_.master_port;
}

StoreHost::~StoreHost() {
  impl_->client.reset();
  if (impl_->server) impl_->server->stop();
}

void check_port_free(const std::string& addr, int port, const std::string& what) {
  if (port == 0) return;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SystemError("socket()", errno);
  int one = 1;
  // Same flag a server uses, so a port only lingering in TIME_WAIT is not reported as busy.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    throw SystemError("cannot bind " + what + " on port " + std::to_string(port) +
                          (err == EADDRINUSE ? " (the port is already in use; pick another --master-port, "
                                               "or leave it out on a single node to get a free one)"
                                             : ""),
                      err);
}

bool is_local_address(const std::string& addr) {
  std::vector<in_addr_t> wanted;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(addr.c_str(), nullptr, &hints, &res) != 0) return false;
  for (addrinfo* p = res; p; p = p->ai_next)
    wanted.push_back(reinterpret_cast<sockaddr_in*>(p->ai_addr)->sin_addr.s_addr);
  freeaddrinfo(res);
  for (in_addr_t a : wanted)
    if ((ntohl(a) >> 24) == 127) return true;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr_t mine = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    found = std::find(wanted.begin(), wanted.end(), mine) != wanted.end();
  }
  freeifaddrs(ifs);
  return found;
}

int probe_free_port(const std::string& addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SystemError("socket()", errno);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("cannot find a free port on " + addr, err);
  }
  ::close(fd);
  return ntohs(sa.sin_port);
}

void StoreHost::start() {
  if (o_.etcd()) {
    // The store is the etcd cluster: nothing to host. One node without --master-port: a free
    // port for the program's rank 0, as below.
    port_ = 0;
    if (program_port_ == 0) program_port_ = probe_free_port(store_bind_addr(o_));
    return;
  }
  if (o_.elastic) {
    // No node ranks before the rendezvous: the store runs where --master-addr points.
    if (!is_local_address(o_.master_addr)) return;
  } else if (o_.node_rank != 0) {
    return;
  }
  // Loopback when --master-addr is a loopback address (one node by default), else everywhere:
  // then a token is required (launch_auth.h), or --rdzv-insecure.
  std::string bind_addr = store_bind_addr(o_);
  const int want = o_.store_port();
  // Elastic, several gzruns of the job on the host that owns the address: the first one hosts.
  auto taken_by_another_gzrun = [&] {
    if (!o_.elastic) return false;
    try {
      check_port_free(bind_addr, want);
      return false;
    } catch (const SystemError& e) {
      if (e.code() != EADDRINUSE) throw;
      say("store port " + std::to_string(want) + " is taken on this host: joining the store there");
      joined_busy_port_ = true;
      return true;
    }
  };
  if (taken_by_another_gzrun()) return;
  // MASTER_PORT is the program's (torch's rank 0 binds it): gzrun only checks it is free.
  check_port_free(bind_addr, o_.master_port, "the program's MASTER_PORT (its rank 0 binds it)");
  hosts_ = true;
  TcpStoreServerOptions so;
  so.bind_addr = bind_addr;
  so.port = want;
  so.token = token_;
  so.allow_insecure = o_.rdzv_insecure;
  so.name = o_.store_name();
  try {
    impl_->server = std::make_unique<TcpStoreServer>(so);
  } catch (const Error& e) {
    if (taken_by_another_gzrun()) {
      hosts_ = false;
      return;
    }
    throw Error("cannot host gzrun's store on port " + std::to_string(want) +
                (o_.nnodes > 1 ? " (MASTER_PORT+1)" : "") + ": " + e.what());
  }
  port_ = impl_->server->port();
  if (program_port_ == 0) {
    // One node, no --master-port: a port free now for the program's rank 0 (torchrun
    // --standalone does the same); the store holds its own, so the two never coincide.
    for (int i = 0; i < 8 && (program_port_ == 0 || program_port_ == port_); ++i)
      program_port_ = probe_free_port(bind_addr);
  }
}

namespace {
std::unique_ptr<TcpStore> connect_client(const LaunchOptions& o, const std::string& host, int port,
                                         const std::string& token) {
  TcpStoreOptions co;
  co.token = token;
  co.server_name = o.store_name();
  co.timeout = std::chrono::milliseconds(static_cast<long long>(o.rdzv_timeout_s * 1000));
  auto client = std::make_unique<TcpStore>(host, port, co);
  // Connecting may take the whole rendezvous timeout (nodes start at different times); each
  // operation after that is bounded by the heartbeat timeout, so a lost store host is noticed.
  client->set_timeout(std::chrono::milliseconds(static_cast<long long>(o.heartbeat_timeout_s * 1000)));
  return client;
}
}  // namespace

std::string StoreHost::client_host() const {
  return (hosts_ && !o_.master_addr_given) ? std::string("127.0.0.1") : o_.master_addr;
}

std::string StoreHost::where() const {
  return o_.etcd() ? etcd_where(o_) : client_host() + ":" + std::to_string(port_);
}

Store& StoreHost::client() {
  if (o_.etcd()) {
    if (!impl_->etcd) {
      // Reaching etcd may take the whole rendezvous timeout; each operation then the heartbeat's.
      EtcdStoreOptions e = etcd_store_options(o_, token_, o_.rdzv_insecure);
      e.timeout = std::chrono::milliseconds(static_cast<long long>(o_.rdzv_timeout_s * 1000));
      impl_->etcd = std::make_unique<EtcdStore>(e);
      impl_->etcd->set_timeout(
          std::chrono::milliseconds(static_cast<long long>(o_.heartbeat_timeout_s * 1000)));
    }
    return *impl_->etcd;
  }
  if (impl_->client) return *impl_->client;
  try {
    impl_->client = connect_client(o_, client_host(), port_, token_);
  } catch (const Error& e) {
    if (!joined_busy_port_) throw;
    // The port was busy, so this gzrun took it for another gzrun of the job hosting the store:
    // what answers there did not prove it (another job's store or program holds the port).
    GZ_THROW(Error, "store port ", port_,
             " (MASTER_PORT+1) on this host is taken, but not by this job's store: ", e.what(),
             ". Jobs that share a host need --master-port values at least 2 apart (each uses MASTER_PORT "
             "and MASTER_PORT+1)");
  }
  return *impl_->client;
}

std::unique_ptr<Store> StoreHost::monitor_client() const {
  if (o_.etcd()) return std::make_unique<EtcdStore>(etcd_store_options(o_, token_, o_.rdzv_insecure));
  TcpStoreOptions co;
  co.token = token_;
  co.server_name = o_.store_name();
  co.timeout = std::chrono::milliseconds(static_cast<long long>(o_.heartbeat_timeout_s * 1000));
  return std::make_unique<TcpStore>(client_host(), port_, co);
}

bool StoreHost::node_barrier(const std::string& name, int nnodes, const Cancelled& cancelled,
                             const std::function<bool()>& job_failed) {
  Store& s = client();
  Stopwatch sw;
  Deadline deadline =
      Deadline::after(std::chrono::milliseconds(static_cast<long long>(o_.rdzv_timeout_s * 1000)));
  const std::string released = name + "/released";
  int64_t arrived = s.add(name + "/arrived", 1);
  if (arrived == nnodes) s.set(released, to_bytes("1"));
  // Waits in the store (woken by the release) in slices, so signals and failures are seen.
  auto released_within = [&](Duration slice) {
    try {
      s.wait({released}, Deadline::after(std::min(slice, std::max(deadline.remaining(), Duration(1)))));
      return true;
    } catch (const TimeoutError&) {
      return s.check({released});  // throws when the store itself does not answer (its own timeout)
    }
  };
  while (!released_within(Duration(250))) {
    if (job_failed && job_failed()) return false;
    if (cancelled && cancelled())
      GZ_THROW(Aborted, "node ", o_.node_rank, ": cancelled while waiting for the other nodes (", name, ")");
    if (deadline.expired()) {
      int64_t now = s.add(name + "/arrived", 0);
      GZ_THROW(TimeoutError, "node ", o_.node_rank, ": only ", now, " of ", nnodes, " nodes reached ", name,
               " within --rdzv-timeout (", format_duration(sw.elapsed()), ", store at ",
               o_.etcd() ? where() : o_.master_addr + ":" + std::to_string(port_), ")");
    }
  }
  return true;
}

void StoreHost::refuse_old_job() {
  if (!o_.etcd()) return;
  // etcd outlives jobs: a job that reuses an --rdzv-id would meet the old job's keys.
  Store& s = client();
  if (s.check({"gzrun/ended"}))
    GZ_THROW(Error, "a job with --rdzv-id ", o_.rdzv_id, " already ran to its end in etcd (",
             to_string(s.get("gzrun/ended", Deadline::after(std::chrono::seconds(5)))),
             "): give this job a new --rdzv-id, or remove the old job's keys (etcdctl del --prefix ",
             o_.etcd_prefix(), "/)");
  // A job that never ended (its gzruns were killed) left its round and heartbeats: joining a live
  // job is fine (a heartbeat moves within an interval), meeting a dead one's counters is not.
  const std::string round_text =
      s.check({"gzrun/round"}) ? to_string(s.get("gzrun/round", Deadline::after(std::chrono::seconds(5))))
                               : std::string("0");
  const int round = std::atoi(round_text.c_str());
  const std::string hb = "gzrun/round" + std::to_string(round) + "/hb/";
  std::vector<std::string> keys;
  for (int n = 0; n < std::max(o_.nnodes, o_.max_nodes); ++n) keys.push_back(hb + std::to_string(n));
  auto beats = [&] {
    std::vector<int64_t> v;
    for (const auto& k : keys) v.push_back(s.check({k}) ? s.add(k, 0) : -1);
    return v;
  };
  const std::vector<int64_t> first = beats();
  if (std::all_of(first.begin(), first.end(), [](int64_t b) { return b < 0; })) return;  // nobody beats yet
  const auto interval =
      std::chrono::milliseconds(static_cast<long long>(o_.effective_heartbeat_interval_s() * 1000));
  const Deadline d =
      Deadline::after(std::chrono::milliseconds(static_cast<long long>(o_.heartbeat_timeout_s * 1000)));
  while (!d.expired()) {
    std::this_thread::sleep_for(std::min<Duration>(interval, std::max(d.remaining(), Duration(1))));
    if (beats() != first) return;  // a live job: join it
  }
  GZ_THROW(Error, "a job with --rdzv-id ", o_.rdzv_id, " left its keys in etcd (round ", round,
           ") without ending, and none of its nodes heartbeats any more (killed?): remove them (etcdctl del "
           "--prefix ",
           o_.etcd_prefix(), "/) or give this job a new --rdzv-id");
}

namespace {
std::string this_host() {
  char host[256] = {0};
  return gethostname(host, sizeof host - 1) == 0 && host[0] ? std::string(host) : std::string("127.0.0.1");
}
}  // namespace

std::string StoreHost::meet(int attempt, const Cancelled& cancelled, std::string* master_addr) {
  std::string local_id = launch_id() + "-" + std::to_string(attempt);
  if (attempt == 0) refuse_old_job();
  if (o_.nnodes == 1) return local_id;
  const std::string name = "gzrun/attempt" + std::to_string(attempt);
  Store& s = client();
  if (o_.node_rank == 0) {
    // etcd: nobody hosts a store, so node 0 says where the program's rank 0 runs.
    if (o_.etcd())
      s.set(name + "/master_addr", to_bytes(o_.master_addr_given ? o_.master_addr : this_host()));
    s.set(name + "/run_id", to_bytes(local_id));
  }
  node_barrier(name + "/nodes", o_.nnodes, cancelled);
  if (master_addr && o_.etcd())
    *master_addr = to_string(s.get(name + "/master_addr", Deadline::after(std::chrono::seconds(30))));
  return to_string(s.get(name + "/run_id", Deadline::after(std::chrono::seconds(30))));
}

StoreHost::Finish StoreHost::finish(const RoundInfo& round, const Cancelled& cancelled,
                                    const std::function<bool()>& job_failed) {
  if (o_.nnodes == 1) {
    if (o_.etcd()) {
      try {
        remove_job_keys();
      } catch (const Error& e) {
        say(std::string("warning: while removing the job's keys from etcd: ") + e.what());
      }
    }
    return Finish::done;
  }
  // Per round: a node whose workers succeeded waits here, and takes part in the restart when
  // another node's round fails meanwhile.
  const std::string name = "gzrun/round" + std::to_string(round.round) + "/exit";
  try {
    if (!node_barrier(name, round.nnodes, cancelled, job_failed)) return Finish::job_failed;
  } catch (const Error& e) {
    if (job_failed && job_failed()) return Finish::job_failed;
    say(std::string("error: this node's workers succeeded, but: ") + e.what());
    return Finish::others_did_not_finish;
  }
  // Everyone finished. The host must not stop the server while another node still polls for
  // the release: each node checks out, and the store host waits (briefly) for all check-outs.
  try {
    const int64_t departed = client().add(name + "/departed", 1);
    if (hosts_ && !(cancelled && cancelled())) await_departures(round.round, round.nnodes, 10);
    if (o_.etcd() && departed == round.nnodes) remove_job_keys();
  } catch (const Error& e) {
    // The job is done; a store hiccup while leaving is not worth failing it.
    say(std::string("warning: while leaving the store: ") + e.what());
  }
  return Finish::done;
}

void StoreHost::await_departures(int round, int nnodes, double seconds) {
  const std::string key = "gzrun/round" + std::to_string(round) + "/exit/departed";
  Deadline deadline = Deadline::after(std::chrono::milliseconds(static_cast<long long>(seconds * 1000)));
  while (client().add(key, 0) < nnodes && !deadline.expired()) ::usleep(10000);
}

void StoreHost::remove_job_keys() {
  // etcd keeps a job's keys after it ended (no store dies with it): the last node out removes
  // them, leaving only the end marker, so a node that comes later learns the job is over and a
  // new job that reuses the --rdzv-id is refused (meet()).
  const int64_t n = impl_->etcd->delete_all();
  impl_->etcd->set("gzrun/ended", to_bytes("done|every worker exited 0"));
  say("removed the job's " + std::to_string(n) + " keys from etcd (" + o_.etcd_prefix() + "/)");
}

}  // namespace gz::launcher
