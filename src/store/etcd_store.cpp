// The Store operations as etcd requests (store/etcd/etcd_client.* does the talking). Keys live
// under "<prefix>/k/"; "<prefix>/op/<client>" holds this client's last add/append and its result,
// written in the same transaction, so a retry after an ambiguous failure (the member died after
// receiving the request) finds out whether the first try was applied instead of applying twice.
#include "gz/store/etcd_store.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "gz/core/error.h"
#include "gz/store/rdzv_auth.h"
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

std::vector<std::string> parse_etcd_endpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= list.size()) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    std::string item = list.substr(b, e - b);
    item.erase(std::remove_if(item.begin(), item.end(), [](char c) { return c == ' ' || c == '\t'; }),
               item.end());
    if (!item.empty()) {
      etcd::parse_endpoint(item);  // validates
      out.push_back(item);
    }
    b = e + 1;
  }
  if (out.empty())
    GZ_THROW(InvalidArgument, "no etcd endpoint in '", list, "' (expected host:port,host:port,...)");
  return out;
}

std::vector<std::string> check_etcd_options(const EtcdStoreOptions& o) {
  std::vector<std::string> warnings;
  if (o.endpoints.empty()) GZ_THROW(InvalidArgument, "etcd store: no endpoint given");
  if (o.prefix.size() < 2 || o.prefix[0] != '/' || o.prefix.back() == '/')
    GZ_THROW(InvalidArgument, "etcd store: prefix '", o.prefix, "' must start with '/' and not end with one");
  if (!o.user.empty() && o.password.empty())
    GZ_THROW(InvalidArgument, "etcd user '", o.user, "' needs a password (gzrun: the rendezvous token)");
  if (o.user.empty() && !o.password.empty())
    GZ_THROW(InvalidArgument, "an etcd password (the rendezvous token) needs an etcd user to go with it");
  const bool client_cert = !o.cert_file.empty();
  std::string clear, unauthenticated;
  bool any_tls = false;
  for (const auto& text : o.endpoints) {
    const etcd::Endpoint ep = etcd::parse_endpoint(text);
    any_tls = any_tls || ep.tls;
    if (is_loopback_host(ep.host)) continue;
    if (!ep.tls) clear += (clear.empty() ? "" : ", ") + ep.url();
    if (!(ep.tls && client_cert) && o.user.empty())
      unauthenticated += (unauthenticated.empty() ? "" : ", ") + ep.url();
  }
  if (!any_tls && (client_cert || !o.ca_file.empty()))
    warnings.push_back("etcd: TLS files are given but no endpoint is https://: they are not used");
  if (!o.user.empty() && !clear.empty()) {
    if (!o.allow_insecure)
      GZ_THROW(InvalidArgument, "the etcd password (the rendezvous token) would travel in clear text to ",
               clear,
               ", which has not proved who it is: use https:// endpoints and the CA that signs the members' "
               "certificates (gzrun --rdzv-conf cacert=FILE), or allow it on a network you trust completely "
               "(--rdzv-insecure)");
    warnings.push_back("the etcd password (the rendezvous token) travels in clear text to " + clear +
                       " (--rdzv-insecure): anyone on the network path can read it");
  }
  if (!unauthenticated.empty()) {
    if (!o.allow_insecure)
      GZ_THROW(
          InvalidArgument, "the etcd cluster at ", unauthenticated,
          " is reachable beyond loopback, so the job must authenticate to it: an etcd user whose password is "
          "the rendezvous token (over https://), or a client certificate (https:// with etcd's "
          "--client-cert-auth); or allow an open etcd on a network you trust completely (--rdzv-insecure)");
    warnings.push_back(
        "etcd at " + unauthenticated +
        " is used without authentication (--rdzv-insecure): anyone who can reach it can read and "
        "change the job's keys");
  }
  return warnings;
}

struct EtcdStore::Impl {
  EtcdStoreOptions o;
  std::unique_ptr<etcd::Client> client;
  std::string data;    // "<prefix>/k/"
  std::string op_key;  // "<prefix>/op/<client id>"
  std::mutex mu;
  uint64_t op_seq = 0;
  struct Counter {
    int64_t mod_revision;
    int64_t value;
  };
  std::unordered_map<std::string, Counter> counters;  // add()'s guess of the current value

  std::string full(const std::string& key) const { return data + key; }
  Deadline op_deadline(const Store& s) const { return Deadline::after(s.timeout()); }

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

  /// A transaction that changes `key` from what this client believes it holds (`rev`: its
  /// mod_revision, 0 = missing) to `value`, recording "seq|result" under op_key. Returns the
  /// transaction's answer.
  json cas(const std::string& key, int64_t rev, const std::string& value, const std::string& record,
           Deadline deadline, const std::string& what) {
    json cmp = rev == 0
                   ? json{{"target", "CREATE"}, {"key", b64_encode(key)}, {"create_revision", "0"}}
                   : json{{"target", "MOD"}, {"key", b64_encode(key)}, {"mod_revision", std::to_string(rev)}};
    json body = {{"compare", json::array({cmp})},
                 {"success", json::array({put_op(key, value), put_op(op_key, record)})},
                 {"failure", json::array({range_op(key), range_op(op_key)})}};
    return client->call("/v3/kv/txn", body, deadline, what);
  }

  /// add/append: read-modify-write with cas(), `next` computing the new value from the current
  /// one (nullptr = missing) and the result to return. The result is recorded with the change, so
  /// if an answer is lost and a retry finds the record, the change was applied once already.
  int64_t update(const std::string& key,
                 const std::function<std::pair<std::string, int64_t>(const std::string*)>& next,
                 Deadline deadline, const std::string& what, bool counter) {
    const std::string k = full(key);
    uint64_t seq;
    int64_t rev = 0;
    std::string cur;
    bool have = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      seq = ++op_seq;
      if (counter) {
        auto it = counters.find(k);
        if (it != counters.end()) {
          rev = it->second.mod_revision;
          cur = std::to_string(it->second.value);
          have = true;
        }
      }
    }
    const std::string tag = std::to_string(seq) + "|";
    for (;;) {
      auto [value, result] = next(have ? &cur : nullptr);
      json r = cas(k, have ? rev : 0, value, tag + std::to_string(result), deadline, what);
      if (r.value("succeeded", false)) {
        if (counter) remember(k, field_i64(r["header"], "revision"), result);
        return result;
      }
      const json* rec = first_kv(txn_response(r, 1, "response_range"));
      if (rec) {
        const std::string text = b64_decode(rec->value("value", std::string()));
        if (text.rfind(tag, 0) == 0) return std::stoll(text.substr(tag.size()));  // applied by a lost answer
      }
      const json* kv = first_kv(txn_response(r, 0, "response_range"));
      have = kv != nullptr;
      rev = kv ? field_i64(*kv, "mod_revision") : 0;
      cur = kv ? b64_decode(kv->value("value", std::string())) : std::string();
      if (deadline.expired())
        GZ_THROW(TimeoutError, "etcd ", what,
                 ": could not apply it within the deadline (other clients kept changing it)");
    }
  }

  void remember(const std::string& k, int64_t rev, int64_t value) {
    std::lock_guard<std::mutex> lock(mu);
    if (counters.size() >= kMaxCachedCounters) counters.clear();
    counters[k] = Counter{rev, value};
  }
};

EtcdStore::EtcdStore(const EtcdStoreOptions& options) : impl_(std::make_unique<Impl>()) {
  check_etcd_options(options);
  impl_->o = options;
  impl_->client = std::make_unique<etcd::Client>(options);
  impl_->data = options.prefix + "/k/";
  impl_->op_key = options.prefix + "/op/" + random_id();
  timeout_ = options.timeout;
  impl_->client->connect(Deadline::after(options.timeout));
}

EtcdStore::~EtcdStore() {
  // Best effort: this client's add/append record is of no use to anyone any more.
  try {
    if (impl_->op_seq > 0)
      impl_->client->call("/v3/kv/deleterange", {{"key", b64_encode(impl_->op_key)}},
                          Deadline::after(Duration(500)), "delete of the client's record");
  } catch (const std::exception&) {
  }
}

uint64_t EtcdStore::requests_sent() { return etcd::Client::requests.load(); }

std::string EtcdStore::endpoint() const { return impl_->client->endpoint_now(); }

void EtcdStore::set(const std::string& key, const Bytes& value) {
  impl_->client->call("/v3/kv/put",
                      {{"key", b64_encode(impl_->full(key))}, {"value", b64_encode(to_string(value))}},
                      impl_->op_deadline(*this), "set '" + wire::printable(key) + "'");
}

Bytes EtcdStore::get(const std::string& key, Deadline deadline) {
  const std::string k = impl_->full(key);
  const std::string what = "get '" + wire::printable(key) + "'";
  Stopwatch sw;
  std::unique_ptr<etcd::Watch> w;
  for (;;) {
    // Read (which also checks that the member answers and has a leader), then watch from there.
    size_t member = 0;
    json r;
    try {
      r = impl_->client->call("/v3/kv/range", {{"key", b64_encode(k)}}, deadline, what, &member);
    } catch (const TimeoutError& e) {
      GZ_THROW(TimeoutError, "store get: key '", wire::printable(key), "' not set within ",
               format_duration(sw.elapsed()), " (", e.what(), ")");
    }
    if (const json* kv = first_kv(r)) return to_bytes(b64_decode(kv->value("value", std::string())));
    const Deadline slice = std::min(deadline, Deadline::after(impl_->o.watch_check_interval),
                                    [](const Deadline& a, const Deadline& b) { return a.at() < b.at(); });
    try {
      if (!w || w->member() != member)
        w = impl_->client->watch({k}, field_i64(r["header"], "revision") + 1, slice, what);
      etcd::WatchEvent ev;
      while (w->next(ev, slice))
        if (!ev.deleted && ev.key == k) return to_bytes(ev.value);
    } catch (const etcd::TransportError&) {
      w.reset();  // the next read moves to another member
    } catch (const etcd::ServerError& e) {
      if (!e.retry()) throw Error(e.what());  // e.g. permission denied on the watched keys
      w.reset();
    } catch (const TimeoutError&) {
      w.reset();
    }
    if (deadline.expired())
      GZ_THROW(TimeoutError, "store get: key '", wire::printable(key), "' not set within ",
               format_duration(sw.elapsed()), " (etcd, ", endpoint(), ")");
  }
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  const std::string what = "add to '" + wire::printable(key) + "'";
  const Deadline deadline = impl_->op_deadline(*this);
  auto parse = [&](const std::string& text) {
    int64_t v = 0;
    if (!wire::parse_counter(text, v))
      GZ_THROW(InvalidArgument, "store add: value of key '", wire::printable(key), "' is not an integer");
    return v;
  };
  if (delta == 0) {
    // A read: no write, no consensus round (a missing key is created as "0", as everywhere).
    json r = impl_->client->call("/v3/kv/range", {{"key", b64_encode(impl_->full(key))}}, deadline, what);
    if (const json* kv = first_kv(r)) return parse(b64_decode(kv->value("value", std::string())));
  }
  return impl_->update(
      key,
      [&](const std::string* cur) {
        const int64_t v = cur ? parse(*cur) : 0;
        int64_t sum = 0;
        if (__builtin_add_overflow(v, delta, &sum))
          GZ_THROW(InvalidArgument, "store add: counter '", wire::printable(key), "' would overflow");
        return std::make_pair(std::to_string(sum), sum);
      },
      deadline, what, true);
}

int64_t EtcdStore::append(const std::string& key, const Bytes& value) {
  const std::string add = to_string(value);
  return impl_->update(
      key,
      [&](const std::string* cur) {
        std::string next = cur ? *cur + add : add;
        const int64_t len = static_cast<int64_t>(next.size());
        return std::make_pair(std::move(next), len);
      },
      impl_->op_deadline(*this), "append to '" + wire::printable(key) + "'", false);
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string k = impl_->full(key);
  const std::string what = "compare_set of '" + wire::printable(key) + "'";
  const Deadline deadline = impl_->op_deadline(*this);
  // An empty expectation matches a missing key (and an empty value, checked second).
  json cmp =
      expected.empty()
          ? json{{"target", "CREATE"}, {"key", b64_encode(k)}, {"create_revision", "0"}}
          : json{{"target", "VALUE"}, {"key", b64_encode(k)}, {"value", b64_encode(to_string(expected))}};
  for (int pass = 0;; ++pass) {
    json body = {{"compare", json::array({cmp})},
                 {"success", json::array({put_op(k, to_string(desired))})},
                 {"failure", json::array({range_op(k)})}};
    json r = impl_->client->call("/v3/kv/txn", body, deadline, what);
    if (r.value("succeeded", false)) return desired;
    const json* kv = first_kv(txn_response(r, 0, "response_range"));
    if (!kv) return expected;  // missing and a non-empty expectation: as MemStore and TcpStore answer
    Bytes now = to_bytes(b64_decode(kv->value("value", std::string())));
    if (!now.empty() || !expected.empty() || pass > 0) return now;
    cmp = {
        {"target", "VALUE"}, {"key", b64_encode(k)}, {"value", ""}};  // present and empty: compare the value
  }
}

void EtcdStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
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
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  auto there = impl_->exist(keys, impl_->op_deadline(*this), "check of " + key_list(keys), nullptr, nullptr);
  return std::all_of(there.begin(), there.end(), [](bool b) { return b; });
}

bool EtcdStore::delete_key(const std::string& key) {
  json r = impl_->client->call("/v3/kv/deleterange", {{"key", b64_encode(impl_->full(key))}},
                               impl_->op_deadline(*this), "delete of '" + wire::printable(key) + "'");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->counters.erase(impl_->full(key));
  }
  return field_i64(r, "deleted") > 0;
}

int64_t EtcdStore::num_keys() {
  json r = impl_->client->call("/v3/kv/range",
                               {{"key", b64_encode(impl_->data)},
                                {"range_end", b64_encode(prefix_end(impl_->data))},
                                {"count_only", true}},
                               impl_->op_deadline(*this), "count of keys");
  return field_i64(r, "count");
}

int64_t EtcdStore::delete_all() {
  const std::string p = impl_->o.prefix + "/";
  json r = impl_->client->call("/v3/kv/deleterange",
                               {{"key", b64_encode(p)}, {"range_end", b64_encode(prefix_end(p))}},
                               impl_->op_deadline(*this), "delete of every key under '" + p + "'");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->counters.clear();
  return field_i64(r, "deleted");
}

}  // namespace gz
