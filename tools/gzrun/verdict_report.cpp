#include "verdict_report.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dump_reader.h"
#include "gz/core/error.h"
#include "gz/store/store.h"
#include "gz/store/tcp_store.h"
#include "job_monitor.h"
#include "launch_auth.h"
#include "output_relay.h"
#include "verdict.h"

namespace gz::launcher {

namespace {

constexpr const char* kStatusReq = "gzrun/status/req";
constexpr const char* kStatusJob = "gzrun/status/job";

std::string kind_name(JobFailure::Kind k) {
  switch (k) {
    case JobFailure::Kind::worker:
      return "worker";
    case JobFailure::Kind::node_lost:
      return "node_lost";
    case JobFailure::Kind::store_lost:
      return "store_lost";
    case JobFailure::Kind::interrupted:
      return "interrupted";
    case JobFailure::Kind::admit:
      return "admit";
    case JobFailure::Kind::none:
      break;
  }
  return "";
}

void make_dirs(const std::string& path) {
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    ::mkdir(path.substr(0, pos).c_str(), 0755);
  }
}

void save(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

}  // namespace

StoreConnect verdict_store_client(const LaunchOptions& o, const std::string& token) {
  const long long ms = std::clamp<long long>(static_cast<long long>(o.heartbeat_timeout_s * 500), 100, 1000);
  return [host = o.master_addr, port = o.store_port(), token, ms,
          name = o.store_name()]() -> std::unique_ptr<Store> {
    TcpStoreOptions so;
    so.token = token;
    so.server_name = name;  // this job's store only (options.h)
    so.timeout = Duration(ms);
    return std::make_unique<TcpStore>(host, port, so);
  };
}

std::string report_key(int round, int node) {
  return "gzrun/round" + std::to_string(round) + "/report/" + std::to_string(node);
}

std::string status_key(int64_t id, int node) {
  return "gzrun/status/" + std::to_string(id) + "/" + std::to_string(node);
}

std::string job_line(const std::string& run_id, int nnodes, int nproc_per_node, const JobFailure* failure,
                     const std::vector<int>& silent) {
  nlohmann::json j = {{"type", "job"},
                      {"job", run_id},
                      {"nnodes", nnodes},
                      {"nproc_per_node", nproc_per_node},
                      {"world", nnodes * nproc_per_node},
                      {"silent_nodes", silent}};
  if (failure && failure->failed()) {
    j["failure"] = failure->text;
    j["failure_kind"] = kind_name(failure->kind);
    j["failure_node"] = failure->node;
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string gather_reports(Store& store, const std::function<std::string(int)>& key, int nnodes,
                           Deadline deadline, std::vector<int>* silent, const std::vector<int>& expect) {
  std::vector<std::string> got(nnodes);
  std::vector<char> have(nnodes, 0), wait(nnodes, expect.empty() ? 1 : 0);
  for (int n : expect)
    if (n >= 0 && n < nnodes) wait[n] = 1;
  for (;;) {
    int missing = 0;
    for (int n = 0; n < nnodes; ++n) {
      if (have[n]) continue;
      try {
        if (store.check({key(n)})) {
          got[n] = to_string(store.get(key(n), Deadline::after(Duration(2000))));
          have[n] = 1;
          continue;
        }
      } catch (const std::exception&) {  // the store is slow or gone: what we have is the answer
      }
      missing += wait[n];
    }
    if (missing == 0 || deadline.expired()) break;
    ::usleep(50000);
  }
  std::string out;
  for (int n = 0; n < nnodes; ++n) {
    if (have[n])
      out += got[n];
    else if (silent)
      silent->push_back(n);
  }
  return out;
}

std::string judge_reports(const std::string& input, double stuck_ms, const std::string& save_dir,
                          const std::string& what) {
  doctor::Picture pic;
  doctor::read_text(pic, input, what);
  doctor::settle(pic);
  doctor::JudgeOptions jo;
  jo.stuck_ms = stuck_ms;
  const std::string text = doctor::render(doctor::judge(pic, jo), pic);
  if (!save_dir.empty()) {
    make_dirs(save_dir);
    save(save_dir + "/" + what + ".jsonl", input);
    save(save_dir + "/" + what + ".txt", text);
  }
  return text;
}

void say_lines(const std::string& text) {
  // One write: node 0 prints a verdict while the next round's lines come (supervisor.cpp).
  std::istringstream in(text);
  std::string block;
  for (std::string line; std::getline(in, line);) block += "gzrun: " + line + "\n";
  write_all(2, block.data(), block.size());
}

int run_analyze(const std::string& dir) {
  doctor::Picture pic;
  doctor::read_dir(pic, dir);
  doctor::settle(pic);
  const std::string text = doctor::render(doctor::judge(pic), pic);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return pic.dumps.empty() && pic.nodes.empty() ? 1 : 0;
}

int run_status_client(const LaunchOptions& o, const std::string& env_token) {
  LaunchOptions as_client = o;
  as_client.nnodes = std::max(2, o.nnodes);  // the store of a multi-node job: MASTER_PORT + 1
  std::string token;
  try {
    token = resolve_launch_auth(as_client, env_token).token;
  } catch (const InvalidArgument& e) {
    say(std::string("error: ") + e.what());
    return 1;
  }
  try {
    TcpStoreOptions so;
    so.token = token;
    so.server_name = o.store_name();  // this job's store only (options.h)
    so.timeout = Duration(static_cast<long long>(o.heartbeat_timeout_s * 1000));
    TcpStore store(o.master_addr, as_client.store_port(), so);
    std::istringstream job(to_string(store.get(kStatusJob, Deadline::after(so.timeout))));
    std::string run_id;
    int nnodes = 0, nproc = 0;
    if (!(job >> run_id >> nnodes >> nproc) || nnodes < 1)
      GZ_THROW(Error, "the job's store has no valid status record (is a gzrun job running there?)");
    const int64_t id = store.add(kStatusReq, 1);
    const double wait_s = o.dump_wait_s + o.verdict_wait_s + 2 * o.effective_heartbeat_interval_s();
    std::vector<int> silent;
    std::string input = gather_reports(
        store, [id](int n) { return status_key(id, n); }, nnodes,
        Deadline::after(Duration(static_cast<long long>(wait_s * 1000))), &silent);
    input += job_line(run_id, nnodes, nproc, nullptr, silent);
    const std::string text = judge_reports(input, o.stuck_s * 1000, "", "status");
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  } catch (const std::exception& e) {
    say(std::string("error: cannot ask the job at ") + o.master_addr + ":" +
        std::to_string(as_client.store_port()) + " for its status: " + e.what());
    return 1;
  }
}

// ---------------------------------------------------------------- StatusWatcher

StatusWatcher::StatusWatcher(const LaunchOptions& o, StoreConnect connect, const WorkerBoard& board,
                             std::string host)
    : o_(o), connect_(std::move(connect)), board_(board), host_(std::move(host)) {
  thread_ = std::thread([this] { loop(); });
}

StatusWatcher::~StatusWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StatusWatcher::ask_job() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    asked_ = true;
  }
  cv_.notify_all();
}

void StatusWatcher::answer(Store& s, int64_t id) {
  const WorkerBoard::Snapshot b = board_.snapshot();
  const Duration wait(static_cast<long long>(o_.dump_wait_s * 1000));
  s.set(status_key(id, b.node), to_bytes(collect_node_report(b, host_, id, wait)));
}

void StatusWatcher::ask(Store& s) {
  const WorkerBoard::Snapshot b = board_.snapshot();
  const int64_t id = s.add(kStatusReq, 1);
  answer(s, id);
  const double wait_s = o_.dump_wait_s + o_.verdict_wait_s + 2 * o_.effective_heartbeat_interval_s();
  std::vector<int> silent;
  std::string input = gather_reports(
      s, [id](int n) { return status_key(id, n); }, b.nnodes,
      Deadline::after(Duration(static_cast<long long>(wait_s * 1000))), &silent);
  input += job_line(b.run_id, b.nnodes, o_.nproc_per_node, nullptr, silent);
  say("status of the job (asked by SIGUSR1):");
  say_lines(judge_reports(input, o_.stuck_s * 1000, b.dump_dir, "status-" + std::to_string(id)));
}

void StatusWatcher::loop() {
  std::unique_ptr<Store> store;
  int64_t seen = -1;
  const Duration interval(
      std::max<long long>(50, static_cast<long long>(o_.effective_heartbeat_interval_s() * 1000)));
  for (;;) {
    bool ask_now;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, interval, [&] { return stop_ || asked_; });
      if (stop_) return;
      ask_now = asked_;
      asked_ = false;
    }
    try {
      if (!store) store = connect_();
      const WorkerBoard::Snapshot b = board_.snapshot();
      if (b.run_id.empty()) continue;  // no round yet
      const std::string job =
          b.run_id + " " + std::to_string(b.nnodes) + " " + std::to_string(o_.nproc_per_node);
      if (b.node == 0 && job != published_job_) {
        store->set(kStatusJob, to_bytes(job));
        published_job_ = job;
      }
      const int64_t now = store->add(kStatusReq, 0);
      if (seen < 0) seen = now;  // requests from before this gzrun started are not ours to answer
      if (now > seen) {
        answer(*store, now);
        seen = now;
      }
      if (ask_now) {
        ask(*store);
        seen = store->add(kStatusReq, 0);
      }
    } catch (const std::exception& e) {
      store.reset();  // reconnect next time; the job monitor decides whether the store is lost
      if (ask_now) say(std::string("status: cannot reach the store: ") + e.what());
    }
  }
}

}  // namespace gz::launcher
