/* gz-tcp-pingpong: the TCP floor between two hosts, to compare collectives against.
 *
 *   gz-tcp-pingpong server [--port P] [--bind ADDR] [--once]
 *   gz-tcp-pingpong client HOST [--port P] [--sizes LIST] [--seconds S] [--stream-mib M]
 *
 * One TCP connection (TCP_NODELAY), plain blocking sockets, one thread per side. For every size
 * in LIST (default 4K,64K,1M,16M; K/M suffixes) the client measures
 *   pingpong   client sends SIZE, server sends SIZE back: round-trip time (min, median, p99)
 *   exchange   both sides send SIZE and receive SIZE at once (full duplex), as the two ranks of
 *              a 2-rank all-reduce do; time per exchange (median)
 *   floor      the lower bound of a 2-host all-reduce of SIZE bytes on this link:
 *              min(one exchange of SIZE, two exchanges of SIZE/2) = direct exchange or ring
 * and once, a single-stream bandwidth (client sends --stream-mib MiB in 1 MiB writes, server
 * acknowledges the last byte). Output: "RESULT tcp ..." lines (key=value, times in us,
 * bandwidth in MB/s = 1e6 bytes/s). The client retries connecting for 20 s, so the server may
 * start after it. Port default 29600.
 *
 * Wire: per test the client sends a 16-byte header (mode u32, iters u32, size u64, big-endian);
 * the server runs the same test and waits for the next header; EOF ends the connection.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MODE_PINGPONG = 1, MODE_EXCHANGE = 2, MODE_STREAM = 3 };
enum { CHUNK = 1 << 20 };

static void die(const char* what) {
  fprintf(stderr, "gz-tcp-pingpong: %s: %s\n", what, errno ? strerror(errno) : "failed");
  exit(1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("send");
    p += k;
    n -= (size_t)k;
  }
}

/* Returns 0 on a clean EOF before the first byte, 1 when n bytes were read. */
static int recv_all(int fd, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = recv(fd, p + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 && got == 0) return 0;
    if (k <= 0) {
      if (k == 0) errno = ECONNRESET;
      die("recv");
    }
    got += (size_t)k;
  }
  return 1;
}

/* Send n bytes from sbuf and receive n bytes into rbuf at the same time. */
static void exchange(int fd, const char* sbuf, char* rbuf, size_t n) {
  size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    struct pollfd pfd = {fd, (short)((sent < n ? POLLOUT : 0) | (got < n ? POLLIN : 0)), 0};
    if (poll(&pfd, 1, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (pfd.revents & (POLLERR | POLLHUP) && !(pfd.revents & POLLIN)) {
      errno = ECONNRESET;
      die("exchange");
    }
    if (got < n && (pfd.revents & POLLIN)) {
      ssize_t k = recv(fd, rbuf + got, n - got, MSG_DONTWAIT);
      if (k == 0) {
        errno = ECONNRESET;
        die("recv");
      }
      if (k > 0) got += (size_t)k;
      else if (errno != EAGAIN && errno != EINTR) die("recv");
    }
    if (sent < n && (pfd.revents & POLLOUT)) {
      ssize_t k = send(fd, sbuf + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) sent += (size_t)k;
      else if (k < 0 && errno != EAGAIN && errno != EINTR) die("send");
    }
  }
}

static void set_nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) die("setsockopt TCP_NODELAY");
}

static void put32(unsigned char* p, uint32_t v) {
  for (int i = 3; i >= 0; --i, v >>= 8) p[i] = (unsigned char)v;
}
static void put64(unsigned char* p, uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = (unsigned char)v;
}
static uint64_t get_be(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

static char* alloc_buf(size_t n) {
  char* p = malloc(n ? n : 1);
  if (!p) die("malloc");
  memset(p, 0x5a, n);
  return p;
}

/* ---- server ---- */

static void serve(int fd) {
  unsigned char h[16];
  char* buf = NULL;
  char* out = NULL;
  size_t cap = 0;
  while (recv_all(fd, (char*)h, sizeof h)) {
    uint32_t mode = (uint32_t)get_be(h, 4), iters = (uint32_t)get_be(h + 4, 4);
    uint64_t size = get_be(h + 8, 8);
    size_t need = mode == MODE_STREAM ? CHUNK : (size_t)size;
    if (need > cap) {
      free(buf);
      free(out);
      buf = alloc_buf(need);
      out = alloc_buf(need);
      cap = need;
    }
    for (uint32_t i = 0; i < iters; ++i) {
      if (mode == MODE_PINGPONG) {
        if (!recv_all(fd, buf, size)) die("client went away");
        send_all(fd, buf, size);
      } else if (mode == MODE_EXCHANGE) {
        exchange(fd, out, buf, size);
      } else if (mode == MODE_STREAM) {
        for (uint64_t left = size; left > 0;) {
          size_t k = left < CHUNK ? (size_t)left : CHUNK;
          if (!recv_all(fd, buf, k)) die("client went away");
          left -= k;
        }
        send_all(fd, "k", 1);
      } else {
        fprintf(stderr, "gz-tcp-pingpong: unknown mode %u\n", mode);
        exit(1);
      }
    }
  }
  free(buf);
  free(out);
}

static int run_server(const char* bind_addr, int port, int once) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) die("socket");
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, bind_addr, &a.sin_addr) != 1) {
    fprintf(stderr, "gz-tcp-pingpong: --bind wants an IPv4 address, not '%s'\n", bind_addr);
    return 2;
  }
  if (bind(ls, (struct sockaddr*)&a, sizeof a) < 0) die("bind");
  if (listen(ls, 4) < 0) die("listen");
  socklen_t len = sizeof a;
  getsockname(ls, (struct sockaddr*)&a, &len);
  printf("gz-tcp-pingpong: listening on %s:%d\n", bind_addr, ntohs(a.sin_port));
  fflush(stdout);
  do {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR) continue;
      die("accept");
    }
    set_nodelay(fd);
    serve(fd);
    close(fd);
  } while (!once);
  close(ls);
  return 0;
}

/* ---- client ---- */

static int connect_retry(const char* host, int port, double patience_s) {
  char ports[16];
  snprintf(ports, sizeof ports, "%d", port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, ports, &hints, &res);
  if (rc != 0) {
    fprintf(stderr, "gz-tcp-pingpong: cannot resolve %s: %s\n", host, gai_strerror(rc));
    exit(1);
  }
  double until = now_s() + patience_s;
  for (;;) {
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      freeaddrinfo(res);
      set_nodelay(fd);
      return fd;
    }
    int e = errno;
    close(fd);
    if (now_s() > until) {
      errno = e;
      die("connect");
    }
    usleep(50 * 1000);
  }
}

static void send_header(int fd, uint32_t mode, uint32_t iters, uint64_t size) {
  unsigned char h[16];
  put32(h, mode);
  put32(h + 4, iters);
  put64(h + 8, size);
  send_all(fd, (const char*)h, sizeof h);
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

struct Stats {
  double min, median, p99, mean;
};

static struct Stats stats_of(double* t, int n) {
  struct Stats s;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += t[i];
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  s.min = t[0];
  s.median = t[n / 2];
  s.p99 = t[(int)((n - 1) * 0.99)];
  s.mean = sum / n;
  return s;
}

/* Runs `iters` timed iterations of mode at size; fills t[] with seconds per iteration. */
static void timed(int fd, uint32_t mode, size_t size, int iters, char* sbuf, char* rbuf, double* t) {
  send_header(fd, mode, (uint32_t)iters, size);
  for (int i = 0; i < iters; ++i) {
    double t0 = now_s();
    if (mode == MODE_PINGPONG) {
      send_all(fd, sbuf, size);
      if (!recv_all(fd, rbuf, size)) die("server went away");
    } else {
      exchange(fd, sbuf, rbuf, size);
    }
    t[i] = now_s() - t0;
  }
}

/* Warm up, estimate one iteration, then time enough iterations for about `seconds`. */
static struct Stats measure(int fd, uint32_t mode, size_t size, double seconds, char* sbuf, char* rbuf) {
  static double t[100000];
  timed(fd, mode, size, 3, sbuf, rbuf, t);
  double one = t[1] < t[2] ? t[1] : t[2];
  int iters = (int)(seconds / (one > 1e-7 ? one : 1e-7));
  if (iters < 5) iters = 5;
  if (iters > 100000) iters = 100000;
  timed(fd, mode, size, iters, sbuf, rbuf, t);
  return stats_of(t, iters);
}

static size_t parse_size(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (end == s || v < 0) {
    fprintf(stderr, "gz-tcp-pingpong: bad size '%s'\n", s);
    exit(2);
  }
  if (*end == 'K' || *end == 'k') v *= 1024, ++end;
  else if (*end == 'M' || *end == 'm') v *= 1024 * 1024, ++end;
  else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, ++end;
  if (*end != '\0') {
    fprintf(stderr, "gz-tcp-pingpong: bad size '%s'\n", s);
    exit(2);
  }
  return (size_t)v;
}

static int run_client(const char* host, int port, const char* sizes, double seconds, double stream_mib) {
  size_t list[64];
  int n = 0;
  char* copy = strdup(sizes);
  for (char* tok = strtok(copy, ","); tok && n < 64; tok = strtok(NULL, ",")) list[n++] = parse_size(tok);
  free(copy);
  size_t max = CHUNK;
  for (int i = 0; i < n; ++i)
    if (list[i] > max) max = list[i];
  char* sbuf = alloc_buf(max);
  char* rbuf = alloc_buf(max);
  int fd = connect_retry(host, port, 20.0);

  printf("# gz-tcp-pingpong to %s:%d, %.2f s per measurement\n", host, port, seconds);
  for (int i = 0; i < n; ++i) {
    size_t s = list[i];
    struct Stats pp = measure(fd, MODE_PINGPONG, s, seconds, sbuf, rbuf);
    struct Stats ex = measure(fd, MODE_EXCHANGE, s, seconds, sbuf, rbuf);
    struct Stats half = measure(fd, MODE_EXCHANGE, s / 2, seconds, sbuf, rbuf);
    double floor_s = ex.median < 2 * half.median ? ex.median : 2 * half.median;
    printf("RESULT tcp size=%zu rtt_us_min=%.2f rtt_us_median=%.2f rtt_us_p99=%.2f exchange_us=%.2f "
           "allreduce2_floor_us=%.2f\n",
           s, pp.min * 1e6, pp.median * 1e6, pp.p99 * 1e6, ex.median * 1e6, floor_s * 1e6);
    fflush(stdout);
  }
  /* Single stream: the bandwidth of one connection in one direction. */
  uint64_t total = (uint64_t)(stream_mib * 1024 * 1024);
  if (total > 0) {
    char ack;
    send_header(fd, MODE_STREAM, 1, CHUNK);  // warm-up: opens the congestion window
    send_all(fd, sbuf, CHUNK);
    recv_all(fd, &ack, 1);
    send_header(fd, MODE_STREAM, 1, total);
    double t0 = now_s();
    for (uint64_t left = total; left > 0;) {
      size_t k = left < CHUNK ? (size_t)left : CHUNK;
      send_all(fd, sbuf, k);
      left -= k;
    }
    if (!recv_all(fd, &ack, 1)) die("server went away");
    double dt = now_s() - t0;
    printf("RESULT tcp stream bytes=%llu seconds=%.4f MBps=%.1f\n", (unsigned long long)total, dt,
           (double)total / dt / 1e6);
  }
  close(fd);
  free(sbuf);
  free(rbuf);
  return 0;
}

static int usage(int code) {
  fprintf(code ? stderr : stdout,
          "usage: gz-tcp-pingpong server [--port P] [--bind ADDR] [--once]\n"
          "       gz-tcp-pingpong client HOST [--port P] [--sizes 4K,64K,1M,16M] [--seconds 0.3]\n"
          "                              [--stream-mib 256]\n");
  return code;
}

int main(int argc, char** argv) {
  if (argc < 2) return usage(2);
  const char* mode = argv[1];
  if (!strcmp(mode, "-h") || !strcmp(mode, "--help")) return usage(0);
  int port = 29600, once = 0;
  const char* bind_addr = "0.0.0.0";
  const char* host = NULL;
  const char* sizes = "4K,64K,1M,16M";
  double seconds = 0.3, stream_mib = 256;
  for (int i = 2; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--once")) once = 1;
    else if (!strcmp(a, "--port") && v) port = atoi(v), ++i;
    else if (!strcmp(a, "--bind") && v) bind_addr = v, ++i;
    else if (!strcmp(a, "--sizes") && v) sizes = v, ++i;
    else if (!strcmp(a, "--seconds") && v) seconds = atof(v), ++i;
    else if (!strcmp(a, "--stream-mib") && v) stream_mib = atof(v), ++i;
    else if (a[0] != '-' && !host) host = a;
    else {
      fprintf(stderr, "gz-tcp-pingpong: unknown or incomplete option '%s'\n", a);
      return usage(2);
    }
  }
  if (port < 0 || port > 65535) return usage(2);
  if (!strcmp(mode, "server")) return run_server(bind_addr, port, once);
  if (!strcmp(mode, "client") && host) return run_client(host, port, sizes, seconds > 0 ? seconds : 0.3, stream_mib);
  return usage(2);
}
