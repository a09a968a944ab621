// The Store operations as etcd requests (store/etcd/etcd_client.* does the talking).
//
// Layout under the prefix P:
//   P/k/<key>             the key's value (its existence is the key's existence)
//   P/c/<hex key>/<id>    a change add/append could not apply to P/k/<key> in place because
//                         another client changed it first: "c<delta>" or "a<bytes>". The value is
//                         P/k/<key> with its changes applied in revision order. This makes add and
//                         append one transaction each whatever the contention (a compare-and-swap
//                         loop costs N rounds for the last of N concurrent clients); set, delete
//                         and compare_set remove them, and they are folded in from 32 on
//   P/op/<client>/<seq>   one record per add/append, written in its transaction: a retry after an
//                         ambiguous failure (the member died after receiving the request) finds
//                         it and reads the result at that revision instead of applying the change
//                         twice. Every 1024th operation removes the client's records older than
//                         1024 operations (retries are over long before); the client removes the
//                         rest when it goes, the job's end removes all.
#include "gz/store/etcd_store.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "gz/core/error.h"
#include "store/etcd/etcd_client.h"
#include "store/store_state.h"  // parse_counter()
#include "store/tcp_common.h"   // printable()

namespace gz {

using etcd::b64_decode;
using etcd::b64_encode;
using etcd::field_i64;
using etcd::json;

namespace {

constexpr size_t kMaxTxnOps = 64;  // etcd's --max-txn-ops defaults to 128
constexpr size_t kMaxCachedCounters = 4096;
constexpr size_t kFoldAt = 32;        // change records folded into the value from this many on
constexpr uint64_t kOpWindow = 1024;  // op records kept per client (see the layout above)

std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 16; ++i) out += (i ? ", " : "") + wire::printable(keys[i]);
  if (keys.size() > 16) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out;
}

/// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string random_id() {
  uint8_t raw[8] = {};
  if (getrandom(raw, sizeof raw, 0) != sizeof raw) {
    const auto t = Clock::now().time_since_epoch().count();
    std::memcpy(raw, &t, sizeof raw);
  }
  static const char* hex = "0123456789abcdef";
  std::string out = std::to_string(::getpid()) + "-";
  for (uint8_t b : raw) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

json range_op(const std::string& key, bool count_only = false) {
  json r = {{"key", b64_encode(key)}};
  if (count_only) r["count_only"] = true;
  return {{"request_range", r}};
}

json put_op(const std::string& key, const std::string& value) {
  return {{"request_put", {{"key", b64_encode(key)}, {"value", b64_encode(value)}}}};
}

/// The first kv of a range response, if any.
const json* first_kv(const json& range) {
  if (!range.contains("kvs") || !range["kvs"].is_array() || range["kvs"].empty()) return nullptr;
  return &range["kvs"][0];
}

const json& txn_response(const json& txn, size_t i, const char* kind) {
  static const json empty = json::object();
  if (!txn.contains("responses") || txn["responses"].size() <= i) return empty;
  const json& r = txn["responses"][i];
  return r.contains(kind) ? r[kind] : empty;
}

}  // namespace

namespace {

/// A key's value: P/k/<key> with its pending changes applied in revision order.
struct Folded {
  bool exists = false;
  std::string value;
  int64_t base_mod = 0;       // mod_revision of P/k/<key>
  size_t changes = 0;         // P/c/... records seen
  bool mine_refused = false;  // the change `mine` was an add to a value that is no integer
};

Folded fold(const json& base_range, const json& change_range, const std::string& mine = {}) {
  Folded f;
  if (const json* kv = first_kv(base_range)) {
    f.exists = true;
    f.value = b64_decode(kv->value("value", std::string()));
    f.base_mod = field_i64(*kv, "mod_revision");
  }
  std::vector<std::pair<int64_t, const json*>> changes;
  if (change_range.contains("kvs"))
    for (const json& kv : change_range["kvs"]) changes.emplace_back(field_i64(kv, "create_revision"), &kv);
  std::sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  f.changes = changes.size();
  for (const auto& [rev, kv] : changes) {
    const std::string c = b64_decode(kv->value("value", std::string()));
    if (c.empty()) continue;
    if (c[0] == 'a') {
      f.value.append(c, 1, std::string::npos);
      continue;
    }
    // An add: refused (no effect) when the value is no integer or the sum would overflow, as the
    // other stores refuse it.
    int64_t cur = 0, delta = 0, sum = 0;
    if (!wire::parse_counter(f.value, cur) || !wire::parse_counter(c.substr(1), delta) ||
        __builtin_add_overflow(cur, delta, &sum)) {
      if (!mine.empty() && b64_decode(kv->value("key", std::string())) == mine) f.mine_refused = true;
      continue;
    }
    f.value = std::to_string(sum);
  }
  return f;
}

json cmp_create0(const std::string& key, const std::string& end = {}) {
  json c = {{"target", "CREATE"}, {"key", b64_encode(key)}, {"create_revision", "0"}};
  if (!end.empty()) c["range_end"] = b64_encode(end);
  return c;
}

json range_of(const std::string& key, const std::string& end, int64_t revision = 0) {
  json r = {{"key", b64_encode(key)}, {"range_end", b64_encode(end)}};
  if (revision) r["revision"] = std::to_string(revision);
  return {{"request_range", r}};
}

std::string hex_of(const std::string& raw) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

}  // namespace

struct EtcdStore::Impl {
  EtcdStoreOptions o;
  std::unique_ptr<etcd::Client> client;
  std::string data;     // "P/k/"
  std::string changes;  // "P/c/"
  std::string client_id;
  std::string ops;  // "P/op/<client>/"
  std::mutex mu;
  uint64_t op_seq = 0;
  struct Counter {
    int64_t mod_revision;
    int64_t value;
  };
  std::unordered_map<std::string, Counter> counters;  // add()'s guess of a key it changes in place

  std::string full(const std::string& key) const { return data + key; }
  /// The record of operation `seq`: fixed width, so that a range covers the older ones.
  std::string op_key(uint64_t seq) const {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(seq));
    return ops + buf;
  }
  std::string change_prefix(const std::string& key) const { return changes + hex_of(key) + "/"; }
  Deadline op_deadline(const Store& s) const { return Deadline::after(s.timeout()); }

  /// The key's value now (one read-only transaction), or at `revision`.
  Folded read(const std::string& key, Deadline deadline, const std::string& what, int64_t revision = 0,
              const std::string& mine = {}, size_t* member = nullptr, int64_t* at = nullptr) {
    const std::string cp = change_prefix(key);
    json base = range_of(full(key), "", revision);
    base["request_range"].erase("range_end");
    json r =
        client->call("/v3/kv/txn", {{"success", json::array({base, range_of(cp, prefix_end(cp), revision)})}},
                     deadline, what, member);
    if (at) *at = field_i64(r["header"], "revision");
    Folded f = fold(txn_response(r, 0, "response_range"), txn_response(r, 1, "response_range"), mine);
    if (!revision && f.changes >= kFoldAt) compact(key, f, field_i64(r["header"], "revision"), deadline);
    return f;
  }

  /// Whether each key exists (one transaction per kMaxTxnOps keys); `revision` gets the first
  /// answer's revision (watch from after it).
  std::vector<bool> exist(const std::vector<std::string>& keys, Deadline deadline, const std::string& what,
                          int64_t* revision, size_t* member) {
    std::vector<bool> out;
    for (size_t b = 0; b < keys.size(); b += kMaxTxnOps) {
      json ops = json::array();
      for (size_t i = b; i < std::min(keys.size(), b + kMaxTxnOps); ++i)
        ops.push_back(range_op(full(keys[i]), true));
      json r = client->call("/v3/kv/txn", {{"success", ops}}, deadline, what, member);
      if (b == 0 && revision) *revision = field_i64(r["header"], "revision");
      for (size_t i = 0; i < ops.size(); ++i)
        out.push_back(field_i64(txn_response(r, i, "response_range"), "count") > 0);
    }
    return out;
  }

  /// add ('c', `delta`) or append ('a', `bytes`), once, in one transaction: in place when this
  /// client's guess of the value holds (a counter only it changes), else as a change record.
  /// Returns the folded value after this change.
  Folded update(const std::string& key, char kind, int64_t delta, const std::string& bytes, Deadline deadline,
                const std::string& what) {
    const std::string b = full(key), cp = change_prefix(key);
    uint64_t seq;
    bool have = false;
    Counter guess{0, 0};
    {
      std::lock_guard<std::mutex> lock(mu);
      seq = ++op_seq;
      auto it = counters.find(b);
      if (kind == 'c' && it != counters.end()) {
        guess = it->second;
        have = true;
      }
    }
    const std::string mine = cp + client_id + "-" + std::to_string(seq);
    const std::string op = op_key(seq);
    const std::string init = kind == 'c' ? std::to_string(delta) : bytes;
    const std::string change = std::string(1, kind) + (kind == 'c' ? std::to_string(delta) : bytes);
    std::string in_place = init;
    if (have && __builtin_add_overflow(guess.value, delta, &guess.value))
      GZ_THROW(InvalidArgument, "store add: counter '", wire::printable(key), "' would overflow");
    if (have) in_place = std::to_string(guess.value);
    json records = json::array({{{"request_put", {{"key", b64_encode(op)}}}}});
    if (seq % kOpWindow == 0 && seq > kOpWindow)
      records.push_back(
          {{"request_delete_range",
            {{"key", b64_encode(op_key(0))}, {"range_end", b64_encode(op_key(seq - kOpWindow))}}}});
    json here = have ? json{{"target", "MOD"},
                            {"key", b64_encode(b)},
                            {"mod_revision", std::to_string(guess.mod_revision)}}
                     : cmp_create0(b);
    // In place when the guess holds and no change records wait; else create the key, or record
    // the change.
    json apply = {{"compare", json::array({here, cmp_create0(cp, prefix_end(cp))})},
                  {"success", json::array({put_op(b, in_place)})},
                  {"failure", json::array({{{"request_txn",
                                             {{"compare", json::array({cmp_create0(b)})},
                                              {"success", json::array({put_op(b, init)})},
                                              {"failure", json::array({put_op(mine, change)})}}}}})}};
    json success = json::array({{{"request_txn", apply}}, range_op(b), range_of(cp, prefix_end(cp))});
    for (auto& r : records) success.push_back(r);
    json body = {{"compare", json::array({cmp_create0(op)})},
                 {"success", success},
                 {"failure", json::array({range_op(op)})}};
    json r = client->call("/v3/kv/txn", body, deadline, what);
    if (!r.value("succeeded", false)) {
      // An earlier try was applied and its answer lost: the value right after it.
      const json* rec = first_kv(txn_response(r, 0, "response_range"));
      const int64_t at = rec ? field_i64(*rec, "mod_revision") : 0;
      if (!at) throw etcd::ServerError("etcd " + what + ": its record vanished", 0, false);
      return read(key, deadline, what, at, mine);
    }
    Folded f = fold(txn_response(r, 1, "response_range"), txn_response(r, 2, "response_range"), mine);
    if (kind == 'c') remember(b, f);
    // One change in 8 tries (under steady contention most tries find new records and fail); a
    // read tries every time (by then the contention is usually over).
    if (f.changes >= kFoldAt && f.changes % 8 == 0)
      compact(key, f, field_i64(r["header"], "revision"), deadline);
    return f;
  }

  void remember(const std::string& b, const Folded& f) {
    int64_t v = 0;
    std::lock_guard<std::mutex> lock(mu);
    if (counters.size() >= kMaxCachedCounters) counters.clear();
    if (f.exists && f.changes == 0 && wire::parse_counter(f.value, v))
      counters[b] = Counter{f.base_mod, v};
    else
      counters.erase(b);
  }

  /// Fold the change records into the value (best effort: whoever is first; nothing happens when
  /// the key changed since revision `at`).
  void compact(const std::string& key, const Folded& f, int64_t at, Deadline deadline) {
    const std::string cp = change_prefix(key);
    json unchanged = {{"target", "MOD"},
                      {"key", b64_encode(cp)},
                      {"range_end", b64_encode(prefix_end(cp))},
                      {"result", "LESS"},
                      {"mod_revision", std::to_string(at + 1)}};
    json same_base = {
        {"target", "MOD"}, {"key", b64_encode(full(key))}, {"mod_revision", std::to_string(f.base_mod)}};
    json del = {
        {"request_delete_range", {{"key", b64_encode(cp)}, {"range_end", b64_encode(prefix_end(cp))}}}};
    try {
      client->call("/v3/kv/txn",
                   {{"compare", json::array({same_base, unchanged})},
                    {"success", json::array({put_op(full(key), f.value), del})}},
                   deadline, "fold of '" + wire::printable(key) + "'");
    } catch (const Error&) {
      // Another time.
    }
  }

  json delete_changes(const std::string& key) const {
    const std::string cp = change_prefix(key);
    return {{"request_delete_range", {{"key", b64_encode(cp)}, {"range_end", b64_encode(prefix_end(cp))}}}};
  }
};

namespace {
/// Run one operation, turning a JSON answer of an unexpected shape (a member of another version,
/// or something else on the port) into gz::PeerError instead of nlohmann's exceptions.
template <class F>
auto guarded(const etcd::Client* client, const char* op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const json::exception& e) {
    GZ_THROW(PeerError, "etcd store ", op, ": an answer of unexpected shape from ",
             client ? client->endpoint_now() : std::string("etcd"), " (", e.what(), ")");
  }
}
}  // namespace

EtcdStore::EtcdStore(const EtcdStoreOptions& options) : impl_(std::make_unique<Impl>()) {
  check_etcd_options(options);
  impl_->o = options;
  impl_->client = std::make_unique<etcd::Client>(options);
  impl_->data = options.prefix + "/k/";
  impl_->changes = options.prefix + "/c/";
  impl_->client_id = random_id();
  impl_->ops = options.prefix + "/op/" + impl_->client_id + "/";
  timeout_ = options.timeout;
  guarded(impl_->client.get(), "first contact",
          [&] { impl_->client->connect(Deadline::after(options.timeout)); });
}

EtcdStore::~EtcdStore() {
  // Best effort: this client's op records are of no use to anyone any more.
  try {
    if (impl_->op_seq > 0)
      impl_->client->call(
          "/v3/kv/deleterange",
          {{"key", b64_encode(impl_->ops)}, {"range_end", b64_encode(prefix_end(impl_->ops))}},
          Deadline::after(Duration(500)), "delete of the client's records");
  } catch (const std::exception&) {
  }
}

uint64_t EtcdStore::requests_sent() { return etcd::Client::requests.load(); }

std::string EtcdStore::endpoint() const { return impl_->client->endpoint_now(); }

void EtcdStore::set(const std::string& key, const Bytes& value) {
  return guarded(impl_->client.get(), "set", [&]() -> void {
    const std::string k = impl_->full(key);
    impl_->client->call("/v3/kv/txn",
                        {{"success", json::array({put_op(k, to_string(value)), impl_->delete_changes(key)})}},
                        impl_->op_deadline(*this), "set '" + wire::printable(key) + "'");
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->counters.erase(k);
  });
}

Bytes EtcdStore::get(const std::string& key, Deadline deadline) {
  return guarded(impl_->client.get(), "get", [&]() -> Bytes {
    const std::string k = impl_->full(key);
    const std::string what = "get '" + wire::printable(key) + "'";
    Stopwatch sw;
    std::unique_ptr<etcd::Watch> w;
    for (;;) {
      // Read (which also checks that the member answers and has a leader), then watch from there.
      size_t member = 0;
      int64_t at = 0;
      Folded f;
      try {
        f = impl_->read(key, deadline, what, 0, {}, &member, &at);
      } catch (const TimeoutError& e) {
        GZ_THROW(TimeoutError, "store get: key '", wire::printable(key), "' not set within ",
                 format_duration(sw.elapsed()), " (", e.what(), ")");
      }
      if (f.exists) return to_bytes(f.value);
      const Deadline slice = std::min(deadline, Deadline::after(impl_->o.watch_check_interval),
                                      [](const Deadline& a, const Deadline& b) { return a.at() < b.at(); });
      try {
        if (!w || w->member() != member) w = impl_->client->watch({k}, at + 1, slice, what);
        etcd::WatchEvent ev;
        while (w->next(ev, slice)) {
          // Just created: that is its whole value. Otherwise read it (change records may apply).
          if (ev.key == k && ev.created) return to_bytes(ev.value);
          if (ev.key == k && !ev.deleted) break;
        }
      } catch (const etcd::TransportError&) {
        w.reset();  // the next read moves to another member
      } catch (const etcd::ServerError& e) {
        if (!e.retry()) throw Error(e.what());  // e.g. permission denied on the watched key
        w.reset();
      } catch (const TimeoutError&) {
        w.reset();
      }
      if (deadline.expired())
        GZ_THROW(TimeoutError, "store get: key '", wire::printable(key), "' not set within ",
                 format_duration(sw.elapsed()), " (etcd, ", endpoint(), ")");
    }
  });
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  return guarded(impl_->client.get(), "add", [&]() -> int64_t {
    const std::string what = "add to '" + wire::printable(key) + "'";
    const Deadline deadline = impl_->op_deadline(*this);
    auto integer = [&](const Folded& f) {
      int64_t v = 0;
      if (f.mine_refused || !wire::parse_counter(f.value, v))
        GZ_THROW(InvalidArgument, "store add: value of key '", wire::printable(key), "' is not an integer",
                 f.mine_refused ? " (or the sum would overflow)" : "");
      return v;
    };
    if (delta == 0) {
      // A read: no write, no consensus round (a missing key is created as "0", as everywhere).
      Folded f = impl_->read(key, deadline, what);
      if (f.exists) return integer(f);
    }
    return integer(impl_->update(key, 'c', delta, {}, deadline, what));
  });
}

int64_t EtcdStore::append(const std::string& key, const Bytes& value) {
  return guarded(impl_->client.get(), "append", [&]() -> int64_t {
    Folded f = impl_->update(key, 'a', 0, to_string(value), impl_->op_deadline(*this),
                             "append to '" + wire::printable(key) + "'");
    return static_cast<int64_t>(f.value.size());
  });
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return guarded(impl_->client.get(), "compare_set", [&]() -> Bytes {
    const std::string k = impl_->full(key), cp = impl_->change_prefix(key), end = prefix_end(cp);
    const std::string what = "compare_set of '" + wire::printable(key) + "'";
    const Deadline deadline = impl_->op_deadline(*this);
    const std::string want = to_string(expected);
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->counters.erase(k);
    }
    if (want == to_string(desired) && !want.empty()) {
      // A read in disguise (the elastic rendezvous peeks this way): no write, no consensus round.
      Folded f = impl_->read(key, deadline, what);
      return f.exists ? to_bytes(f.value) : expected;
    }
    const json current = json::array({range_op(k), range_of(cp, end)});
    for (;;) {
      // One transaction on the plain value (no change records); an empty expectation also matches
      // a missing key.
      json cmp = want.empty()
                     ? cmp_create0(k)
                     : json{{"target", "VALUE"}, {"key", b64_encode(k)}, {"value", b64_encode(want)}};
      json r = impl_->client->call("/v3/kv/txn",
                                   {{"compare", json::array({cmp, cmp_create0(cp, end)})},
                                    {"success", json::array({put_op(k, to_string(desired))})},
                                    {"failure", current}},
                                   deadline, what);
      if (r.value("succeeded", false)) return desired;
      Folded f = fold(txn_response(r, 0, "response_range"), txn_response(r, 1, "response_range"));
      if (!f.exists) {
        if (!want.empty()) return expected;  // missing, a non-empty expectation: as MemStore and TcpStore
        // Missing, and still the transaction failed: change records without a value (a client
        // that died between its writes). The swap below replaces them; before, this retried the
        // same failing transaction back to back until the deadline.
      } else if (f.value != want) {
        return to_bytes(f.value);
      }
      // It matches once its change records are applied (or it is present and empty): swap if
      // nothing changed since that read.
      const int64_t at = field_i64(r["header"], "revision");
      json same_base = {
          {"target", "MOD"}, {"key", b64_encode(k)}, {"mod_revision", std::to_string(f.base_mod)}};
      json same_changes = {{"target", "MOD"},
                           {"key", b64_encode(cp)},
                           {"range_end", b64_encode(end)},
                           {"result", "LESS"},
                           {"mod_revision", std::to_string(at + 1)}};
      r = impl_->client->call(
          "/v3/kv/txn",
          {{"compare", json::array({same_base, same_changes})},
           {"success", json::array({put_op(k, to_string(desired)), impl_->delete_changes(key)})}},
          deadline, what);
      if (r.value("succeeded", false)) return desired;
      if (deadline.expired())
        GZ_THROW(TimeoutError, "etcd ", what,
                 ": could not apply it within the deadline (other clients kept changing it)");
    }
  });
}

void EtcdStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  return guarded(impl_->client.get(), "wait", [&]() -> void {
    if (keys.empty()) return;
    const std::string what = "wait for " + key_list(keys);
    Stopwatch sw;
    std::vector<std::string> missing = keys;
    std::unique_ptr<etcd::Watch> w;
    std::vector<std::string> watched;
    for (;;) {
      int64_t rev = 0;
      size_t member = 0;
      std::vector<bool> there;
      try {
        there = impl_->exist(missing, deadline, what, &rev, &member);
      } catch (const TimeoutError& e) {
        GZ_THROW(TimeoutError, "store wait: keys not set within ", format_duration(sw.elapsed()), ": ",
                 key_list(missing), " (", e.what(), ")");
      }
      std::vector<std::string> still;
      for (size_t i = 0; i < missing.size(); ++i)
        if (!there[i]) still.push_back(missing[i]);
      missing.swap(still);
      if (missing.empty()) return;
      const Deadline slice = std::min(deadline, Deadline::after(impl_->o.watch_check_interval),
                                      [](const Deadline& a, const Deadline& b) { return a.at() < b.at(); });
      try {
        if (!w || w->member() != member || watched != missing) {
          std::vector<std::string> full;
          for (const auto& k : missing) full.push_back(impl_->full(k));
          w = impl_->client->watch(full, rev + 1, slice, what);
          watched = missing;
        }
        etcd::WatchEvent ev;
        while (!missing.empty() && w->next(ev, slice)) {
          if (ev.deleted) continue;
          missing.erase(std::remove_if(missing.begin(), missing.end(),
                                       [&](const std::string& k) { return impl_->full(k) == ev.key; }),
                        missing.end());
        }
        if (missing.empty()) return;
      } catch (const etcd::TransportError&) {
        w.reset();
      } catch (const etcd::ServerError& e) {
        if (!e.retry()) throw Error(e.what());  // e.g. permission denied on the watched keys
        w.reset();
      } catch (const TimeoutError&) {
        w.reset();
      }
      if (deadline.expired())
        GZ_THROW(TimeoutError, "store wait: keys not set within ", format_duration(sw.elapsed()), ": ",
                 key_list(missing), " (etcd, ", endpoint(), ")");
    }
  });
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  return guarded(impl_->client.get(), "check", [&]() -> bool {
    if (keys.empty()) return true;
    auto there =
        impl_->exist(keys, impl_->op_deadline(*this), "check of " + key_list(keys), nullptr, nullptr);
    return std::all_of(there.begin(), there.end(), [](bool b) { return b; });
  });
}

bool EtcdStore::delete_key(const std::string& key) {
  return guarded(impl_->client.get(), "delete_key", [&]() -> bool {
    const std::string k = impl_->full(key);
    json r = impl_->client->call(
        "/v3/kv/txn",
        {{"success",
          json::array({{{"request_delete_range", {{"key", b64_encode(k)}}}}, impl_->delete_changes(key)})}},
        impl_->op_deadline(*this), "delete of '" + wire::printable(key) + "'");
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->counters.erase(k);
    }
    return field_i64(txn_response(r, 0, "response_delete_range"), "deleted") > 0;
  });
}

int64_t EtcdStore::num_keys() {
  return guarded(impl_->client.get(), "num_keys", [&]() -> int64_t {
    json r = impl_->client->call("/v3/kv/range",
                                 {{"key", b64_encode(impl_->data)},
                                  {"range_end", b64_encode(prefix_end(impl_->data))},
                                  {"count_only", true}},
                                 impl_->op_deadline(*this), "count of keys");
    return field_i64(r, "count");
  });
}

int64_t EtcdStore::delete_all() {
  return guarded(impl_->client.get(), "delete_all", [&]() -> int64_t {
    const std::string p = impl_->o.prefix + "/";
    json r = impl_->client->call("/v3/kv/deleterange",
                                 {{"key", b64_encode(p)}, {"range_end", b64_encode(prefix_end(p))}},
                                 impl_->op_deadline(*this), "delete of every key under '" + p + "'");
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->counters.clear();
    return field_i64(r, "deleted");
  });
}

}  // namespace gz
