// The TCP store server's key-value state and request handler, free of sockets so that the
// fuzzer and unit tests can drive it directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/wire.h"

namespace gz::wire {

/// @brief Applies decoded requests to an in-memory map, within a byte budget.
class StoreState {
 public:
  explicit StoreState(size_t max_total_bytes) : max_total_bytes_(max_total_bytes) {}

  enum class Outcome {
    done,     ///< `reply` is ready
    blocked,  ///< get/wait on missing keys: retry after the next change (or time out)
  };

  /// @brief Handle one request (any code but hello). Never throws for bad input: errors become
  /// invalid/error replies.
  Outcome apply(const Message& request, Message& reply);

  /// @brief Keys of a get/wait request that do not exist yet.
  std::vector<std::string> missing(const Message& request) const;

  /// @brief Bumped by every change; blocked requests are retried when it moves.
  uint64_t version() const { return version_; }
  size_t total_bytes() const { return total_bytes_; }
  size_t size() const { return data_.size(); }

 private:
  bool put(const std::string& key, const std::string& value, Message& reply);
  // The ops with more to them than a lookup (the request's parts are checked by apply()).
  void add(const Message& req, Message& reply);
  void compare_set(const Message& req, Message& reply);
  void erase(const std::string& key, Message& reply);
  void append(const Message& req, Message& reply);
  std::unordered_map<std::string, std::string> data_;
  size_t total_bytes_ = 0;
  size_t max_total_bytes_;
  uint64_t version_ = 0;
};

/// @brief Parse a decimal counter value strictly ("-12"); false when malformed or out of range.
bool parse_counter(const std::string& s, int64_t& out);

}  // namespace gz::wire
