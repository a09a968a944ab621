// Environment parsing. Functions take an Env so tests never touch the process environment.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace gz {

/// @brief A snapshot of environment variables.
class Env {
 public:
  Env() = default;
  explicit Env(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  /// @brief Snapshot of this process's environment.
  static Env from_process();

  std::optional<std::string> get(const std::string& name) const;
  bool has(const std::string& name) const { return vars_.count(name) != 0; }
  /// @brief The variable as an integer; throws InvalidArgument naming it when malformed.
  std::optional<long long> get_int(const std::string& name) const;
  long long get_int(const std::string& name, long long fallback) const;
  std::string get(const std::string& name, const std::string& fallback) const;
  /// @brief "1", "true", "yes", "on" (any case) are true; "0", "false", "no", "off", "" false.
  bool get_bool(const std::string& name, bool fallback) const;
  void set(const std::string& name, const std::string& value) { vars_[name] = value; }
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

/// @brief Parse a base-10 integer, whole string; throws InvalidArgument mentioning `what`.
long long parse_int(const std::string& s, const std::string& what);
/// @brief Parse a floating-point number, whole string; throws InvalidArgument mentioning `what`.
double parse_double(const std::string& s, const std::string& what);

}  // namespace gz
