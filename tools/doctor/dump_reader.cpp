// Reading dumps (dump_reader.h). nlohmann::json parses each line; every way a line or a file can
// be wrong ends as a note, never as an exception out of here.
#include "dump_reader.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace gz::doctor {

using nlohmann::json;

namespace {

template <typename T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

OpRec parse_op(const json& j) {
  OpRec o;
  auto seq = j.find("seq");
  o.queued = seq == j.end() || seq->is_null();
  if (!o.queued) o.seq = seq->get<uint64_t>();
  o.coll = get_or<uint64_t>(j, "coll", o.seq);
  o.op = get_or<std::string>(j, "op", "?");
  o.dtype = get_or<std::string>(j, "dtype", "");
  o.reduce = get_or<std::string>(j, "reduce", "");
  o.state = get_or<std::string>(j, "state", "?");
  o.count = get_or<uint64_t>(j, "count", 0);
  o.root = get_or<int>(j, "root", -1);
  o.peer = get_or<int>(j, "peer", -1);
  o.tag = get_or<int>(j, "tag", 0);
  o.age_ms = get_or<double>(j, "age_ms", NAN);
  o.dur_ms = get_or<double>(j, "dur_ms", NAN);
  o.phase = get_or<std::string>(j, "phase", "");
  o.step = get_or<int64_t>(j, "step", -1);
  o.waiting_for = get_or<int>(j, "waiting_for", -1);
  if (auto it = j.find("late_us"); it != j.end() && it->is_array())
    for (const json& v : *it) o.late_us.push_back(v.is_number() ? v.get<double>() : NAN);
  o.error = get_or<std::string>(j, "error", "");
  o.error_kind = get_or<std::string>(j, "error_kind", "");
  o.error_peer = get_or<int>(j, "error_peer", -1);
  return o;
}

CommDump parse_comm(const json& j) {
  CommDump c;
  c.id = j.at("id").get<uint64_t>();
  c.name = get_or<std::string>(j, "name", "");
  c.backend = get_or<std::string>(j, "backend", "");
  c.rank = get_or<int>(j, "rank", 0);
  c.size = get_or<int>(j, "size", 1);
  if (auto it = j.find("ranks"); it != j.end() && it->is_array()) c.ranks = it->get<std::vector<int>>();
  c.parent = get_or<uint64_t>(j, "parent", 0);
  c.next_seq = get_or<uint64_t>(j, "next_seq", 0);
  c.retired = get_or<bool>(j, "retired", false);
  return c;
}

void parse_header(const json& j, RankDump& d) {
  d.version = get_or<int>(j, "version", 0);
  d.job = get_or<std::string>(j, "job", "");
  d.rank = get_or<int>(j, "rank", -1);
  d.world = get_or<int>(j, "world", -1);
  d.local_rank = get_or<int>(j, "local_rank", -1);
  d.node = get_or<int>(j, "node", -1);
  d.pid = get_or<int>(j, "pid", -1);
  d.host = get_or<std::string>(j, "host", "");
  d.reason = get_or<std::string>(j, "reason", "");
  d.note = get_or<std::string>(j, "note", "");
  d.request = get_or<int64_t>(j, "request", 0);
  d.time_unix_ms = get_or<long long>(j, "time_unix_ms", 0);
  if (auto it = j.find("phase"); it != j.end() && it->is_object()) {
    d.phase = get_or<std::string>(*it, "name", "");
    d.step = get_or<int64_t>(*it, "step", -1);
    d.phase_for_ms = get_or<double>(*it, "for_ms", NAN);
  }
}

NodeFacts parse_node(const json& j) {
  NodeFacts n;
  n.node = get_or<int>(j, "node", -1);
  n.host = get_or<std::string>(j, "host", "");
  n.job = get_or<std::string>(j, "job", "");
  n.request = get_or<int64_t>(j, "request", 0);
  if (auto it = j.find("ranks"); it != j.end() && it->is_array())
    for (const json& r : *it) {
      RankFacts f;
      f.rank = get_or<int>(r, "rank", -1);
      f.local_rank = get_or<int>(r, "local_rank", -1);
      f.pid = get_or<int>(r, "pid", -1);
      f.state = get_or<std::string>(r, "state", "unknown");
      f.status = get_or<std::string>(r, "status", "");
      f.first_failure = get_or<bool>(r, "first_failure", false);
      f.stopped_by_gzrun = get_or<bool>(r, "stopped_by_gzrun", false);
      f.answered = get_or<bool>(r, "answered", false);
      n.ranks.push_back(f);
    }
  return n;
}

JobFacts parse_job(const json& j) {
  JobFacts f;
  f.job = get_or<std::string>(j, "job", "");
  f.world = get_or<int>(j, "world", -1);
  f.nnodes = get_or<int>(j, "nnodes", -1);
  f.nproc_per_node = get_or<int>(j, "nproc_per_node", -1);
  f.failure = get_or<std::string>(j, "failure", "");
  f.failure_kind = get_or<std::string>(j, "failure_kind", "");
  f.failure_node = get_or<int>(j, "failure_node", -1);
  if (auto it = j.find("silent_nodes"); it != j.end() && it->is_array())
    f.silent_nodes = it->get<std::vector<int>>();
  return f;
}

// Reads one file line by line; a dump runs from its header to its end line.
class FileReader {
 public:
  FileReader(Picture& pic, std::string source) : pic_(pic), source_(std::move(source)) {}

  void line(const std::string& text, size_t number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) return;
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception&) {
      note("line " + std::to_string(number) + " is not JSON (corrupt or cut off); skipped");
      return;
    }
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
      note("line " + std::to_string(number) + " has no \"type\"; skipped");
      return;
    }
    try {
      dispatch(j, number);
    } catch (const json::exception& e) {
      note("line " + std::to_string(number) + " has a field of the wrong kind (" + e.what() + "); skipped");
    }
  }

  void end_of_file(size_t lines) {
    if (cur_) close_dump(false, lines);
    if (lines == 0) note("is empty");
  }

 private:
  void dispatch(const json& j, size_t number) {
    const std::string type = j["type"].get<std::string>();
    if (type == "header") return open_dump(j, number);
    if (type == "gzrun") return pic_.nodes.push_back(parse_node(j));
    if (type == "job") {
      pic_.job = parse_job(j);
      pic_.have_job = true;
      return;
    }
    if (skipping_) return;
    if (!cur_) {
      note("line " + std::to_string(number) + ": a \"" + type +
           "\" line outside a dump (no header before it); skipped");
      return;
    }
    if (type == "comm") {
      cur_->comms.push_back(parse_comm(j));
      comm_index_[cur_->comms.back().id] = cur_->comms.size() - 1;
    } else if (type == "op") {
      auto it = comm_index_.find(get_or<uint64_t>(j, "comm", 0));
      if (it == comm_index_.end()) {
        note("line " + std::to_string(number) + ": an op of an unknown communicator; skipped");
        return;
      }
      cur_->comms[it->second].ops.push_back(parse_op(j));
    } else if (type == "end") {
      close_dump(true, number);
    }  // other types: from a newer writer, ignored
  }

  void open_dump(const json& j, size_t number) {
    if (cur_) close_dump(false, number - 1);
    const std::string schema = get_or<std::string>(j, "schema", "");
    const int version = get_or<int>(j, "version", 0);
    skipping_ = true;
    if (schema != kSchema) {
      note("line " + std::to_string(number) + ": not a flight-recorder dump (schema \"" + schema +
           "\"); skipped");
      return;
    }
    if (version != kVersion) {
      note("line " + std::to_string(number) + ": dump format version " + std::to_string(version) +
           ", this reader knows version " + std::to_string(kVersion) + " (written by a " +
           (version > kVersion ? "newer" : "older") + " Guozhuang); skipped");
      return;
    }
    skipping_ = false;
    cur_ = std::make_unique<RankDump>();
    parse_header(j, *cur_);
    cur_->source = source_ + (number > 1 ? ":" + std::to_string(number) : "");
    comm_index_.clear();
  }

  void close_dump(bool complete, size_t last_line) {
    skipping_ = false;
    if (!cur_) return;
    cur_->complete = complete;
    if (!complete)
      note("the dump of rank " + std::to_string(cur_->rank) + " was cut short after line " +
           std::to_string(last_line) + " (no end line); using the " + std::to_string(count_ops()) +
           " op(s) read");
    pic_.dumps.push_back(std::move(*cur_));
    cur_.reset();
  }

  size_t count_ops() const {
    size_t n = 0;
    for (const auto& c : cur_->comms) n += c.ops.size();
    return n;
  }

  void note(const std::string& what) { pic_.notes.push_back(source_ + ": " + what); }

  Picture& pic_;
  std::string source_;
  std::unique_ptr<RankDump> cur_;
  std::map<uint64_t, size_t> comm_index_;
  bool skipping_ = false;
};

}  // namespace

void read_text(Picture& pic, const std::string& text, const std::string& source) {
  FileReader r(pic, source);
  std::istringstream in(text);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) r.line(line, ++n);
  r.end_of_file(n);
}

void read_dir(Picture& pic, const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) {
    pic.notes.push_back(dir + ": cannot open the directory");
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 6 && n.compare(n.size() - 6, 6, ".jsonl") == 0) names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  if (names.empty()) pic.notes.push_back(dir + ": no *.jsonl dump in it");
  for (const std::string& n : names) {
    std::ifstream f(dir + "/" + n, std::ios::binary);
    if (!f) {
      pic.notes.push_back(dir + "/" + n + ": cannot be read");
      continue;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    read_text(pic, ss.str(), n);
  }
}

int global_rank(const RankDump& d, const CommDump& c) {
  if (!c.ranks.empty()) return c.global(c.rank);
  if (c.parent == 0 && d.world > 0 && c.size == d.world) return c.rank;
  return -1;
}

void settle(Picture& pic) {
  // One job: the job line's, else the one most dumps name.
  std::string job = pic.have_job ? pic.job.job : "";
  if (job.empty()) {
    std::map<std::string, int> votes;
    for (const auto& d : pic.dumps) ++votes[d.job];
    int best = 0;
    for (const auto& [j, n] : votes)
      if (n > best) job = j, best = n;
  }
  std::vector<RankDump> kept;
  std::map<int, size_t> by_rank;
  for (auto& d : pic.dumps) {
    if (d.job != job) {
      pic.notes.push_back(d.source + ": a dump of job \"" + d.job + "\", not of this job (\"" + job +
                          "\"); ignored");
      continue;
    }
    auto it = by_rank.find(d.rank);
    if (d.rank >= 0 && it != by_rank.end()) {  // the later dump of a rank wins
      if (d.time_unix_ms >= kept[it->second].time_unix_ms) kept[it->second] = std::move(d);
      continue;
    }
    if (d.rank >= 0) by_rank[d.rank] = kept.size();
    kept.push_back(std::move(d));
  }
  pic.dumps = std::move(kept);
  for (auto it = pic.nodes.begin(); it != pic.nodes.end();)
    if (!job.empty() && !it->job.empty() && it->job != job) {
      pic.notes.push_back("node " + std::to_string(it->node) + ": a report of job \"" + it->job +
                          "\"; ignored");
      it = pic.nodes.erase(it);
    } else {
      ++it;
    }
  if (!pic.have_job) pic.job.job = job;
  int world = pic.job.world;
  for (const auto& d : pic.dumps) world = std::max(world, d.world);
  if (world > 0 && pic.job.world < 0) pic.job.world = world;
  for (int r = 0; r < world; ++r) {
    if (by_rank.count(r)) continue;
    std::string where;
    for (const auto& n : pic.nodes)
      for (const auto& f : n.ranks)
        if (f.rank == r)
          where = " (node " + std::to_string(n.node) + ", " + f.state +
                  (f.status.empty() ? "" : ", " + f.status) + ")";
    pic.notes.push_back("no dump from rank " + std::to_string(r) + where +
                        ": judged from the others' records");
  }
}

}  // namespace gz::doctor
