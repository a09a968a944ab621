#include "gz/store/store.h"

#include <cstring>
#include <string>

#include "gz/core/error.h"

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

int64_t Store::append(const std::string& key, const Bytes& value) {
  Bytes cur;
  for (;;) {
    Bytes next = cur;
    next.insert(next.end(), value.begin(), value.end());
    Bytes now = compare_set(key, cur, next);
    if (now == next) return static_cast<int64_t>(next.size());
    cur = std::move(now);
  }
}

namespace {
// A record: rank (4 bytes) and length (4 bytes), little-endian as the machine, then the bytes.
void put_u32(Bytes& b, uint32_t v) {
  uint8_t raw[4];
  std::memcpy(raw, &v, 4);
  b.insert(b.end(), raw, raw + 4);
}
uint32_t get_u32(const Bytes& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
}  // namespace

StoreAllgather::StoreAllgather(Store& store, std::string name, int rank, int world, const Bytes& mine)
    : store_(store), name_(std::move(name)), rank_(rank), world_(world) {
  GZ_CHECK_ARG(rank >= 0 && rank < world, "store_allgather: rank ", rank, " of ", world);
  Bytes rec;
  put_u32(rec, static_cast<uint32_t>(rank));
  put_u32(rec, static_cast<uint32_t>(mine.size()));
  rec.insert(rec.end(), mine.begin(), mine.end());
  store.append(name_ + "/records", rec);
  // The last arrival releases everyone: its add returns `world`.
  if (store.add(name_ + "/arrived", 1) == world) store.set(name_ + "/complete", to_bytes("1"));
}

std::vector<Bytes> store_allgather(Store& store, const std::string& name, int rank, int world, const Bytes& mine,
                                   Deadline deadline) {
  return StoreAllgather(store, name, rank, world, mine).collect(deadline);
}

std::vector<Bytes> StoreAllgather::collect(Deadline deadline) {
  Store& store = store_;
  const std::string& name = name_;
  const int rank = rank_, world = world_;
  std::vector<Bytes> out(world);
  std::vector<uint8_t> seen(world, 0);
  auto parse = [&](const Bytes& all) {
    size_t at = 0;
    while (at + 8 <= all.size()) {
      const uint32_t r = get_u32(all, at), n = get_u32(all, at + 4);
      if (r >= static_cast<uint32_t>(world) || at + 8 + n > all.size() || seen[r])
        GZ_THROW(PeerError, "store_allgather '", name, "': malformed or duplicate record (rank ", r, ")");
      out[r].assign(all.begin() + static_cast<std::ptrdiff_t>(at + 8),
                    all.begin() + static_cast<std::ptrdiff_t>(at + 8 + n));
      seen[r] = 1;
      at += 8 + n;
    }
  };
  auto missing = [&] {
    std::string m;
    int listed = 0;
    for (int r = 0; r < world && listed < 16; ++r)
      if (!seen[r]) m += (listed++ ? ", " : "") + std::to_string(r);
    return m;
  };
  try {
    store.wait({name + "/complete"}, deadline);
  } catch (const TimeoutError& e) {
    parse(store.get(name + "/records", Deadline::after(Duration(1000))));  // ours is there at least
    GZ_THROW(TimeoutError, "store_allgather '", name, "' on rank ", rank, "/", world, ": no word from rank(s) ",
             missing(), " (", e.what(), ")");
  }
  parse(store.get(name + "/records", deadline));
  if (!missing().empty()) GZ_THROW(PeerError, "store_allgather '", name, "': no record from rank(s) ", missing());
  return out;
}

}  // namespace gz
