#include "gz/core/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "gz/core/error.h"

extern char** environ;

namespace gz {

Env Env::from_process() {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return Env(std::move(vars));
}

std::optional<std::string> Env::get(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::string Env::get(const std::string& name, const std::string& fallback) const {
  auto v = get(name);
  return v ? *v : fallback;
}

std::optional<long long> Env::get_int(const std::string& name) const {
  auto v = get(name);
  if (!v || v->empty()) return std::nullopt;
  return parse_int(*v, "environment variable " + name);
}

long long Env::get_int(const std::string& name, long long fallback) const {
  auto v = get_int(name);
  return v ? *v : fallback;
}

bool Env::get_bool(const std::string& name, bool fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  std::string s = *v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
  GZ_THROW(InvalidArgument, "environment variable ", name, "='", *v, "' is not a boolean");
}

long long parse_int(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || end == s.c_str() || *end != '\0')
    GZ_THROW(InvalidArgument, what, ": '", s, "' is not an integer");
  return v;
}

double parse_double(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || end == s.c_str() || *end != '\0')
    GZ_THROW(InvalidArgument, what, ": '", s, "' is not a number");
  return v;
}

}  // namespace gz
