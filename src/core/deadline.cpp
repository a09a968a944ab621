#include "gz/core/deadline.h"

#include <climits>
#include <cstdio>

#include "gz/core/env.h"

namespace gz {

Duration default_timeout() {
  // Read on every call: cheap, and lets tests and launchers change it without global state.
  static const Env env = Env::from_process();
  if (auto v = env.get("GZ_TIMEOUT_S")) {
    double s = parse_double(*v, "GZ_TIMEOUT_S");
    if (s > 0) return Duration(static_cast<long long>(s * 1000));
  }
  return std::chrono::seconds(300);
}

Duration Deadline::remaining() const {
  auto now = Clock::now();
  if (now >= at_) return Duration(0);
  return std::chrono::duration_cast<Duration>(at_ - now) + Duration(1);
}

int Deadline::remaining_ms() const {
  long long ms = remaining().count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

std::string format_duration(Duration d) {
  char buf[64];
  if (d.count() < 1000)
    std::snprintf(buf, sizeof buf, "%lld ms", static_cast<long long>(d.count()));
  else
    std::snprintf(buf, sizeof buf, "%.1f s", d.count() / 1000.0);
  return buf;
}

}  // namespace gz
