#include "store/etcd/etcd_client.h"

#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>

#include "gz/store/rdzv_auth.h"  // is_loopback_host
#include "store/peer_identity.h"

namespace gz::etcd {

std::atomic<uint64_t> Client::requests{0};

namespace {

constexpr size_t kMaxIdlePerMember = 8;
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// gRPC status codes etcd answers with that another member (or a later try) may not.
bool retryable_code(int code) {
  return code == 14 /* unavailable: no leader, stopping, timed out */ || code == 4 /* deadline */ ||
         code == 8 /* too many requests */ || code == 10 /* aborted */;
}

/// End of the JSON object starting at `from` in `s` (a '{'), or npos when it is not complete yet.
size_t object_end(const std::string& s, size_t from) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

std::string error_text(const json& j) {
  if (j.is_object()) {
    for (const char* f : {"message", "error"})
      if (j.contains(f) && j[f].is_string()) return j[f].get<std::string>();
  }
  return j.dump().substr(0, 200);
}

}  // namespace

std::string b64_encode(const std::string& raw) {
  std::string out;
  out.reserve((raw.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < raw.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(raw[i]) << 16) | (static_cast<uint8_t>(raw[i + 1]) << 8) |
                 static_cast<uint8_t>(raw[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i < raw.size()) {
    uint32_t v = static_cast<uint8_t>(raw[i]) << 16;
    if (i + 1 < raw.size()) v |= static_cast<uint8_t>(raw[i + 1]) << 8;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < raw.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string b64_decode(const std::string& text) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    int v = val(c);
    if (v < 0) GZ_THROW(PeerError, "etcd sent bad base64 data");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

int64_t field_i64(const json& j, const char* name) {
  if (!j.is_object() || !j.contains(name)) return 0;
  const json& v = j[name];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (const std::exception&) {
    }
  }
  GZ_THROW(PeerError, "etcd sent a bad integer in field '", name, "'");
}

Watch::Watch(std::unique_ptr<HttpConn> conn, size_t member) : conn_(std::move(conn)), member_(member) {}

bool Watch::next(WatchEvent& ev, Deadline deadline) {
  for (;;) {
    if (!ready_.empty()) {
      ev = std::move(ready_.front());
      ready_.erase(ready_.begin());
      return true;
    }
    size_t start = buf_.find('{');
    size_t end = start == std::string::npos ? std::string::npos : object_end(buf_, start);
    if (end == std::string::npos) {
      if (buf_.size() > (64u << 20))
        throw TransportError(conn_->endpoint().url() + ": watch message too large", true, false);
      if (!conn_->read_body(buf_, deadline)) return false;
      continue;
    }
    json msg = json::parse(buf_.begin() + static_cast<std::ptrdiff_t>(start),
                           buf_.begin() + static_cast<std::ptrdiff_t>(end), nullptr, false);
    buf_.erase(0, end);
    if (msg.is_discarded())
      throw TransportError(conn_->endpoint().url() + ": watch sent bad JSON", true, false);
    if (msg.contains("error")) {
      const json& e = msg["error"];
      const int code = static_cast<int>(field_i64(e, "grpc_code"));
      throw ServerError("etcd watch at " + conn_->endpoint().url() + ": " + error_text(e), code,
                        code == 0 || retryable_code(code));
    }
    const json& r = msg.contains("result") ? msg["result"] : msg;
    if (r.value("canceled", false)) {
      const std::string reason = r.value("cancel_reason", std::string("cancelled"));
      const bool denied = reason.find("permission denied") != std::string::npos;
      throw ServerError("etcd watch at " + conn_->endpoint().url() + " cancelled: " + reason +
                            (field_i64(r, "compact_revision") ? " (revision compacted)" : ""),
                        denied ? 7 : 14, !denied);
    }
    if (!r.contains("events")) continue;
    for (const json& e : r["events"]) {
      WatchEvent w;
      const json& kv = e.contains("kv") ? e["kv"] : json::object();
      w.key = b64_decode(kv.value("key", std::string()));
      w.value = b64_decode(kv.value("value", std::string()));
      w.deleted = e.value("type", std::string("PUT")) == "DELETE";
      w.created = !w.deleted && field_i64(kv, "create_revision") == field_i64(kv, "mod_revision");
      ready_.push_back(std::move(w));
    }
  }
}

Client::Client(const EtcdStoreOptions& options) : o_(options) {
  for (const auto& e : o_.endpoints) eps_.push_back(parse_endpoint(e));
  if (eps_.empty()) GZ_THROW(InvalidArgument, "etcd store: no endpoint given");
  bool any_tls = std::any_of(eps_.begin(), eps_.end(), [](const Endpoint& e) { return e.tls; });
  if (any_tls) tls_ = std::make_unique<TlsContext>(o_.ca_file, o_.cert_file, o_.key_file);
  idle_.resize(eps_.size());
  if (o_.spread) cur_ = std::random_device{}() % eps_.size();
}

Client::~Client() = default;

std::string Client::endpoint_now() const { return eps_[cur_.load() % eps_.size()].url(); }

Headers Client::headers() const {
  // hasleader: a member cut off from its cluster refuses at once instead of stalling.
  Headers h{{"Grpc-Metadata-hasleader", "true"}};
  std::lock_guard<std::mutex> lock(mu_);
  if (!token_.empty()) h.emplace_back("Authorization", token_);
  return h;
}

std::unique_ptr<HttpConn> Client::take(size_t member, Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& pool = idle_[member];
    if (!pool.empty()) {
      auto c = std::move(pool.back());
      pool.pop_back();
      return c;
    }
  }
  auto conn = std::make_unique<HttpConn>(eps_[member], tls_.get(), deadline);
  check_listener(*conn);
  return conn;
}

namespace {
/// The uid of the system user `name`, or -1.
long long uid_of(const char* name) {
  passwd pw{}, *found = nullptr;
  char buf[1024];
  return getpwnam_r(name, &pw, buf, sizeof buf, &found) == 0 && found ? static_cast<long long>(pw.pw_uid)
                                                                      : -1;
}
}  // namespace

void Client::check_listener(const HttpConn& conn) const {
  const Endpoint& ep = conn.endpoint();
  // Beyond loopback plain http with a password needs allow_insecure (check_etcd_options); https
  // proves the server by its certificate.
  if (o_.user.empty() || ep.tls || o_.allow_insecure || !is_loopback_host(ep.host)) return;
  // On loopback any local user may listen on a port etcd does not hold (etcd down, or not yet
  // up): the password (the rendezvous token) and etcd's auth token only go to a listener of this
  // user, of root or of the system user "etcd" (Debian's etcd-server), as the kernel tells.
  sockaddr_storage peer{}, local{};
  socklen_t pl = sizeof peer, ll = sizeof local;
  long long owner = -1;
  if (getpeername(conn.fd(), reinterpret_cast<sockaddr*>(&peer), &pl) == 0 &&
      getsockname(conn.fd(), reinterpret_cast<sockaddr*>(&local), &ll) == 0) {
    wire::PeerIdentity id;
    owner = id.listener_uid(peer, local);
  }
  if (owner >= 0 && (owner == static_cast<long long>(::geteuid()) || owner == 0 || owner == uid_of("etcd")))
    return;
  GZ_THROW(InvalidArgument, "etcd endpoint ", ep.url(), ": ",
           owner >= 0 ? "the process listening there belongs to local user " + std::to_string(owner) +
                            ", neither this user, root nor etcd"
                      : std::string("cannot tell which local user listens there (no sock_diag for TCP)"),
           ", so the etcd password (the rendezvous token) is not sent to it in clear text; use an https "
           "endpoint with a CA file, or --rdzv-insecure (GZ_RDZV_INSECURE=1) if every local user is trusted");
}

void Client::give(size_t member, std::unique_ptr<HttpConn> conn) {
  if (!conn->reusable()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_[member].size() < kMaxIdlePerMember) idle_[member].push_back(std::move(conn));
}

void Client::refused(size_t member, const HttpResponse& r, const std::string& what) const {
  json j = json::parse(r.body, nullptr, false);
  const int code = j.is_discarded() ? 0 : static_cast<int>(field_i64(j, "code"));
  const std::string text =
      j.is_discarded() ? "HTTP " + std::to_string(r.status) + " " + r.body.substr(0, 200) : error_text(j);
  const std::string msg = "etcd " + what + " at " + eps_[member].url() + ": " + text;
  if (code == 3 || code == 11) throw InvalidArgument(msg);  // invalid argument, out of range (too large)
  const bool retry = code ? retryable_code(code) : (r.status >= 500 || r.status == 429);
  throw ServerError(msg, code, retry);
}

void Client::authenticate(size_t member, Deadline deadline) {
  auto conn = take(member, deadline);
  ++requests;
  json body = {{"name", o_.user}, {"password", o_.password}};
  HttpResponse r =
      conn->post("/v3/auth/authenticate", body.dump(), {{"Grpc-Metadata-hasleader", "true"}}, deadline);
  give(member, std::move(conn));
  if (r.status != 200) {
    try {
      refused(member, r, "authentication of user '" + o_.user + "'");
    } catch (const ServerError& e) {
      if (e.retry()) throw;
      // Wrong password, unknown user, auth disabled: another member will say the same.
      throw InvalidArgument(std::string(e.what()) +
                            (e.code() == 9 ? " (enable etcd's authentication, or give no user)" : ""));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string(e.what()) +
                            " (check the user and the rendezvous token, its password)");
    }
  }
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("token") || !j["token"].is_string())
    throw TransportError(eps_[member].url() + ": authentication answer without a token", true, false);
  std::lock_guard<std::mutex> lock(mu_);
  token_ = j["token"].get<std::string>();
}

void Client::with_failover(const std::string& what, Deadline deadline, const Attempt& attempt) {
  Stopwatch sw;
  std::vector<std::string> last(eps_.size());
  std::vector<bool> untrusted(eps_.size(), false);
  bool reauthed = false;
  int failures = 0;
  for (;;) {
    const size_t m = cur_.load() % eps_.size();
    const Deadline slice = std::min(deadline, Deadline::after(o_.attempt_timeout),
                                    [](const Deadline& a, const Deadline& b) { return a.at() < b.at(); });
    try {
      bool need_token = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        need_token = !o_.user.empty() && token_.empty();
      }
      if (need_token) authenticate(m, slice);
      attempt(m, slice);
      return;
    } catch (const TransportError& e) {
      // A try cut short by the deadline tells less than the member's previous error.
      if (!(e.timed_out() && deadline.expired() && !last[m].empty())) last[m] = e.what();
      untrusted[m] = e.untrusted();
      if (std::all_of(untrusted.begin(), untrusted.end(), [](bool u) { return u; })) {
        std::string all;
        for (size_t i = 0; i < eps_.size(); ++i) all += (i ? "; " : "") + last[i];
        GZ_THROW(InvalidArgument, "etcd ", what,
                 ": no member completed a TLS handshake this client trusts (its certificate, or the TLS "
                 "protocol, was refused: ",
                 all, ")");
      }
    } catch (const ServerError& e) {
      const bool expired_token = e.code() == 16 && !o_.user.empty() && !reauthed;
      if (expired_token) {
        // etcd's simple tokens expire (--auth-token-ttl) and are per member after a restart.
        reauthed = true;
        std::lock_guard<std::mutex> lock(mu_);
        token_.clear();
        continue;
      }
      if (e.code() == 16)
        throw InvalidArgument(
            std::string(e.what()) +
            (o_.user.empty() ? " (etcd's authentication is enabled: give a user and password)" : ""));
      if (!e.retry()) {
        if (e.code() == 7)
          throw InvalidArgument(std::string(e.what()) +
                                " (the user needs read-write permission on the prefix '" + o_.prefix + "/')");
        throw Error(e.what());
      }
      last[m] = e.what();
    }
    // This member failed: the next one (unless another thread moved on already).
    size_t expected = m;
    cur_.compare_exchange_strong(expected, (m + 1) % eps_.size());
    ++failures;
    if (deadline.expired()) {
      std::string all;
      for (size_t i = 0; i < eps_.size(); ++i)
        all += (i ? "; " : "") + eps_[i].url() + ": " + (last[i].empty() ? "not tried" : last[i]);
      GZ_THROW(TimeoutError, "etcd ", what, ": no member answered within ", format_duration(sw.elapsed()),
               " (", all, ")");
    }
    // Once around the members without an answer: back off a little before the next round.
    if (failures % static_cast<int>(eps_.size()) == 0) {
      const int round = failures / static_cast<int>(eps_.size());
      std::this_thread::sleep_for(
          std::min<Duration>(Duration(std::min(50 * round, 500)), deadline.remaining()));
    }
  }
}

json Client::call(const std::string& path, const json& body, Deadline deadline, const std::string& what,
                  size_t* member) {
  const std::string text = body.dump();
  json out;
  with_failover(what, deadline, [&](size_t m, Deadline slice) {
    auto conn = take(m, slice);
    ++requests;
    HttpResponse r = conn->post(path, text, headers(), slice);
    give(m, std::move(conn));
    if (r.status != 200) refused(m, r, what);
    out = json::parse(r.body, nullptr, false);
    if (out.is_discarded()) throw TransportError(eps_[m].url() + ": answer is not JSON", true, false);
    if (member) *member = m;
  });
  return out;
}

std::unique_ptr<Watch> Client::watch(const std::vector<std::string>& keys, int64_t from, Deadline deadline,
                                     const std::string& what) {
  std::string body;
  for (const auto& k : keys)
    body +=
        json({{"create_request", {{"key", b64_encode(k)}, {"start_revision", std::to_string(from)}}}}).dump();
  std::unique_ptr<Watch> out;
  with_failover(what, deadline, [&](size_t m, Deadline slice) {
    auto conn = take(m, slice);
    ++requests;
    const int status = conn->post_stream("/v3/watch", body, headers(), slice);
    if (status != 200) {
      HttpResponse r{status, {}};
      try {
        while (conn->read_body(r.body, slice)) {
        }
      } catch (const TransportError&) {
        // the end of the error's body
      }
      refused(m, r, what);
    }
    out = std::make_unique<Watch>(std::move(conn), m);
  });
  return out;
}

void Client::connect(Deadline deadline) {
  // With a user, the first call authenticates; without, a read of nothing checks the way in
  // (serializable: the member answers from its own copy, no consensus round for a probe).
  call("/v3/kv/range",
       json{{"key", b64_encode(o_.prefix + "/")}, {"count_only", true}, {"serializable", true}}, deadline,
       "first contact");
}

}  // namespace gz::etcd
