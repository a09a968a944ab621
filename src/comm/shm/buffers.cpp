// alloc_buffer's zero-copy blocks: every rank creates one /dev/shm object per call and maps every
// peer's, so an all-reduce of that memory reduces straight between the ranks' blocks
// (allreduce.cpp). When any rank cannot share its block, all ranks fall back to ordinary memory.
#include <algorithm>

#include "comm/shm/shm_communicator.h"
#include "gz/core/log.h"

namespace gz::comm::shm {

std::shared_ptr<ShmCommunicator::Shared> ShmCommunicator::find_shared(const void* p, size_t bytes,
                                                                      size_t* offset) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (auto& b : shared_->items) {
    const char* start = b->base[rank_];
    if (c >= start && c + bytes <= start + b->bytes) {
      *offset = static_cast<size_t>(c - start);
      return b;
    }
  }
  return nullptr;
}

std::shared_ptr<void> ShmCommunicator::do_alloc_buffer(size_t bytes) {
  if (size_ == 1 || bytes == 0) return Communicator::do_alloc_buffer(bytes);
  const uint64_t id = buffers_++;
  const size_t rounded = round_up(bytes, 4096);
  const Deadline deadline = op_deadline();
  const std::string key = "gz_shm_buf/" + group_id_ + "/" + std::to_string(id) + "/";
  // group_id_ ends with rank 0's pid, as the segment's name does (tests look for leftovers by it).
  auto name_of = [&](int r) {
    return "/gz-shm-b" + std::to_string(id) + "-r" + std::to_string(r) + "-" + group_id_;
  };
  auto b = std::make_shared<Shared>();
  b->id = id;
  b->bytes = rounded;
  b->maps.resize(size_);
  b->base.resize(size_);
  std::string why;
  bool off = false;  // some rank has zero copy switched off: fall back quietly
  // Every rank learns whether every other rank managed, so all fall back together (a small
  // /dev/shm, as in containers, must cost speed, not a failed run).
  auto agree = [&](const std::string& round, const char* mine) {
    store_->set(key + round + std::to_string(rank_), to_bytes(mine));
    bool ok = std::string(mine) == "ok";
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::string v = to_string(store_->get(key + round + std::to_string(q), deadline));
      if (v == "ok") continue;
      if (v == "off")
        off = true;
      else if (why.empty())
        why = "rank " + std::to_string(q) + " failed to share its block";
      ok = false;
    }
    return ok;
  };
  // Whatever happens below (a peer that never answers throws), the name leaves /dev/shm.
  struct Unlink {
    const std::shared_ptr<Segment>& seg;
    ~Unlink() {
      try {
        if (seg) Segment::unlink(seg->name());
      } catch (const std::exception& e) {
        GZ_LOG(warn, e.what());
      }
    }
  } unlink_own{b->maps[rank_]};
  const char* state = "off";
  if (zero_copy_) {
    try {
      b->maps[rank_] = Segment::create(name_of(rank_), rounded);
      state = "ok";
    } catch (const std::exception& e) {
      why = e.what();
      state = "fail";
    }
  } else {
    off = true;
  }
  bool ok = agree("created/", state);
  if (ok) {
    state = "fail";
    try {
      for (int q = 0; q < size_; ++q)
        if (q != rank_) b->maps[q] = Segment::open(name_of(q), rounded);
      state = "ok";
    } catch (const std::exception& e) {
      why = e.what();
    }
    ok = agree("mapped/", state);
  }
  if (!ok) {
    if (!why.empty())
      GZ_LOG(warn, "shm rank ", rank_, ": alloc_buffer(", bytes, ") falls back to ordinary memory (", why,
             "); all-reduces of it stage through the shared slots");
    else if (off)
      GZ_LOG(debug, "shm rank ", rank_, ": alloc_buffer(", bytes, "): zero copy is off on some rank");
    return Communicator::do_alloc_buffer(bytes);
  }
  for (int q = 0; q < size_; ++q) b->base[q] = b->maps[q]->data();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->items.push_back(b);
  }
  std::weak_ptr<SharedTable> table = shared_;
  char* mine = b->base[rank_];
  return std::shared_ptr<void>(mine, [table, b](void*) mutable {
    if (auto t = table.lock()) {
      std::lock_guard<std::mutex> lock(t->mu);
      t->items.erase(std::remove(t->items.begin(), t->items.end(), b), t->items.end());
    }
    b.reset();  // unmaps this process's view of every rank's block
  });
}

}  // namespace gz::comm::shm
