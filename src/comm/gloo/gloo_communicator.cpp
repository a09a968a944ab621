// Gloo backend: our Communicator contract on top of Gloo's TCP transport and algorithms.
#include <arpa/inet.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>

#include "comm/gloo/lazy_mesh.h"
#include "gz/comm/net_address.h"
#include "comm/gloo/store_adapter.h"
#include "comm/gloo/sync_mesh.h"
#include "comm/reduce/reduce.h"
#include "gz/comm/gloo.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"

namespace gz::comm {
namespace {

using reduce::make_reduce_fn;

// Slots of our point-to-point messages: a prefix byte above Gloo's collective prefixes (0x01..0x08).
constexpr uint64_t kP2PSlotPrefix = uint64_t{0x40} << 56;
// Slots of our own ring algorithms (reduce-scatter), tagged by the collective counter.
constexpr uint64_t kRingSlotPrefix = uint64_t{0x41} << 56;

// Gloo writes to sockets without MSG_NOSIGNAL: a peer that dies mid-write would kill this process
// with SIGPIPE instead of raising an error. Ignore SIGPIPE unless the application handles it.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO))
      signal(SIGPIPE, SIG_IGN);
  });
}

// tcp::Pair keeps signalExceptionExternal() protected (Gloo's own buffers call it when they time
// out). It is what puts a pair into its error state and wakes everything waiting on it; a derived
// class may name it, and the member pointer then applies to any tcp::Pair.
struct PairErrorAccess : ::gloo::transport::tcp::Pair {
  static constexpr auto signal_error = &PairErrorAccess::signalExceptionExternal;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(int rank, int size, std::shared_ptr<Store> store, const GlooOptions& options)
      : Communicator(options.timeout), rank_(rank), size_(size), store_(std::move(store)), options_(options) {
    GZ_CHECK_ARG(size >= 1, "gloo: group size ", size);
    GZ_CHECK_ARG(rank >= 0 && rank < size, "gloo: rank ", rank, " of ", size);
    GZ_CHECK_ARG(store_ != nullptr, "gloo: a store is required");
    ignore_sigpipe_once();
    Stopwatch sw;
    ::gloo::transport::tcp::attr attr;
    const Env env = Env::from_process();
    const std::string iface =
        options_.iface.empty() ? env.get("GZ_SOCKET_IFNAME", env.get("GZ_IFACE", "")) : options_.iface;
    if (!options_.hostname.empty()) {
      attr.hostname = options_.hostname;
    } else if (!iface.empty()) {
      // Resolved here, so that an unknown interface or a foreign address is an InvalidArgument
      // naming the variable (Gloo's own lookup would fail inside connect with less to go on).
      attr.hostname =
          listen_address_for(iface, options_.iface.empty() ? "GZ_SOCKET_IFNAME" : "GlooOptions::iface");
    } else {
      attr.hostname = "127.0.0.1";
    }
    listen_desc_ = attr.hostname + (iface.empty() || iface == attr.hostname ? "" : " (" + iface + ")");
    if (options_.p2p_only) {
      // Nothing connects now: pairs are connected on first use (lazy_mesh.h).
      try {
        device_ = ::gloo::transport::tcp::CreateDevice(attr);
      } catch (const std::exception& e) {
        GZ_THROW(InvalidArgument, "gloo: rank ", rank_, " cannot listen on ", listen_desc_, ": ", e.what());
      }
      lazy_ = std::make_unique<gloo_impl::LazyMesh>(
          rank_, size_, device_, std::make_shared<PrefixStore>("gloo_lazy", store_), options_.timeout);
      context_ = lazy_->context();
      peer_addrs_.assign(size_, std::string());
      return;
    }
    gloo_impl::StoreAdapter adapter(store_, options_.timeout, rank_, size_);
    try {
      device_ = ::gloo::transport::tcp::CreateDevice(attr);
      auto mesh = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
      mesh->setTimeout(options_.timeout);
      mesh->connectFullMesh(adapter, device_);
      context_ = std::move(mesh);
    } catch (const TimeoutError& e) {
      GZ_THROW(TimeoutError, "gloo: rank ", rank_, "/", size_, " gave up connecting after ",
               format_duration(sw.elapsed()),
               ": not every rank published its address (a missing key is the "
               "number of a rank that has not arrived): ",
               e.what());
    } catch (const gz::Error&) {
      throw;
    } catch (const std::exception& e) {
      GZ_THROW(
          PeerError, "gloo: rank ", rank_, "/", size_, " could not connect the full mesh (listening on ",
          listen_desc_, ") after ", format_duration(sw.elapsed()), ": ", e.what(), "; peers listen on ",
          advertised_addresses(adapter),
          " (every rank must reach every other's address; GZ_SOCKET_IFNAME picks the interface or address "
          "each rank listens on and advertises)");
    }
    const auto sync_records = learn_peer_addresses(sync_limits_record());
    connect_sync_mesh(sync_records, sw);
    GZ_LOG(debug, "gloo: rank ", rank_, "/", size_, " connected on ", listen_desc_, " in ",
           format_duration(sw.elapsed()));
  }

  ~GlooCommunicator() override {
    shutdown_executor();
    sync_.reset();
    try {
      if (context_) context_->closeConnections();
    } catch (...) {
    }
  }

  // "rank 0 at [10.0.0.1]:4100, ..." from what each peer published for its pair with this rank
  // (Gloo's rendezvous: per rank, one address per peer in rank order, itself left out).
  std::string advertised_addresses(const gloo_impl::StoreAdapter& adapter) const {
    const auto all = adapter.gathered_family("");
    std::string out;
    for (int i = 0; i < static_cast<int>(all.size()) && size_ > 1; ++i) {
      if (i == rank_ || all[i].empty()) continue;
      const size_t n = all[i].size() / static_cast<size_t>(size_ - 1);
      const size_t at = static_cast<size_t>(rank_ > i ? rank_ - 1 : rank_) * n;
      if (n == 0 || at + n > all[i].size()) continue;
      try {
        const ::gloo::transport::tcp::Address a(
            std::vector<char>(all[i].begin() + at, all[i].begin() + at + n));
        out += (out.empty() ? "" : ", ") + detail::concat("rank ", i, " at ", a.str());
      } catch (...) {
      }
    }
    return out.empty() ? std::string("(addresses not known yet)") : out;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }

  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override {
    check_aborted();
    GZ_CHECK_ARG(!ranks.empty(), "gloo new_group: empty rank list");
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size_)
        GZ_THROW(InvalidArgument, "gloo new_group: rank ", ranks[i], " out of range [0, ", size_, ")");
      if (i > 0 && ranks[i] <= ranks[i - 1])
        GZ_THROW(InvalidArgument, "gloo new_group: ranks must be ascending and unique");
    }
    // Every member of this group calls new_group in the same order, so the counter agrees.
    int id = ++groups_;
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    std::string key = "gloo_group/" + std::to_string(id);
    for (int r : ranks) key += "_" + std::to_string(r);
    GlooOptions sub = options_;
    sub.p2p_only = false;  // groups run collectives
    return std::make_shared<GlooCommunicator>(static_cast<int>(it - ranks.begin()),
                                              static_cast<int>(ranks.size()),
                                              std::make_shared<PrefixStore>(key, store_), sub);
  }

 protected:
  void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    const size_t bytes = count * dtype_size(dtype);
    if (sync_ && bytes <= sync_->limits().exchange_max) {
      run_sync("allreduce", [&](int* peer) {
        gloo_impl::sync_exchange_allreduce(*sync_, data, count, dtype_size(dtype), reduce_fn(dtype, op),
                                           op_deadline(), peer);
      });
      if (op == ReduceOp::avg) reduce::divide_in_place(data, count, dtype, size_);
      return;
    }
    if (ring()) {
      std::vector<size_t> offset(size_), counts(size_);
      for (int b = 0; b < size_; ++b) {
        offset[b] = b * count / size_;
        counts[b] = (b + 1) * count / size_ - offset[b];
      }
      run_sync("allreduce", [&](int* peer) {
        const auto& fn = reduce_fn(dtype, op);
        gloo_impl::sync_ring(*sync_, data, dtype_size(dtype), offset, counts, &fn, true, op_deadline(), peer);
      });
      if (op == ReduceOp::avg) reduce::divide_in_place(data, count, dtype, size_);
      return;
    }
    run("allreduce", -1, [&] {
      if (size_ > 1) {
        ::gloo::AllreduceOptions& o = cached_allreduce(data, count, dtype, op);
        o.setTag(tag());
        o.setTimeout(op_timeout());
        ::gloo::allreduce(o);
      }
    });
    if (op == ReduceOp::avg) reduce::divide_in_place(data, count, dtype, size_);
  }

  void do_broadcast(void* data, size_t count, DType dtype, int root) override {
    if (count == 0 || size_ == 1) return;
    run("broadcast", root == rank_ ? -1 : root, [&] {
      ::gloo::BroadcastOptions o(context_);
      o.setOutput<uint8_t>(static_cast<uint8_t*>(data), count * dtype_size(dtype));
      o.setRoot(root);
      o.setTag(tag());
      o.setTimeout(op_timeout());
      ::gloo::broadcast(o);
    });
  }

  void do_allgather(const void* send, void* recv, size_t count, DType dtype) override {
    do_allgatherv(send, recv, std::vector<size_t>(size_, count), dtype);
  }

  void do_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) override {
    const size_t es = dtype_size(dtype);
    size_t total = 0, offset = 0;
    for (int r = 0; r < size_; ++r) {
      if (r < rank_) offset += counts[r];
      total += counts[r];
    }
    auto* out = static_cast<uint8_t*>(recv);
    const auto* in = static_cast<const uint8_t*>(send);
    const size_t mine = counts[rank_] * es;
    if (size_ == 1 || total == 0) {
      if (mine && in != out + offset * es) std::memmove(out + offset * es, in, mine);
      return;
    }
    if (ring()) {
      if (in != out + offset * es && mine) std::memmove(out + offset * es, in, mine);
      std::vector<size_t> offsets(size_, 0);
      for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
      run_sync("allgatherv", [&](int* peer) {
        gloo_impl::sync_ring(*sync_, out, es, offsets, counts, nullptr, true, op_deadline(), peer);
      });
      return;
    }
    run("allgatherv", -1, [&] {
      ::gloo::AllgathervOptions o(context_);
      std::vector<size_t> bytes(counts.size());
      for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * es;
      // In place when the caller's block already sits at its place in recv.
      if (in != out + offset * es) {
        if (mine) std::memmove(out + offset * es, in, mine);
      }
      o.setOutput<uint8_t>(out, bytes);
      o.setTag(tag());
      o.setTimeout(op_timeout());
      ::gloo::allgatherv(o);
    });
  }

  void do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override {
    // Gloo 0.5 has no reduce-scatter over unbound buffers: a ring over our own send/recv. Step s
    // sends block (rank-s-1) to the right and folds block (rank-s-2) from the left into ours;
    // after size-1 steps block `rank` holds the full reduction. Traffic: (size-1)/size of the data.
    const size_t es = dtype_size(dtype);
    const size_t block = recv_count * es;
    if (recv_count == 0) return;
    if (size_ == 1) {
      std::memmove(recv, send, block);
      if (op == ReduceOp::avg) reduce::divide_in_place(recv, recv_count, dtype, size_);
      return;
    }
    scratch_.resize(block * size_);
    std::memcpy(scratch_.data(), send, block * size_);
    if (ring()) {
      std::vector<size_t> offset(size_), counts(size_, recv_count);
      for (int b = 0; b < size_; ++b) offset[b] = b * recv_count;
      run_sync("reduce_scatter", [&](int* peer) {
        const auto& fn = reduce_fn(dtype, op);
        gloo_impl::sync_ring(*sync_, scratch_.data(), es, offset, counts, &fn, false, op_deadline(), peer);
      });
      std::memcpy(recv, scratch_.data() + block * rank_, block);
      if (op == ReduceOp::avg) reduce::divide_in_place(recv, recv_count, dtype, size_);
      return;
    }
    incoming_.resize(block);
    const uint64_t slot = kRingSlotPrefix | tag();
    const int right = (rank_ + 1) % size_, left = (rank_ - 1 + size_) % size_;
    auto reduce = make_reduce_fn(dtype, op);
    run("reduce_scatter", -1, [&] {
      Deadline dl = op_deadline();
      auto out = context_->createUnboundBuffer(scratch_.data(), block * size_);
      auto in = context_->createUnboundBuffer(incoming_.data(), block);
      for (int s = 0; s + 1 < size_; ++s) {
        const size_t send_idx = static_cast<size_t>((rank_ - s - 1 + 2 * size_) % size_);
        const size_t recv_idx = static_cast<size_t>((rank_ - s - 2 + 2 * size_) % size_);
        in->recv(left, slot);
        out->send(right, slot, send_idx * block, block);
        if (!in->waitRecv(std::max<Duration>(dl.remaining(), Duration(1))))
          GZ_THROW(Aborted, "gloo reduce_scatter aborted");
        uint8_t* acc = scratch_.data() + recv_idx * block;
        reduce(acc, acc, incoming_.data(), recv_count);
        if (!out->waitSend(std::max<Duration>(dl.remaining(), Duration(1))))
          GZ_THROW(Aborted, "gloo reduce_scatter aborted");
      }
    });
    std::memcpy(recv, scratch_.data() + block * rank_, block);
    if (op == ReduceOp::avg) reduce::divide_in_place(recv, recv_count, dtype, size_);
  }

  void do_reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) override {
    if (count == 0) return;
    run("reduce", -1, [&] {
      if (size_ > 1) {
        ::gloo::ReduceOptions o(context_);
        set_output(o, data, count, dtype);
        o.setRoot(root);
        o.setReduceFunction(make_reduce_fn(dtype, op));
        o.setTag(tag());
        o.setTimeout(op_timeout());
        ::gloo::reduce(o);
      }
    });
    if (op == ReduceOp::avg && rank_ == root) reduce::divide_in_place(data, count, dtype, size_);
  }

  void do_barrier() override {
    if (size_ == 1) return;
    run("barrier", -1, [&] {
      ::gloo::BarrierOptions o(context_);
      o.setTag(tag());
      o.setTimeout(op_timeout());
      ::gloo::barrier(o);
    });
  }

  void do_send(const void* data, size_t count, DType dtype, int peer, int tag) override {
    p2p("send", const_cast<void*>(data), count * dtype_size(dtype), peer, tag, true);
  }

  void do_recv(void* data, size_t count, DType dtype, int peer, int tag) override {
    p2p("recv", data, count * dtype_size(dtype), peer, tag, false);
  }

  void do_abort(const std::string& reason) override {
    // Gloo's algorithms wait on buffers we never see. Putting every pair into its error state
    // wakes each of them (pending sends and receives, bound or not) with an exception, which run()
    // turns into gz::Aborted; it also closes the sockets, so peers blocked on us fail now instead
    // of at their own deadlines. The synchronous mesh first shuts its sockets down: a reader
    // blocked there holds its pair's lock until recv() returns.
    if (sync_) sync_->abort(reason);
    if (lazy_) {  // its pairs, created on demand, under its own lock
      lazy_->abort(reason);
      return;
    }
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      try {
        if (auto* pair = dynamic_cast<::gloo::transport::tcp::Pair*>(context_->getPair(j).get()))
          (pair->*PairErrorAccess::signal_error)("gz: communicator aborted: " + reason);
      } catch (...) {
      }
    }
  }

 private:
  // Collective tags count collectives only: send/recv advance the sequence on some ranks only.
  uint32_t tag() { return coll_tag_++; }
  // What is left of this op's own deadline (at least 1 ms: Gloo treats 0 as "use the default").
  Duration op_timeout() const { return std::max(op_deadline().remaining(), Duration(1)); }

  // The synchronous mesh (GlooOptions::sync_max_bytes, segment_bytes). Every rank must pick the
  // same algorithm for an op and cut its messages alike: the limits are agreed (minimum over the
  // group) before connecting. A point-to-point-only communicator has none (its groups do).
  std::string sync_limits_record() const {
    if (size_ == 1) return "0 0 0";
    const Env env = Env::from_process();
    long long want_exchange = options_.sync_max_bytes, want_segment = options_.segment_bytes;
    if (want_exchange < 0) want_exchange = env.get_int("GZ_GLOO_SYNC_MAX", kDefaultSyncMax);
    if (want_segment < 0) want_segment = env.get_int("GZ_GLOO_SEGMENT", kDefaultSegment);
    if (options_.p2p_only) want_exchange = want_segment = 0;
    want_exchange = std::clamp<long long>(want_exchange, 0, kMaxSyncMax);
    want_segment = std::clamp<long long>(want_segment, 0, kMaxSegment);
    return gloo_impl::sync_limits_record(static_cast<size_t>(want_exchange),
                                         static_cast<size_t>(want_segment));
  }

  void connect_sync_mesh(const std::vector<std::string>& records, const Stopwatch& sw) {
    if (size_ == 1) return;
    try {
      const auto limits = gloo_impl::agree_sync_limits(records);
      if (!limits.any()) return;
      sync_ = std::make_unique<gloo_impl::SyncMesh>(rank_, size_, limits, device_,
                                                    std::make_shared<PrefixStore>("gloo_sync", store_),
                                                    options_.timeout);
      // No rank may write to the synchronous mesh before every rank has switched its pairs to
      // synchronous mode: a message arriving earlier is half read by the event loop (or waits
      // there for an inbox not yet registered) and the stream is lost. A barrier on the first mesh.
      ::gloo::BarrierOptions b(context_);
      b.setTag(tag());
      b.setTimeout(options_.timeout);
      ::gloo::barrier(b);
    } catch (const TimeoutError& e) {
      GZ_THROW(TimeoutError, "gloo: rank ", rank_, "/", size_,
               " gave up connecting the synchronous mesh after ", format_duration(sw.elapsed()), ": ",
               e.what());
    } catch (const gz::Error&) {
      throw;
    } catch (const std::exception& e) {
      GZ_THROW(PeerError, "gloo: rank ", rank_, "/", size_, " could not connect the synchronous mesh after ",
               format_duration(sw.elapsed()), ": ", e.what());
    }
  }

  // Larger all-reduces, reduce-scatter and all-gather run the pipelined ring on the synchronous mesh.
  bool ring() const { return sync_ && sync_->limits().segment > 0; }

  // run() for an op on the synchronous mesh: fn(&peer) names the peer it is working with. A
  // failure poisons the whole mesh (sync_mesh.h), so every peer fails now rather than at its
  // deadline and no rank goes on with a mesh that is out of step. When the op's deadline passed
  // (the watchdog shut the mesh down mid-call), that is what it says.
  template <typename F>
  void run_sync(const char* op, F&& fn) {
    int peer = -1;
    sync_->set_recorder(flight_recorder());  // peers awaited and arrived, for dumps
    Stopwatch sw;
    const Duration budget = op_timeout();
    try {
      run(
          op, -1,
          [&] {
            try {
              fn(&peer);
            } catch (const ::gloo::Exception& e) {
              if (!sync_->expired() || aborted()) throw;
              throw TimeoutError(
                  detail::concat(op_failure(op, peer, sw.elapsed()), " (deadline ", format_duration(budget),
                                 " for the whole op; ", peer >= 0 ? "rank " + std::to_string(peer) : "a peer",
                                 " is dead, stuck, slow or trickling; Gloo: ", e.what(), ")"),
                  peer);
            }
          },
          &peer);
    } catch (const std::exception& e) {
      sync_->poison(e.what());
      throw;
    }
  }

  const gloo_impl::ReduceFn& reduce_fn(DType dtype, ReduceOp op) {
    auto& fn = reduce_fns_[static_cast<size_t>(dtype)][static_cast<size_t>(op)];
    if (!fn) fn = make_reduce_fn(dtype, op);
    return fn;
  }

  // Gloo's all-reduce options for (data, count, dtype, op), built once and reused: the options own
  // the unbound buffer registered over `data`, and destroying an unbound buffer spins (yield) until
  // Gloo's event-loop thread drops its last reference to it. Per op only the tag and the timeout
  // change. Unbound buffers carry no slot, so hits and misses are a local matter (ranks need not
  // agree). Least recently used entries are dropped beyond kAllreduceCacheSize.
  ::gloo::AllreduceOptions& cached_allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
    const AllreduceKey key{data, count, dtype, op};
    for (auto it = allreduce_cache_.begin(); it != allreduce_cache_.end(); ++it) {
      if (it->first == key) {
        if (it != allreduce_cache_.begin())
          allreduce_cache_.splice(allreduce_cache_.begin(), allreduce_cache_, it);
        return *allreduce_cache_.front().second;
      }
    }
    auto o = std::make_unique<::gloo::AllreduceOptions>(context_);
    set_output(*o, data, count, dtype);
    o->setReduceFunction(make_reduce_fn(dtype, op));
    allreduce_cache_.emplace_front(key, std::move(o));
    if (allreduce_cache_.size() > kAllreduceCacheSize) allreduce_cache_.pop_back();
    return *allreduce_cache_.front().second;
  }

  template <typename Opts>
  void set_output(Opts& o, void* data, size_t count, DType dtype) {
    switch (dtype_size(dtype)) {
      case 1:
        o.template setOutput<uint8_t>(static_cast<uint8_t*>(data), count);
        break;
      case 2:
        o.template setOutput<uint16_t>(static_cast<uint16_t*>(data), count);
        break;
      case 4:
        o.template setOutput<uint32_t>(static_cast<uint32_t*>(data), count);
        break;
      default:
        o.template setOutput<uint64_t>(static_cast<uint64_t*>(data), count);
        break;
    }
  }

  void p2p(const char* op, void* data, size_t bytes, int peer, int tag, bool is_send) {
    // Gloo cannot post zero-byte buffers; a one-byte token keeps send/recv matched.
    uint8_t token = 0;
    void* ptr = bytes ? data : &token;
    size_t n = bytes ? bytes : 1;
    uint64_t slot = kP2PSlotPrefix | static_cast<uint32_t>(tag);
    run(op, peer, [&] {
      if (lazy_) lazy_->ensure(peer, op_deadline());
      auto buf = context_->createUnboundBuffer(ptr, n);
      check_aborted();
      bool ok;
      if (is_send) {
        buf->send(peer, slot);
        ok = buf->waitSend(op_timeout());
      } else {
        buf->recv(peer, slot);
        ok = buf->waitRecv(op_timeout());
      }
      if (!ok) GZ_THROW(Aborted, "gloo ", op, " aborted");
    });
  }

  // Gloo's errors name the peer by socket address ("[10.0.0.2]:41234"). Each rank publishes the
  // address of its end of every pair, so an error can be turned into a rank number.
  std::vector<std::string> learn_peer_addresses(const std::string& sync_record) {
    if (size_ == 1) return {};
    std::string mine = "sync " + sync_record + "\n";
    for (int j = 0; j < size_; ++j)
      if (j != rank_) mine += std::to_string(j) + " " + context_->getPair(j)->address().str() + "\n";
    // One gather: a constant number of store round trips per rank, whatever the group size. It
    // also carries each rank's record for the synchronous mesh's limits.
    auto all =
        store_allgather(*store_, "gloo_pair_addrs", rank_, size_, to_bytes(mine), Deadline::after(timeout()));
    peer_addrs_.assign(size_, std::string());
    std::vector<std::string> sync_records(size_);
    const std::string me = std::to_string(rank_) + " ";
    for (int j = 0; j < size_; ++j) {
      std::string theirs = to_string(all[j]);
      size_t pos = 0;
      while (pos < theirs.size()) {
        size_t nl = theirs.find('\n', pos);
        if (nl == std::string::npos) nl = theirs.size();
        std::string line = theirs.substr(pos, nl - pos);
        if (line.compare(0, 5, "sync ") == 0)
          sync_records[j] = line.substr(5);
        else if (j != rank_ && line.compare(0, me.size(), me) == 0)
          peer_addrs_[j] = line.substr(me.size());
        pos = nl + 1;
      }
    }
    return sync_records;
  }

  // "peer rank 3 (addr)" when the Gloo message names a known peer address (and *rank = 3), else "".
  std::string peer_in(const std::string& msg, int* rank) const {
    for (size_t j = 0; j < peer_addrs_.size(); ++j)
      if (!peer_addrs_[j].empty() && msg.find(peer_addrs_[j]) != std::string::npos) {
        *rank = static_cast<int>(j);
        return detail::concat("peer rank ", j, " (", peer_addrs_[j], ")");
      }
    return std::string();
  }

  // Runs one Gloo call and turns its exceptions into ours, with rank, op, sequence and time.
  // `failed_peer`, when given and set (>= 0) by fn, names the peer whose connection failed.
  template <typename F>
  void run(const char* op, int peer, F&& fn, const int* failed_peer = nullptr) {
    check_aborted();
    Stopwatch sw;
    const Duration budget = op_timeout();
    try {
      // A collective on a point-to-point communicator: every rank is here, connect every pair.
      if (lazy_ && std::strcmp(op, "send") != 0 && std::strcmp(op, "recv") != 0)
        lazy_->ensure_all(op_deadline());
      fn();
    } catch (const Aborted&) {
      throw;
    } catch (const gz::Error&) {
      throw;
    } catch (const ::gloo::Exception& e) {  // IoException, EnforceNotMet, ...
      const int who = failed_peer && *failed_peer >= 0 ? *failed_peer : peer;
      translate(op_failure(op, who, sw.elapsed()), budget, e.what(), who);
    }
  }

  [[noreturn]] void translate(const std::string& where, Duration budget, const std::string& msg,
                              int op_peer) {
    auto cause = std::make_exception_ptr(std::runtime_error("Gloo: " + msg));
    if (aborted()) {
      try {
        check_aborted();
      } catch (const Aborted& a) {
        throw Aborted(where + ": " + a.what(), op_peer, cause);
      }
    }
    bool timed_out = msg.find("Timed out") != std::string::npos ||
                     msg.find("timed out") != std::string::npos || msg.find("timeout") != std::string::npos;
    int peer = op_peer;
    std::string who = peer_in(msg, &peer);
    if (timed_out)
      throw TimeoutError(detail::concat(where, " (deadline ", format_duration(budget), "; ",
                                        who.empty() ? std::string("a peer") : who,
                                        " is dead, stuck or slow; Gloo: ", msg, ")"),
                         peer, cause);
    throw PeerError(detail::concat(where, ": connection to ", who.empty() ? std::string("a peer") : who,
                                   " lost (Gloo: ", msg, ")"),
                    peer, cause);
  }

  int rank_;
  int size_;
  std::shared_ptr<Store> store_;
  GlooOptions options_;
  std::string listen_desc_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> incoming_;
  struct AllreduceKey {
    void* data;
    size_t count;
    DType dtype;
    ReduceOp op;
    bool operator==(const AllreduceKey& o) const {
      return data == o.data && count == o.count && dtype == o.dtype && op == o.op;
    }
  };
  static constexpr size_t kAllreduceCacheSize = 64;
  static constexpr long long kDefaultSyncMax = 64 << 10;
  static constexpr long long kMaxSyncMax = 256 << 10;
  static constexpr long long kDefaultSegment = 256 << 10;
  static constexpr long long kMaxSegment = 4 << 20;
  std::unique_ptr<gloo_impl::SyncMesh> sync_;
  std::unique_ptr<gloo_impl::LazyMesh> lazy_;  // p2p_only: pairs connected on first use
  gloo_impl::ReduceFn reduce_fns_[8][5];
  std::list<std::pair<AllreduceKey, std::unique_ptr<::gloo::AllreduceOptions>>> allreduce_cache_;
  std::vector<std::string> peer_addrs_;  // peer rank -> its socket address as Gloo prints it
  int groups_ = 0;
  uint32_t coll_tag_ = 0;
};

}  // namespace

CommPtr create_gloo_communicator(int rank, int size, std::shared_ptr<Store> store,
                                 const GlooOptions& options) {
  return std::make_shared<GlooCommunicator>(rank, size, std::move(store), options);
}

}  // namespace gz::comm
