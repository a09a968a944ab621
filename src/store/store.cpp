#include "gz/store/store.h"

#include <string>

namespace gz {

Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

void store_barrier(Store& store, const std::string& name, int world, Deadline deadline) {
  // The last arrival publishes a release key; everyone waits for it. Counter keys are
  // per-name, so a barrier name must be used once per group (callers append a sequence number).
  int64_t n = store.add(name + "/arrived", 1);
  if (n == world) store.set(name + "/released", to_bytes("1"));
  store.wait({name + "/released"}, deadline);
}

}  // namespace gz
