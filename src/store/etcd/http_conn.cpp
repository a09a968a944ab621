#include "store/etcd/http_conn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "gz/core/env.h"  // parse_int

namespace gz::etcd {

namespace {

constexpr size_t kMaxHead = 64 << 10;
// Far above what etcd answers (its requests are at most --max-request-bytes, 1.5 MiB by default;
// a range of a key's change records a few times that): bounds what a bad server makes us buffer.
// A watch stream is bounded per message (etcd_client.cpp), not in total.
constexpr long long kMaxBody = 64ll << 20;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out.empty() ? "unknown TLS error" : out;
}

// A socket BIO that sends with MSG_NOSIGNAL: OpenSSL's own writes with write(), and a peer that
// closed the connection would raise SIGPIPE in the (library-using) process.
int bio_write(BIO* b, const char* data, int n) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  ssize_t w = ::send(fd, data, static_cast<size_t>(n), MSG_NOSIGNAL);
  if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(b);
  return static_cast<int>(w);
}

int bio_read(BIO* b, char* data, int n) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  ssize_t r = ::recv(fd, data, static_cast<size_t>(n), 0);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  return static_cast<int>(r);
}

long bio_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int bio_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

BIO_METHOD* nosignal_method() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* meth = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "gz socket");
    BIO_meth_set_write(meth, bio_write);
    BIO_meth_set_read(meth, bio_read);
    BIO_meth_set_ctrl(meth, bio_ctrl);
    BIO_meth_set_create(meth, bio_create);
    return meth;
  }();
  return m;
}

bool is_ip_literal(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

std::string Endpoint::url() const {
  const bool v6 = host.find(':') != std::string::npos;
  return std::string(tls ? "https://" : "http://") + (v6 ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

Endpoint parse_endpoint(const std::string& text) {
  Endpoint ep;
  std::string rest = trim(text);
  if (rest.rfind("https://", 0) == 0) {
    ep.tls = true;
    rest = rest.substr(8);
  } else if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.find("://") != std::string::npos) {
    GZ_THROW(InvalidArgument, "etcd endpoint '", text, "': the scheme must be http:// or https://");
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    size_t close = rest.find(']');
    if (close == std::string::npos) GZ_THROW(InvalidArgument, "etcd endpoint '", text, "': unclosed '['");
    ep.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':')
        GZ_THROW(InvalidArgument, "etcd endpoint '", text, "': expected ':' after ']'");
      port = rest.substr(close + 2);
    }
  } else {
    size_t colon = rest.find(':');
    if (colon != std::string::npos && rest.find(':', colon + 1) != std::string::npos)
      GZ_THROW(InvalidArgument, "etcd endpoint '", text, "': write an IPv6 address as [addr]:port");
    ep.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (ep.host.empty() || ep.host.find('/') != std::string::npos)
    GZ_THROW(InvalidArgument, "etcd endpoint '", text, "': expected [http://|https://]HOST[:PORT]");
  if (!port.empty()) {
    long long p = parse_int(port, "port of etcd endpoint '" + text + "'");
    if (p < 1 || p > 65535) GZ_THROW(InvalidArgument, "etcd endpoint '", text, "': port out of range");
    ep.port = static_cast<int>(p);
  }
  return ep;
}

TlsContext::TlsContext(const std::string& ca_file, const std::string& cert_file,
                       const std::string& key_file) {
  ctx_ = SSL_CTX_new(TLS_client_method());
  if (!ctx_) GZ_THROW(Error, "TLS: cannot create a context: ", ssl_errors());
  SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
  auto bad = [&](const std::string& what) {
    std::string msg = what + ": " + ssl_errors();
    SSL_CTX_free(ctx_);
    ctx_ = nullptr;
    throw InvalidArgument(msg);
  };
  if (!ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx_, ca_file.c_str(), nullptr) != 1)
      bad("cannot load the etcd CA certificate(s) from '" + ca_file + "'");
  } else if (SSL_CTX_set_default_verify_paths(ctx_) != 1) {
    bad("cannot load the system's trusted certificates");
  }
  if (cert_file.empty() != key_file.empty())
    bad("an etcd client certificate needs both the certificate and its key file");
  if (!cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx_, cert_file.c_str()) != 1)
      bad("cannot load the etcd client certificate '" + cert_file + "'");
    if (SSL_CTX_use_PrivateKey_file(ctx_, key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      bad("cannot load the etcd client key '" + key_file + "'");
    if (SSL_CTX_check_private_key(ctx_) != 1)
      bad("the etcd client key '" + key_file + "' does not match '" + cert_file + "'");
  }
}

TlsContext::~TlsContext() {
  if (ctx_) SSL_CTX_free(ctx_);
}

void HttpConn::fail(const std::string& what, bool timed_out) {
  reusable_ = false;
  throw TransportError(ep_.url() + ": " + what, sent_, timed_out);
}

void HttpConn::wait_io(bool for_write, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd_, static_cast<short>(for_write ? POLLOUT : POLLIN), 0};
    int n = ::poll(&p, 1, deadline.remaining_ms());
    if (n > 0) return;
    if (n == 0) fail(std::string("timed out ") + what, true);
    if (errno != EINTR) fail(std::string("poll failed ") + what + ": " + std::strerror(errno));
  }
}

HttpConn::HttpConn(const Endpoint& ep, const TlsContext* tls, Deadline deadline) : ep_(ep) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(ep.port);
  int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail(std::string("cannot resolve the host: ") + gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int n;
      while ((n = ::poll(&p, 1, deadline.remaining_ms())) < 0 && errno == EINTR) {
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (n > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        fd_ = fd;
        break;
      }
      last = n == 0 ? "connect timed out" : std::string("connect: ") + std::strerror(err ? err : errno);
    } else {
      last = std::string("connect: ") + std::strerror(errno);
    }
    ::close(fd);
  }
  freeaddrinfo(res);
  if (fd_ < 0) fail(last, last == "connect timed out");
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!ep.tls) return;
  // A constructor that throws runs no destructor: free what the handshake holds here.
  try {
    start_tls(ep, tls, deadline);
  } catch (...) {
    if (ssl_) SSL_free(ssl_);
    ssl_ = nullptr;
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void HttpConn::start_tls(const Endpoint& ep, const TlsContext* tls, Deadline deadline) {
  if (!tls) GZ_THROW(InvalidArgument, "etcd endpoint ", ep.url(), " needs TLS settings");
  ssl_ = SSL_new(tls->get());
  if (!ssl_) fail("TLS: " + ssl_errors());
  BIO* bio = BIO_new(nosignal_method());
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd_)));
  SSL_set_bio(ssl_, bio, bio);
  SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // The certificate must name the host we asked for (its IP address when we dialled one).
  if (is_ip_literal(ep.host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), ep.host.c_str());
  } else {
    SSL_set1_host(ssl_, ep.host.c_str());
    SSL_set_tlsext_host_name(ssl_, ep.host.c_str());
  }
  for (;;) {
    ERR_clear_error();
    int r = SSL_connect(ssl_);
    if (r == 1) break;
    int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      wait_io(e == SSL_ERROR_WANT_WRITE, deadline, "in the TLS handshake");
      continue;
    }
    long v = SSL_get_verify_result(ssl_);
    if (v != X509_V_OK)
      throw TransportError(
          ep_.url() + ": TLS: the server's certificate is not trusted: " + X509_verify_cert_error_string(v) +
              " (check the CA file and that the certificate names " + ep.host + ")",
          false, false, true);
    // A protocol error (e.g. a plain-http server on an https endpoint: "wrong version number")
    // will be the same on every try: refused like an untrusted certificate, not retried until
    // the deadline. A reset or close mid-handshake (a member restarting) is retried.
    if (e == SSL_ERROR_SSL)
      throw TransportError(ep_.url() + ": TLS handshake refused: " + ssl_errors() +
                               " (is this endpoint https? plain-http members are named http://)",
                           false, false, true);
    fail("TLS handshake failed: " + ssl_errors());
  }
}

HttpConn::~HttpConn() {
  if (ssl_) SSL_free(ssl_);  // no close_notify: the peer sees the TCP close
  if (fd_ >= 0) ::close(fd_);
}

void HttpConn::send_all(const std::string& data, Deadline deadline) {
  size_t off = 0;
  while (off < data.size()) {
    if (ssl_) {
      ERR_clear_error();
      int w =
          SSL_write(ssl_, data.data() + off, static_cast<int>(std::min<size_t>(data.size() - off, 1 << 20)));
      if (w > 0) {
        off += static_cast<size_t>(w);
        sent_ = true;
        continue;
      }
      int e = SSL_get_error(ssl_, w);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        wait_io(e == SSL_ERROR_WANT_WRITE, deadline, "sending");
        continue;
      }
      fail("TLS send failed: " + ssl_errors());
    }
    ssize_t w = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<size_t>(w);
      sent_ = true;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_io(true, deadline, "sending");
    } else if (w < 0 && errno != EINTR) {
      fail(std::string("send: ") + std::strerror(errno));
    }
  }
}

size_t HttpConn::read_some(char* buf, size_t n, Deadline deadline) {
  for (;;) {
    if (ssl_) {
      ERR_clear_error();
      int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 20)));
      if (r > 0) return static_cast<size_t>(r);
      int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_ZERO_RETURN) fail("connection closed by the server");
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
        fail(r == 0 || e == SSL_ERROR_SYSCALL ? "connection closed or reset by the server"
                                              : "TLS receive failed: " + ssl_errors());
      pollfd p{fd_, static_cast<short>(e == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN), 0};
      int k = ::poll(&p, 1, deadline.remaining_ms());
      if (k == 0) return 0;
      if (k < 0 && errno != EINTR) fail(std::string("poll: ") + std::strerror(errno));
      continue;
    }
    ssize_t r = ::recv(fd_, buf, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) fail("connection closed by the server");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) fail(std::string("recv: ") + std::strerror(errno));
    pollfd p{fd_, POLLIN, 0};
    int k = ::poll(&p, 1, deadline.remaining_ms());
    if (k == 0) return 0;
    if (k < 0 && errno != EINTR) fail(std::string("poll: ") + std::strerror(errno));
  }
}

void HttpConn::fill(Deadline deadline) {
  char buf[16384];
  size_t n = read_some(buf, sizeof buf, deadline);
  if (n == 0) fail("timed out waiting for the response", true);
  in_.append(buf, n);
}

void HttpConn::send_request(const std::string& path, const std::string& body, const Headers& headers,
                            Deadline deadline) {
  if (body_ != Body::done || !in_.empty()) fail("a previous response was not read to its end");
  sent_ = false;
  reusable_ = false;
  std::string req = "POST " + path + " HTTP/1.1\r\nHost: " + ep_.host + ":" + std::to_string(ep_.port) +
                    "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += "\r\n";
  req += body;
  send_all(req, deadline);
}

int HttpConn::read_head(Deadline deadline) {
  size_t end;
  while ((end = in_.find("\r\n\r\n")) == std::string::npos) {
    if (in_.size() > kMaxHead) fail("response head larger than " + std::to_string(kMaxHead) + " bytes");
    fill(deadline);
  }
  std::string head = in_.substr(0, end);
  in_.erase(0, end + 4);
  size_t line_end = head.find("\r\n");
  std::string status_line = head.substr(0, line_end);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12)
    fail("not an HTTP response: '" + status_line.substr(0, 80) + "'");
  int status = std::atoi(status_line.c_str() + 9);
  close_after_ = status_line.rfind("HTTP/1.0", 0) == 0;
  body_ = Body::until_close;
  remaining_ = 0;
  body_bytes_ = 0;
  size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string::npos) e = head.size();
    std::string line = head.substr(pos, e - pos);
    pos = e + 2;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = lower(trim(line.substr(0, colon)));
    const std::string value = lower(trim(line.substr(colon + 1)));
    if (name == "content-length" && body_ != Body::chunk_size) {
      long long n = -1;
      try {
        n = parse_int(value, "Content-Length");
      } catch (const InvalidArgument&) {
      }
      if (n < 0 || n > kMaxBody) fail("bad Content-Length '" + value + "'");
      body_ = Body::length;
      remaining_ = n;
    } else if (name == "transfer-encoding" && value.find("chunked") != std::string::npos) {
      body_ = Body::chunk_size;
    } else if (name == "connection") {
      if (value.find("close") != std::string::npos) close_after_ = true;
    }
  }
  if (body_ == Body::until_close) close_after_ = true;
  return status;
}

bool HttpConn::decode_body(std::string& out) {
  for (;;) {
    switch (body_) {
      case Body::done:
        return true;
      case Body::until_close:
        out += in_;
        body_bytes_ += static_cast<long long>(in_.size());
        in_.clear();
        return false;
      case Body::length:
      case Body::chunk_data: {
        const size_t n =
            static_cast<size_t>(std::min<long long>(remaining_, static_cast<long long>(in_.size())));
        out.append(in_, 0, n);
        in_.erase(0, n);
        remaining_ -= static_cast<long long>(n);
        body_bytes_ += static_cast<long long>(n);
        if (remaining_ > 0) return false;
        body_ = body_ == Body::length ? Body::done : Body::chunk_crlf;
        break;
      }
      case Body::chunk_crlf:
        if (in_.size() < 2) return false;
        if (in_.compare(0, 2, "\r\n") != 0) fail("malformed chunked body (no CRLF after a chunk)");
        in_.erase(0, 2);
        body_ = Body::chunk_size;
        break;
      case Body::chunk_size: {
        size_t e = in_.find("\r\n");
        if (e == std::string::npos) {
          if (in_.size() > 1024) fail("malformed chunked body (chunk size line too long)");
          return false;
        }
        std::string line = in_.substr(0, in_.find_first_of(";\r"));
        in_.erase(0, e + 2);
        char* end = nullptr;
        long long n = std::strtoll(line.c_str(), &end, 16);
        if (line.empty() || n < 0 || (end && *end && !std::isspace(static_cast<unsigned char>(*end))))
          fail("malformed chunked body (chunk size '" + line.substr(0, 20) + "')");
        if (n == 0) {
          body_ = Body::trailer;
        } else {
          remaining_ = n;
          body_ = Body::chunk_data;
        }
        break;
      }
      case Body::trailer: {
        size_t e = in_.find("\r\n");
        if (e == std::string::npos) return false;
        in_.erase(0, e + 2);
        if (e == 0) body_ = Body::done;  // the empty line ends the trailer
        break;
      }
    }
    if (body_bytes_ > kMaxBody) fail("response body larger than " + std::to_string(kMaxBody) + " bytes");
  }
}

HttpResponse HttpConn::post(const std::string& path, const std::string& body, const Headers& headers,
                            Deadline deadline) {
  send_request(path, body, headers, deadline);
  HttpResponse r;
  r.status = read_head(deadline);
  while (!decode_body(r.body)) {
    if (body_ == Body::until_close) {
      char buf[16384];
      size_t n = 0;
      try {
        n = read_some(buf, sizeof buf, deadline);
      } catch (const TransportError&) {
        body_ = Body::done;  // the close ends this body
        break;
      }
      if (n == 0) fail("timed out reading the response", true);
      in_.append(buf, n);
      continue;
    }
    fill(deadline);
  }
  reusable_ = !close_after_ && in_.empty();
  return r;
}

int HttpConn::post_stream(const std::string& path, const std::string& body, const Headers& headers,
                          Deadline deadline) {
  send_request(path, body, headers, deadline);
  return read_head(deadline);
}

bool HttpConn::read_body(std::string& out, Deadline deadline) {
  const size_t before = out.size();
  body_bytes_ = 0;  // a stream lives long: its messages are bounded one by one by the caller
  if (decode_body(out)) fail("the stream ended");
  if (out.size() > before) return true;
  char buf[16384];
  for (;;) {
    size_t n = read_some(buf, sizeof buf, deadline);
    if (n == 0) return false;
    in_.append(buf, n);
    if (decode_body(out)) {
      if (out.size() > before) return true;
      fail("the stream ended");
    }
    if (out.size() > before) return true;
  }
}

}  // namespace gz::etcd
