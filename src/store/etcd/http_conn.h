// One HTTP/1.1 connection to an etcd member's JSON gateway, plain or TLS (OpenSSL), every read and
// write bounded by a deadline. Enough HTTP for etcd: POST with a body, responses with a
// Content-Length or chunked (the watch stream), keep-alive.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gz/core/deadline.h"
#include "gz/core/error.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace gz::etcd {

/// @brief One member's client URL: [http://|https://]host:port (IPv6 as [addr]:port).
struct Endpoint {
  std::string host;
  int port = 2379;
  bool tls = false;
  /// @brief "http://host:port" / "https://host:port", for messages.
  std::string url() const;
};

/// @brief Parse one endpoint; the scheme defaults to http, the port to 2379. Throws
/// gz::InvalidArgument naming the text.
Endpoint parse_endpoint(const std::string& text);

/// @brief The transport failed (refused, reset, closed, timed out, TLS): try another member.
/// `maybe_sent`: the request may have reached the server (a mutation may have been applied).
class TransportError : public Error {
 public:
  TransportError(const std::string& what, bool maybe_sent, bool timed_out, bool untrusted = false)
      : Error(what), maybe_sent_(maybe_sent), timed_out_(timed_out), untrusted_(untrusted) {}
  bool maybe_sent() const { return maybe_sent_; }
  bool timed_out() const { return timed_out_; }
  /// @brief The server's certificate was refused (retrying will not change that).
  bool untrusted() const { return untrusted_; }

 private:
  bool maybe_sent_;
  bool timed_out_;
  bool untrusted_;
};

/// @brief TLS settings of one client (an OpenSSL context): the server's certificate is always
/// verified, against `ca_file` or else the system's trust store, and must name the host.
class TlsContext {
 public:
  /// @brief Throws gz::InvalidArgument naming the file that cannot be loaded.
  TlsContext(const std::string& ca_file, const std::string& cert_file, const std::string& key_file);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* get() const { return ctx_; }

 private:
  SSL_CTX* ctx_ = nullptr;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

/// @brief A connection to one endpoint. Not thread-safe: one request at a time.
class HttpConn {
 public:
  /// @brief Connect (and for https shake hands, verifying the certificate) before `deadline`.
  /// Throws TransportError (nothing sent).
  HttpConn(const Endpoint& ep, const TlsContext* tls, Deadline deadline);
  ~HttpConn();
  HttpConn(const HttpConn&) = delete;
  HttpConn& operator=(const HttpConn&) = delete;

  /// @brief POST `body` to `path` and read the whole response. Throws TransportError.
  HttpResponse post(const std::string& path, const std::string& body, const Headers& headers,
                    Deadline deadline);
  /// @brief POST and read only the response head; the body then comes from read_body().
  /// Returns the status. Throws TransportError.
  int post_stream(const std::string& path, const std::string& body, const Headers& headers,
                  Deadline deadline);
  /// @brief Streaming body bytes as they come: appends what arrived to `out`. Returns false when
  /// `deadline` passed with nothing new (the stream stays usable); throws TransportError when the
  /// stream ended or broke.
  bool read_body(std::string& out, Deadline deadline);
  /// @brief Whether another request may follow on this connection (keep-alive, nothing pending).
  bool reusable() const { return reusable_; }
  const Endpoint& endpoint() const { return ep_; }
  /// @brief The connected socket (to ask the kernel who listens on a loopback endpoint).
  int fd() const { return fd_; }

 private:
  /// The TLS handshake on the connected socket, the certificate verified.
  void start_tls(const Endpoint& ep, const TlsContext* tls, Deadline deadline);
  void send_all(const std::string& data, Deadline deadline);
  /// Read what is available (blocking until something is or `deadline`); 0 = deadline passed.
  size_t read_some(char* buf, size_t n, Deadline deadline);
  void fill(Deadline deadline);  // at least one more byte into in_, or throw
  void send_request(const std::string& path, const std::string& body, const Headers& headers,
                    Deadline deadline);
  int read_head(Deadline deadline);
  /// Move what in_ holds of the body into `out`; true once the body is complete.
  bool decode_body(std::string& out);
  [[noreturn]] void fail(const std::string& what, bool timed_out = false);
  void wait_io(bool for_write, Deadline deadline, const char* what);

  Endpoint ep_;
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string in_;  // received, not yet consumed
  bool sent_ = false;
  bool reusable_ = false;
  // The body of the response being read.
  enum class Body { length, until_close, chunk_size, chunk_data, chunk_crlf, trailer, done };
  Body body_ = Body::done;
  long long remaining_ = 0;   // Content-Length bytes left, or bytes left of the current chunk
  long long body_bytes_ = 0;  // read so far (bounded)
  bool close_after_ = false;  // "Connection: close"
};

}  // namespace gz::etcd
