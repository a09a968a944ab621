#include "dump_collector.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "process.h"

namespace gz::launcher {

std::string dump_dir_for(const LaunchOptions& o, const std::string& run_id) {
  std::string id = run_id;
  for (char& c : id)
    if (c == '/') c = '_';
  return (o.log_dir.empty() ? std::string("/tmp/gz-dumps") : o.log_dir + "/dumps") + "/" + id;
}

void WorkerBoard::start_round(const std::string& run_id, const std::string& dump_dir, int node, int nnodes,
                              int round) {
  std::lock_guard<std::mutex> lock(mu_);
  s_ = Snapshot{run_id, dump_dir, node, nnodes, round, {}};
}

void WorkerBoard::add(const WorkerView& w) {
  std::lock_guard<std::mutex> lock(mu_);
  // One entry per rank: a report names each rank once and reads its dump file once.
  for (auto& e : s_.workers)
    if (e.rank == w.rank) {
      e = w;
      return;
    }
  s_.workers.push_back(w);
}

void WorkerBoard::ended(pid_t pid, int status, bool first_failure, bool stopped_by_gzrun) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : s_.workers)
    if (w.pid == pid && w.alive) {
      w.alive = false;
      w.status = status;
      w.first_failure = first_failure;
      w.stopped_by_gzrun = stopped_by_gzrun;
    }
}

WorkerBoard::Snapshot WorkerBoard::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The request number in a dump's header line (-1: no dump or no header); *failure: the dump was
// written because an op failed.
int64_t dump_request(const std::string& path, bool* failure = nullptr) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return -1;
  if (failure) *failure = line.find("\"reason\":\"failure\"") != std::string::npos;
  const auto at = line.find("\"request\":");
  if (at == std::string::npos) return -1;
  return std::atoll(line.c_str() + at + 10);
}

// The pid in a worker's ready file, when that process is the worker or in its process group.
pid_t ready_pid(const std::string& dir, const WorkerView& w) {
  const std::string text = read_file(dir + "/rank-" + std::to_string(w.rank) + ".ready");
  const pid_t p = static_cast<pid_t>(std::atol(text.c_str()));
  if (p <= 0) return -1;
  return p == w.pid || getpgid(p) == w.pid ? p : -1;
}

struct Asked {
  const WorkerView* w;
  std::string state;
  bool signalled = false, answered = false;
};

}  // namespace

std::string process_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= stat.size()) return "gone";
  switch (stat[close + 2]) {
    case 'T':
    case 't':
      return "stopped";
    case 'Z':
    case 'X':
      return "exited";
    default:
      return "running";
  }
}

std::string bound_dump(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  auto is_done_op = [](const std::string& l) {
    return l.rfind("{\"type\":\"op\"", 0) == 0 && l.find("\"state\":\"done\"") != std::string::npos;
  };
  // Keep the newest done ops: walk back from the end until the budget is spent.
  size_t fixed = 0, done_total = 0;
  for (const auto& l : lines) {
    if (is_done_op(l))
      ++done_total;
    else
      fixed += l.size() + 1;
  }
  std::vector<char> keep(lines.size(), 1);
  size_t budget = max_bytes > fixed + 200 ? max_bytes - fixed - 200 : 0, dropped = 0;
  for (size_t i = lines.size(); i-- > 0;) {
    if (!is_done_op(lines[i])) continue;
    if (lines[i].size() + 1 <= budget) {
      budget -= lines[i].size() + 1;
    } else {
      keep[i] = 0;
      budget = 0;
      ++dropped;
    }
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!keep[i]) continue;
    if (i + 1 == lines.size() && dropped)  // before the end line
      out += "{\"type\":\"note\",\"text\":\"gzrun kept the newest " + std::to_string(done_total - dropped) +
             " of " + std::to_string(done_total) + " completed ops (size bound)\"}\n";
    out += lines[i] + "\n";
  }
  return out;
}

std::string collect_node_report(const WorkerBoard::Snapshot& board, const std::string& host, int64_t request,
                                Duration wait, size_t max_rank_bytes) {
  std::vector<Asked> asked;
  for (const auto& w : board.workers) {
    Asked a{&w, w.alive ? process_state(w.pid) : (WIFSIGNALED(w.status) ? "killed" : "exited")};
    if (a.state == "running") {
      const pid_t p = ready_pid(board.dump_dir, w);
      union sigval v;
      v.sival_int = static_cast<int>(request);
      a.signalled = p > 0 && sigqueue(p, SIGUSR1, v) == 0;
    }
    asked.push_back(a);
  }
  const Deadline deadline = Deadline::after(wait);
  for (;;) {
    bool all = true;
    for (auto& a : asked) {
      if (a.signalled && !a.answered)
        a.answered =
            dump_request(board.dump_dir + "/rank-" + std::to_string(a.w->rank) + ".jsonl") >= request;
      all = all && (!a.signalled || a.answered);
    }
    if (all || deadline.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  nlohmann::json node = {{"type", "gzrun"},     {"node", board.node},   {"host", host},
                         {"job", board.run_id}, {"round", board.round}, {"request", request}};
  nlohmann::json ranks = nlohmann::json::array();
  std::string dumps;
  for (const auto& a : asked) {
    ranks.push_back({{"rank", a.w->rank},
                     {"local_rank", a.w->local_rank},
                     {"pid", a.w->pid},
                     {"state", a.state},
                     {"status", a.w->alive ? "" : describe_status(a.w->status)},
                     {"first_failure", a.w->first_failure},
                     {"stopped_by_gzrun", a.w->stopped_by_gzrun},
                     {"replacement", a.w->replacement},
                     {"answered", a.answered}});
    // A live worker's dump from an earlier request (it is stopped now, say) would show a past
    // state as the present: only fresh dumps, a failure's dump and a dead worker's last one.
    const std::string path = board.dump_dir + "/rank-" + std::to_string(a.w->rank) + ".jsonl";
    bool failure = false;
    dump_request(path, &failure);
    if (!a.answered && a.w->alive && !failure) continue;
    const std::string text = read_file(path);
    if (!text.empty()) dumps += bound_dump(text, max_rank_bytes);
  }
  node["ranks"] = ranks;
  return node.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n" + dumps;
}

}  // namespace gz::launcher
