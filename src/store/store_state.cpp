#include "store/store_state.h"

namespace gz::wire {

namespace {

Message reply_of(Reply code, std::string text = {}) {
  Message m;
  m.code = static_cast<uint8_t>(code);
  if (!text.empty()) m.parts.push_back(std::move(text));
  return m;
}

std::string printable(const std::string& key) {
  std::string out;
  for (unsigned char c : key.substr(0, 200)) out += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
  if (key.size() > 200) out += "...";
  return out;
}

}  // namespace

bool parse_counter(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '-' || s[0] == '+') {
    neg = s[0] == '-';
    i = 1;
    if (s.size() == 1) return false;
  }
  uint64_t mag = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (mag > (UINT64_MAX - d) / 10) return false;
    mag = mag * 10 + d;
  }
  if (neg) {
    if (mag > static_cast<uint64_t>(INT64_MAX) + 1) return false;
    out = mag == static_cast<uint64_t>(INT64_MAX) + 1 ? INT64_MIN : -static_cast<int64_t>(mag);
  } else {
    if (mag > static_cast<uint64_t>(INT64_MAX)) return false;
    out = static_cast<int64_t>(mag);
  }
  return true;
}

bool StoreState::put(const std::string& key, const std::string& value, Message& reply) {
  auto it = data_.find(key);
  size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
  size_t now = key.size() + value.size();
  if (total_bytes_ - old + now > max_total_bytes_) {
    reply = reply_of(Reply::error, "store full: storing key '" + printable(key) + "' (" +
                                       std::to_string(now) + " bytes) would exceed the server's limit of " +
                                       std::to_string(max_total_bytes_) + " bytes");
    return false;
  }
  total_bytes_ = total_bytes_ - old + now;
  if (it == data_.end())
    data_.emplace(key, value);
  else
    it->second = value;
  ++version_;
  return true;
}

std::vector<std::string> StoreState::missing(const Message& request) const {
  std::vector<std::string> out;
  for (auto& k : request.parts)
    if (!data_.count(k)) out.push_back(k);
  return out;
}

void StoreState::add(const Message& req, Message& reply) {
  int64_t v = 0;
  auto it = data_.find(req.parts[0]);
  if (it != data_.end() && !parse_counter(it->second, v)) {
    reply = reply_of(Reply::invalid, "add: value of key '" + printable(req.parts[0]) + "' is not an integer");
    return;
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(v, req.num, &sum)) {
    reply = reply_of(Reply::invalid, "add: counter '" + printable(req.parts[0]) + "' would overflow");
    return;
  }
  if (put(req.parts[0], std::to_string(sum), reply)) reply.num = sum;
}

void StoreState::compare_set(const Message& req, Message& reply) {
  const std::string& key = req.parts[0];
  const std::string& expected = req.parts[1];
  const std::string& desired = req.parts[2];
  auto it = data_.find(key);
  if (it == data_.end()) {
    // Same semantics as MemStore (and c10d): a missing key only matches an empty expectation.
    if (!expected.empty()) {
      reply.parts.push_back(expected);
      return;
    }
    if (put(key, desired, reply)) reply.parts.push_back(desired);
  } else if (it->second == expected) {
    if (put(key, desired, reply)) reply.parts.push_back(desired);
  } else {
    reply.parts.push_back(it->second);
  }
}

void StoreState::erase(const std::string& key, Message& reply) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    reply.num = 0;
    return;
  }
  total_bytes_ -= it->first.size() + it->second.size();
  data_.erase(it);
  ++version_;
  reply.num = 1;
}

void StoreState::append(const Message& req, Message& reply) {
  auto it = data_.find(req.parts[0]);
  std::string v = it == data_.end() ? std::string() : it->second;
  v += req.parts[1];
  const int64_t len = static_cast<int64_t>(v.size());
  if (put(req.parts[0], v, reply)) reply.num = len;
}

StoreState::Outcome StoreState::apply(const Message& req, Message& reply) {
  reply = reply_of(Reply::ok);
  auto need = [&](size_t n) {
    if (req.parts.size() == n) return true;
    reply = reply_of(Reply::invalid, code_name(req.code) + " needs " + std::to_string(n) + " parts");
    return false;
  };
  switch (static_cast<Op>(req.code)) {
    case Op::set:
      if (need(2)) put(req.parts[0], req.parts[1], reply);
      return Outcome::done;
    case Op::get: {
      if (!need(1)) return Outcome::done;
      auto it = data_.find(req.parts[0]);
      if (it == data_.end()) return Outcome::blocked;
      reply.parts.push_back(it->second);
      return Outcome::done;
    }
    case Op::add:
      if (need(1)) add(req, reply);
      return Outcome::done;
    case Op::compare_set:
      if (need(3)) compare_set(req, reply);
      return Outcome::done;
    case Op::wait:
      return missing(req).empty() ? Outcome::done : Outcome::blocked;
    case Op::check:
      reply.num = missing(req).empty() ? 1 : 0;
      return Outcome::done;
    case Op::delete_key:
      if (need(1)) erase(req.parts[0], reply);
      return Outcome::done;
    case Op::num_keys:
      reply.num = static_cast<int64_t>(data_.size());
      return Outcome::done;
    case Op::append:
      if (need(2)) append(req, reply);
      return Outcome::done;
    case Op::hello:
    case Op::auth:
      reply = reply_of(Reply::invalid, code_name(req.code) + " is only valid in the handshake");
      return Outcome::done;
  }
  reply = reply_of(Reply::invalid, "unknown request " + code_name(req.code));
  return Outcome::done;
}

}  // namespace gz::wire
