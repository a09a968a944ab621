#include "p2p_links.h"

#include <algorithm>

#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"

namespace gz::python {

struct P2PLinks::Link {
  struct Job {
    Body body;
    comm::OpOptions opts;
    comm::WorkPtr work;
  };
  int src = 0, dst = 0;  // group ranks: the link carries messages src -> dst
  bool sending = false;  // this process is src
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;      // guarded by mu
  bool stop = false;          // guarded by mu
  std::string aborted;        // guarded by mu
  comm::CommPtr comm;         // created on the link's thread by its first op; guarded by mu once set
  std::exception_ptr broken;  // creation failed: every op fails with it (link thread only)
  std::thread thread;

  void run(const P2PLinks& owner);
  void fail_queued(const std::string& why);
};

P2PLinks::P2PLinks(std::shared_ptr<Store> store, int rank, std::string backend, Duration timeout)
    : store_(std::move(store)), rank_(rank), backend_(std::move(backend)), timeout_(timeout) {}

P2PLinks::~P2PLinks() {
  abort("gz process group destroyed with point-to-point ops pending");
  std::map<std::pair<int, bool>, std::unique_ptr<Link>> links;
  {
    std::lock_guard<std::mutex> lock(mu_);
    links.swap(links_);
  }
  for (auto& [key, l] : links) {
    {
      std::lock_guard<std::mutex> lock(l->mu);
      l->stop = true;
    }
    l->cv.notify_all();
    if (l->thread.joinable()) l->thread.join();
  }
}

P2PLinks::Link& P2PLinks::link(int peer, bool sending) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.empty()) GZ_THROW(Aborted, "gz backend: process group aborted: ", aborted_);
  auto& slot = links_[{peer, sending}];
  if (!slot) {
    slot = std::make_unique<Link>();
    slot->src = sending ? rank_ : peer;
    slot->dst = sending ? peer : rank_;
    slot->sending = sending;
    Link* l = slot.get();
    l->thread = std::thread([this, l] { l->run(*this); });
  }
  return *slot;
}

comm::WorkPtr P2PLinks::submit(int peer, bool sending, const comm::OpOptions& o, Body body) {
  Link& l = link(peer, sending);
  auto work = std::make_shared<comm::Work>(*o.deadline);
  {
    std::lock_guard<std::mutex> lock(l.mu);
    if (!l.aborted.empty()) GZ_THROW(Aborted, "gz backend: point-to-point link aborted: ", l.aborted);
    l.queue.push_back({std::move(body), o, work});
  }
  l.cv.notify_all();
  return work;
}

void P2PLinks::abort(const std::string& reason) {
  std::vector<Link*> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = reason.empty() ? "aborted" : reason;
    for (auto& [key, l] : links_) all.push_back(l.get());
  }
  for (Link* l : all) {
    comm::CommPtr c;
    {
      std::lock_guard<std::mutex> lock(l->mu);
      if (l->aborted.empty()) l->aborted = reason;
      c = l->comm;
    }
    l->fail_queued(reason);
    if (c) c->abort(reason);  // wakes the op now running
  }
}

void P2PLinks::Link::fail_queued(const std::string& why) {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu);
    dropped.swap(queue);
  }
  for (auto& j : dropped)
    j.work->finish(
        std::make_exception_ptr(Aborted("gz backend: point-to-point op aborted before it ran: " + why)));
}

void P2PLinks::Link::run(const P2PLinks& owner) {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      job = std::move(queue.front());
      queue.pop_front();
    }
    std::exception_ptr err;
    try {
      if (broken) std::rethrow_exception(broken);
      if (!comm) {
        // Both ends create the link on their first op over it; the link's rank 0 is the sender.
        comm::CommOptions co;
        co.backend = owner.backend_;
        co.rank = sending ? 0 : 1;
        co.size = 2;
        co.name = "p2p" + std::to_string(src) + "-" + std::to_string(dst);  // flight-recorder dumps
        // Bounded by this op's deadline: a peer that never comes fails it in time.
        co.timeout = std::max(Duration(1), std::min(owner.timeout_, job.opts.deadline->remaining()));
        co.store = std::make_shared<PrefixStore>("gz_p2p/" + std::to_string(src) + "-" + std::to_string(dst),
                                                 owner.store_);
        try {
          auto c = comm::create_communicator(co);
          std::lock_guard<std::mutex> lock(mu);
          comm = std::move(c);
          if (!aborted.empty()) comm->abort(aborted);
        } catch (const std::exception& e) {
          broken = std::make_exception_ptr(
              PeerError(detail::concat("gz backend: point-to-point link ", src, " -> ", dst,
                                       " could not be set up (rank ", sending ? dst : src,
                                       " did not come for its first send/recv with this rank): ", e.what()),
                        sending ? dst : src, std::current_exception()));
          std::rethrow_exception(broken);
        }
      }
      job.body(*comm, job.opts);
    } catch (...) {
      err = std::current_exception();
    }
    job.work->finish(err);
  }
}

}  // namespace gz::python
