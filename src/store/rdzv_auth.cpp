#include "gz/store/rdzv_auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "gz/core/error.h"

namespace gz {

std::string generate_rdzv_token() {
  uint8_t raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SystemError("cannot generate a rendezvous token: getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof raw);
  for (uint8_t b : raw) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

void check_rdzv_token(const std::string& token, const std::string& what) {
  if (token.size() > kMaxRdzvTokenBytes)
    GZ_THROW(InvalidArgument, what, ": the rendezvous token has ", token.size(), " bytes, at most ",
             kMaxRdzvTokenBytes, " are allowed");
  if (token.find_first_of(std::string("\0\n\r", 3)) != std::string::npos)
    GZ_THROW(InvalidArgument, what, ": the rendezvous token contains a NUL or newline");
}

std::string read_rdzv_token_file(const std::string& path, std::string* warning) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) GZ_THROW(InvalidArgument, "rendezvous token file '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    GZ_THROW(InvalidArgument, "rendezvous token file '", path, "' is not a regular file");
  }
  // Read a little more than a token can be, to tell "too long" from "just right".
  std::string data(kMaxRdzvTokenBytes + 2, '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::read(fd, &data[got], data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(got);
  std::string line = data.substr(0, data.find('\n'));
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!line.empty() && space(line.back())) line.pop_back();
  size_t first = 0;
  while (first < line.size() && space(line[first])) ++first;
  line.erase(0, first);
  if (line.empty()) GZ_THROW(InvalidArgument, "rendezvous token file '", path, "' is empty");
  if (data.find('\n') == std::string::npos && got == kMaxRdzvTokenBytes + 2)
    GZ_THROW(InvalidArgument, "rendezvous token file '", path, "': the token is longer than ",
             kMaxRdzvTokenBytes, " bytes");
  check_rdzv_token(line, "rendezvous token file '" + path + "'");
  if (warning) {
    warning->clear();
    if (st.st_mode & (S_IRGRP | S_IROTH))
      *warning = "rendezvous token file '" + path + "' is readable by other users (chmod 600 it)";
  }
  return line;
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
    // ::ffff:127.x.y.z
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  return false;
}

bool tokens_equal(const std::string& a, const std::string& b) {
  // Length leaks, content does not: compare every byte.
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

}  // namespace gz
