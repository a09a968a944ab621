// The shm communicator's construction (create_shm_communicator: segment, header, layout),
// segment accessors, abort and sub-groups. The ops live in one file each (see shm_communicator.h).
#include "comm/shm/shm_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>
#include <thread>

#include "comm/shm/protocol.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/store/prefix_store.h"

namespace gz::comm::shm {

// ---------------------------------------------------------------- construction

ShmCommunicator::ShmCommunicator(int rank, int size, std::shared_ptr<Store> store, const ShmOptions& options,
                                 std::shared_ptr<Segment> segment, Layout layout, std::string group_id,
                                 std::unique_ptr<RankLock> lock)
    : Communicator(options.timeout),
      rank_(rank),
      size_(size),
      store_(std::move(store)),
      segment_(std::move(segment)),
      layout_(layout),
      group_id_(std::move(group_id)),
      base_(segment_->data()),
      lock_(std::move(lock)) {
  Env env = Env::from_process();
  int spin = options.spin_us >= 0 ? options.spin_us : static_cast<int>(env.get_int("GZ_SHM_SPIN_US", kDefaultSpinUs));
  spin_us_ = std::max(0, spin);
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  oversubscribed_ = static_cast<unsigned>(size) > cores;
  small_bytes_ = reinterpret_cast<const Header*>(base_)->small_bytes;
  stream_bytes_ = static_cast<size_t>(env.get_int("GZ_SHM_STREAM_BYTES", 16ll << 20));
  zero_copy_ = options.zero_copy && env.get_int("GZ_SHM_ZERO_COPY", 1) != 0;
  send_head_.assign(size, 0);
  recv_tail_.assign(size, 0);
  srcs_.assign(size, nullptr);
  scratch_.resize(kScratch);
}

ShmCommunicator::~ShmCommunicator() {
  shutdown_executor();
  // Peers waiting on this rank see its lock go (when lock_ is destroyed) and read this flag to
  // say "closed its communicator" rather than "died".
  __atomic_store_n(&ctrl(rank_).closed, 1u, __ATOMIC_SEQ_CST);
}

RankCtrl& ShmCommunicator::ctrl(int r) const {
  return reinterpret_cast<RankCtrl*>(base_ + layout_.ctrl_off)[r];
}

ChannelCtrl& ShmCommunicator::channel(int src, int dst) const {
  const size_t at = layout_.chan_off + layout_.channel_bytes() * (size_t(src) * size_ + dst);
  return *reinterpret_cast<ChannelCtrl*>(base_ + at);
}

char* ShmCommunicator::channel_slot(int src, int dst, uint32_t i) const {
  char* c = reinterpret_cast<char*>(&channel(src, dst));
  return c + sizeof(ChannelCtrl) + (i % 2) * (kLine + layout_.p2p_bytes);
}

// ---------------------------------------------------------------- abort, sub-groups

void ShmCommunicator::do_abort(const std::string& reason) {
  auto* h = reinterpret_cast<Header*>(base_);
  uint32_t expected = 0;
  if (__atomic_compare_exchange_n(&h->abort_claim, &expected, 1u, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    std::snprintf(h->reason, sizeof h->reason, "%s", reason.c_str());
    __atomic_store_n(&h->poison, static_cast<uint32_t>(rank_ + 1), __ATOMIC_SEQ_CST);
  }
  // Wake every waiter of the group: they see the poison word and throw gz::Aborted.
  for (int q = 0; q < size_; ++q) futex_wake(&ctrl(q).flag);
  for (int a = 0; a < size_; ++a)
    for (int b = 0; b < size_; ++b) {
      futex_wake(&channel(a, b).head);
      futex_wake(&channel(a, b).tail);
    }
}

std::shared_ptr<Communicator> ShmCommunicator::do_new_group(const std::vector<int>& ranks) {
  GZ_CHECK_ARG(!ranks.empty(), "new_group needs at least one rank");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_)
      GZ_THROW(InvalidArgument, "new_group: rank ", ranks[i], " out of range [0, ", size_, ")");
    if (i > 0 && ranks[i] <= ranks[i - 1])
      GZ_THROW(InvalidArgument, "new_group: ranks must be strictly ascending (got ", ranks[i - 1], " then ", ranks[i], ")");
  }
  const int id = ++subgroups_;  // same on every rank: new_group is collective over the parent
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  auto sub_store = std::make_shared<PrefixStore>("gz_shm_sub/" + group_id_ + "/" + std::to_string(id), store_);
  ShmOptions opts;
  opts.timeout = timeout();
  opts.chunk_bytes = layout_.slot_bytes;
  opts.spin_us = spin_us_;
  opts.zero_copy = zero_copy_;
  return create_shm_communicator(static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), sub_store, opts);
}

}  // namespace gz::comm::shm

// ---------------------------------------------------------------- factory

namespace gz::comm {

CommPtr create_shm_communicator(int rank, int size, std::shared_ptr<Store> store, const ShmOptions& options) {
  using namespace shm;
  if (size < 1) GZ_THROW(InvalidArgument, "shm: group size ", size, " must be >= 1");
  if (rank < 0 || rank >= size) GZ_THROW(InvalidArgument, "shm: rank ", rank, " out of range [0, ", size, ")");
  if (!store) GZ_THROW(InvalidArgument, "shm: a store is required");
  Env env = Env::from_process();
  size_t chunk = options.chunk_bytes;
  if (chunk == 0) chunk = static_cast<size_t>(env.get_int("GZ_SHM_CHUNK_BYTES", static_cast<long long>(kDefaultChunk)));
  if (chunk == 0 || chunk > (size_t(1) << 30))
    GZ_THROW(InvalidArgument, "shm: chunk_bytes ", chunk, " out of range (1 .. 1 GiB)");
  const Deadline deadline = Deadline::after(options.timeout);
  std::shared_ptr<Segment> seg;
  std::string id;
  size_t slot_bytes;
  if (rank == 0) {
    std::random_device rd;
    std::ostringstream os;
    os << std::hex << ((uint64_t(rd()) << 32) ^ rd()) << "-" << getpid();
    id = os.str();
    Layout layout(size, chunk);
    slot_bytes = layout.slot_bytes;
    seg = Segment::create("/gz-shm-" + id, layout.total);
    auto* h = reinterpret_cast<Header*>(seg->data());
    h->magic = kMagic;
    h->size = static_cast<uint32_t>(size);
    h->slot_bytes = slot_bytes;
    h->small_bytes = static_cast<uint64_t>(
        std::max<long long>(0, env.get_int("GZ_SHM_SMALL_BYTES", static_cast<long long>(kDefaultSmall))));
    try {
      store->set("gz_shm/segment", to_bytes(id + " " + std::to_string(slot_bytes)));
    } catch (...) {
      Segment::unlink(seg->name());
      throw;
    }
  } else {
    std::istringstream is(to_string(store->get("gz_shm/segment", deadline)));
    is >> id >> slot_bytes;
    if (!is || id.empty()) GZ_THROW(PeerError, "shm rank ", rank, ": malformed segment record from rank 0");
    seg = Segment::open("/gz-shm-" + id, Layout(size, slot_bytes).total);
    auto* h = reinterpret_cast<const Header*>(seg->data());
    if (h->magic != kMagic || h->size != static_cast<uint32_t>(size) || h->slot_bytes != slot_bytes)
      GZ_THROW(InvalidArgument, "shm rank ", rank, ": segment ", seg->name(), " was made for ", h->size,
               " ranks, this rank expects ", size);
  }
  Layout layout(size, slot_bytes);
  // Taken before the barrier below, so every rank holds its lock before any op can wait on it,
  // and while the name still exists (it is unlinked once every rank has mapped it).
  auto lock = std::make_unique<RankLock>(seg->name(), rank);
  auto comm = std::make_shared<ShmCommunicator>(rank, size, store, options, seg, layout, id, std::move(lock));
  auto* ctrl = reinterpret_cast<RankCtrl*>(seg->data() + layout.ctrl_off);
  __atomic_store_n(&ctrl[rank].pid, static_cast<int32_t>(getpid()), __ATOMIC_RELEASE);
  try {
    store_barrier(*store, "gz_shm/mapped", size, deadline);
  } catch (...) {
    if (rank == 0) Segment::unlink(seg->name());
    throw;
  }
  // Everyone has it mapped: remove the name now so even a SIGKILLed run leaves /dev/shm clean.
  Segment::unlink(seg->name());
  return comm;
}

}  // namespace gz::comm
