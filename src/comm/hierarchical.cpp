// Hierarchical collectives: node-local communicator + inter-node communicators ("rails").
#include "gz/comm/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "comm/reduce/reduce.h"
#include "gz/core/error.h"
#include "gz/store/prefix_store.h"

namespace gz::comm {

NodeLayout NodeLayout::from_labels(const std::vector<std::string>& labels) {
  NodeLayout l;
  std::map<std::string, int> index;
  for (size_t r = 0; r < labels.size(); ++r) {
    auto it = index.find(labels[r]);
    if (it == index.end()) {
      it = index.emplace(labels[r], static_cast<int>(l.ranks_of_node.size())).first;
      l.ranks_of_node.emplace_back();
    }
    l.node_of_rank.push_back(it->second);
    l.ranks_of_node[it->second].push_back(static_cast<int>(r));
  }
  return l;
}

bool NodeLayout::uniform() const {
  for (const auto& n : ranks_of_node)
    if (n.size() != ranks_of_node.front().size()) return false;
  return true;
}

namespace {

class HierarchicalCommunicator : public Communicator {
 public:
  HierarchicalCommunicator(int rank, NodeLayout layout, CommPtr local, CommPtr flat, CommPtr leaders, CommPtr rail,
                           InterMaker inter, std::shared_ptr<Store> store, Duration timeout)
      : Communicator(timeout),
        rank_(rank),
        layout_(std::move(layout)),
        node_(layout_.node_of_rank[rank]),
        local_(std::move(local)),
        flat_(std::move(flat)),
        leaders_(std::move(leaders)),
        rail_(std::move(rail)),
        uniform_(layout_.uniform()),
        inter_(std::move(inter)),
        store_(std::move(store)) {
    if (inter_.backend.empty() && flat_) inter_.backend = flat_->backend();
  }

  ~HierarchicalCommunicator() override { shutdown_executor(); }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(layout_.node_of_rank.size()); }
  std::string backend() const override { return "hier(" + local_->backend() + "+" + inter_.backend + ")"; }

  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override {
    check_aborted();
    if (flat_) return flat_->new_group(ranks);
    // No mesh over all ranks: the group connects only its members, under a name every rank
    // derives alike (new_group is collective, so the counter agrees).
    GZ_CHECK_ARG(!ranks.empty(), "hier new_group: empty rank list");
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] < 0 || ranks[i] >= size() || (i > 0 && ranks[i] <= ranks[i - 1]))
        GZ_THROW(InvalidArgument, "hier new_group: ranks must be ascending, unique and in [0, ", size(), ")");
    std::string key = "hier/group/" + std::to_string(++groups_);
    for (int r : ranks) key += "_" + std::to_string(r);
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    return inter_.make(static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
                       std::make_shared<PrefixStore>(key, store_));
  }

 protected:
  void do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    guarded("allreduce", [&] { allreduce_impl(data, count, dtype, op); });
  }

  void do_broadcast(void* data, size_t count, DType dtype, int root) override {
    guarded("broadcast", [&] {
      const int root_node = layout_.node_of_rank[root];
      if (node_ == root_node) {
        const auto& mine = layout_.ranks_of_node[node_];
        int root_local = static_cast<int>(std::find(mine.begin(), mine.end(), root) - mine.begin());
        // Every rank of the root's node, its leader included (also when the root is the leader).
        within(local_).broadcast(data, count, dtype, root_local);
      }
      if (leaders_) within(leaders_).broadcast(data, count, dtype, root_node);
      if (node_ != root_node) within(local_).broadcast(data, count, dtype, 0);
    });
  }

  void do_allgather(const void* send, void* recv, size_t count, DType dtype) override {
    do_allgatherv(send, recv, std::vector<size_t>(size(), count), dtype);
  }

  void do_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) override {
    if (uniform_ && local_->size() > 1) {
      guarded("allgatherv", [&] { rail_allgatherv(send, recv, counts, dtype); });
      return;
    }
    guarded("allgatherv", [&] {
      const size_t es = dtype_size(dtype);
      const auto& mine = layout_.ranks_of_node[node_];
      // 1. Gather my node's blocks; 2. leaders exchange node blocks; 3. leaders broadcast locally.
      std::vector<size_t> local_counts, node_totals(layout_.num_nodes(), 0);
      size_t total = 0;
      for (int r : mine) local_counts.push_back(counts[r]);
      for (int r = 0; r < size(); ++r) {
        node_totals[layout_.node_of_rank[r]] += counts[r];
        total += counts[r];
      }
      if (total == 0) return;
      std::vector<uint8_t> node_buf(node_totals[node_] * es + 1), all(total * es + 1);
      within(local_).allgatherv(send, node_buf.data(), local_counts, dtype);
      if (leaders_) within(leaders_).allgatherv(node_buf.data(), all.data(), node_totals, dtype);
      within(local_).broadcast(all.data(), total, dtype, 0);
      // Node-major order -> global rank order.
      std::vector<size_t> offset(size(), 0);
      for (int r = 1; r < size(); ++r) offset[r] = offset[r - 1] + counts[r - 1];
      size_t pos = 0;
      for (const auto& node : layout_.ranks_of_node)
        for (int r : node) {
          if (counts[r]) std::memcpy(static_cast<uint8_t*>(recv) + offset[r] * es, all.data() + pos * es, counts[r] * es);
          pos += counts[r];
        }
    });
  }

  void do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override {
    if (uniform_ && local_->size() > 1) {
      guarded("reduce_scatter", [&] { rail_reduce_scatter(send, recv, recv_count, dtype, op); });
      return;
    }
    guarded("reduce_scatter", [&] {
      const size_t es = dtype_size(dtype);
      std::vector<uint8_t> all(recv_count * size() * es + 1);
      std::memcpy(all.data(), send, recv_count * size() * es);
      allreduce_impl(all.data(), recv_count * size(), dtype, op);
      std::memcpy(recv, all.data() + rank_ * recv_count * es, recv_count * es);
    });
  }

  void do_reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) override {
    // Non-root buffers are unspecified, so an all-reduce is a valid (if not minimal) reduce.
    guarded("reduce", [&] { allreduce_impl(data, count, dtype, op); });
  }

  void do_barrier() override {
    guarded("barrier", [&] {
      within(local_).barrier();
      if (leaders_) within(leaders_).barrier();
      within(local_).barrier();
    });
  }

  void do_send(const void* data, size_t count, DType dtype, int peer, int tag) override {
    guarded("send", [&] {
      int at = peer;
      within(p2p_comm(peer, &at)).send(data, count, dtype, at, tag);
    });
  }

  void do_recv(void* data, size_t count, DType dtype, int peer, int tag) override {
    guarded("recv", [&] {
      int at = peer;
      within(p2p_comm(peer, &at)).recv(data, count, dtype, at, tag);
    });
  }

  void do_abort(const std::string& reason) override { poison(reason); }

  // Dumps tell the parts apart: "<name>/node<k>" (this node's ranks), "<name>/rail<j>" (local
  // rank j of every node; rail 0 = the node leaders), "<name>/flat"; members in this group's ranks.
  void name_flight_parts(const std::string& name) override {
    local_->set_flight_identity(name + "/node" + std::to_string(node_), layout_.ranks_of_node[node_], this);
    if (flat_) {
      std::vector<int> all(size());
      for (int r = 0; r < size(); ++r) all[r] = r;
      flat_->set_flight_identity(name + "/flat", all, this);
    }
    const auto& mine = layout_.ranks_of_node[node_];
    const int j = static_cast<int>(std::find(mine.begin(), mine.end(), rank_) - mine.begin());
    auto rail_members = [&](int k) {
      std::vector<int> m;
      for (const auto& n : layout_.ranks_of_node)
        if (k < static_cast<int>(n.size())) m.push_back(n[k]);
      std::sort(m.begin(), m.end());
      return m;
    };
    if (rail_)
      rail_->set_flight_identity(name + "/rail" + std::to_string(uniform_ ? j : 0),
                                 rail_members(uniform_ ? j : 0), this);
    if (leaders_ && leaders_ != rail_) leaders_->set_flight_identity(name + "/rail0", rail_members(0), this);
  }

 private:
  void allreduce_impl(void* data, size_t count, DType dtype, ReduceOp op) {
    if (count == 0) return;
    // avg = sum everywhere, one division at the end (integer avg truncates once, like flat).
    const ReduceOp inner = op == ReduceOp::avg ? ReduceOp::sum : op;
    const size_t es = dtype_size(dtype);
    const int L = local_->size();
    if (uniform_ && L > 1) {
      // Local reduce-scatter, every rail all-reduces its shard across nodes, local all-gather.
      const size_t shard = (count + L - 1) / L;
      // Reused across ops: no allocation per step once the largest size was seen.
      std::vector<uint8_t>& padded = padded_;
      std::vector<uint8_t>& mine = shard_;
      padded.resize(shard * L * es);
      mine.resize(shard * es);
      std::memcpy(padded.data(), data, count * es);
      std::memset(padded.data() + count * es, 0, (shard * L - count) * es);
      step_ = Step::local_reduce_scatter;
      within(local_).reduce_scatter(padded.data(), mine.data(), shard, dtype, inner);
      step_ = Step::rail_allreduce;
      if (rail_->size() > 1) within(rail_).allreduce(mine.data(), shard, dtype, inner);
      step_ = Step::local_allgather;
      within(local_).allgather(mine.data(), padded.data(), shard, dtype);
      std::memcpy(data, padded.data(), count * es);
    } else {
      step_ = Step::local_reduce;
      within(local_).reduce(data, count, dtype, inner, 0);
      step_ = Step::leaders_allreduce;
      if (leaders_ && leaders_->size() > 1) within(leaders_).allreduce(data, count, dtype, inner);
      step_ = Step::local_broadcast;
      within(local_).broadcast(data, count, dtype, 0);
    }
    if (op == ReduceOp::avg) reduce::divide_in_place(data, count, dtype, size());
  }

  // Uniform layouts (L ranks on each of N nodes): rail j links local rank j of every node, its
  // members ordered by global rank. rail_pos()[j][k] is node k's position on rail j.
  const std::vector<std::vector<int>>& rail_pos() {
    if (rail_pos_.empty()) {
      for (int j = 0; j < local_->size(); ++j) {
        std::vector<int> members;
        for (const auto& n : layout_.ranks_of_node) members.push_back(n[j]);
        std::vector<int> sorted = members;
        std::sort(sorted.begin(), sorted.end());
        rail_pos_.emplace_back();
        for (int m : members)
          rail_pos_.back().push_back(static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), m) - sorted.begin()));
      }
    }
    return rail_pos_;
  }

  // Reduce-scatter as two native reduce-scatters, no full all-reduce: local rank j first gets the
  // node's sum of the blocks of rail j's members (a local reduce-scatter over blocks regrouped by
  // rail), then each rail reduce-scatters those across nodes. Wire traffic per rank:
  // (L-1)/L of the data inside the node, (N-1)/N of 1/L of it across nodes.
  void rail_reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
    if (count == 0) return;
    const ReduceOp inner = op == ReduceOp::avg ? ReduceOp::sum : op;
    const size_t es = dtype_size(dtype), block = count * es;
    const int L = local_->size(), N = layout_.num_nodes();
    const auto& pos = rail_pos();
    // Rail j's shard holds its members' N blocks in rail order, at block j * N.
    padded_.resize(block * size());
    for (int j = 0; j < L; ++j)
      for (int k = 0; k < N; ++k) {
        const size_t at = static_cast<size_t>(j * N + pos[j][k]);
        std::memcpy(padded_.data() + at * block,
                    static_cast<const uint8_t*>(send) + static_cast<size_t>(layout_.ranks_of_node[k][j]) * block, block);
      }
    shard_.resize(block * N);
    step_ = Step::local_reduce_scatter;
    within(local_).reduce_scatter(padded_.data(), shard_.data(), count * N, dtype, inner);
    step_ = Step::rail_reduce_scatter;
    if (rail_->size() > 1) {
      within(rail_).reduce_scatter(shard_.data(), recv, count, dtype, inner);
    } else {
      std::memcpy(recv, shard_.data(), block);
    }
    if (op == ReduceOp::avg) reduce::divide_in_place(recv, count, dtype, size());
  }

  // All-gather(v) the other way round: each rail gathers its members' blocks across nodes, then
  // the node gathers its rails' shards; the result is put back in global rank order.
  void rail_allgatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) {
    const size_t es = dtype_size(dtype);
    const int L = local_->size();
    std::vector<size_t> offset(size() + 1, 0);
    for (int r = 0; r < size(); ++r) offset[r + 1] = offset[r] + counts[r];
    if (offset[size()] == 0) return;
    // Rail j's members in rail position order, and the element counts of each rail.
    std::vector<std::vector<int>> rail_members(L);
    std::vector<size_t> rail_total(L, 0);
    for (int j = 0; j < L; ++j) {
      for (const auto& n : layout_.ranks_of_node) rail_members[j].push_back(n[j]);
      std::sort(rail_members[j].begin(), rail_members[j].end());
      for (int g : rail_members[j]) rail_total[j] += counts[g];
    }
    const int me = local_->rank();
    std::vector<size_t> mine_counts;
    for (int g : rail_members[me]) mine_counts.push_back(counts[g]);
    shard_.resize(rail_total[me] * es + 1);
    step_ = Step::rail_allgather;
    if (rail_->size() > 1) {
      within(rail_).allgatherv(send, shard_.data(), mine_counts, dtype);
    } else if (counts[rank_]) {
      std::memcpy(shard_.data(), send, counts[rank_] * es);
    }
    padded_.resize(offset[size()] * es + 1);
    step_ = Step::local_allgather;
    within(local_).allgatherv(shard_.data(), padded_.data(), rail_total, dtype);
    size_t at = 0;
    for (int j = 0; j < L; ++j)
      for (int g : rail_members[j]) {
        if (counts[g]) std::memcpy(static_cast<uint8_t*>(recv) + offset[g] * es, padded_.data() + at * es, counts[g] * es);
        at += counts[g];
      }
  }

  std::string step_text() const {
    switch (step_) {
      case Step::local_reduce_scatter: return "local reduce-scatter among ranks " + node_ranks();
      case Step::rail_allreduce:
        return "cross-node all-reduce of rail " + std::to_string(local_->rank()) + " (ranks " + rail_ranks() + ")";
      case Step::local_allgather: return "local all-gather among ranks " + node_ranks();
      case Step::rail_reduce_scatter:
        return "cross-node reduce-scatter of rail " + std::to_string(local_->rank()) + " (ranks " + rail_ranks() + ")";
      case Step::rail_allgather:
        return "cross-node all-gather of rail " + std::to_string(local_->rank()) + " (ranks " + rail_ranks() + ")";
      case Step::local_reduce: return "local reduce among ranks " + node_ranks();
      case Step::leaders_allreduce: return "node leaders' all-reduce";
      case Step::local_broadcast: return "local broadcast among ranks " + node_ranks();
      case Step::none: break;
    }
    return "";
  }
  std::string node_ranks() const { return join(layout_.ranks_of_node[node_]); }
  std::string rail_ranks() const {
    std::vector<int> v;
    const int j = local_->rank();
    for (const auto& n : layout_.ranks_of_node) v.push_back(n[j]);
    return join(v);
  }
  static std::string join(const std::vector<int>& v) {
    std::string s;
    for (int r : v) s += (s.empty() ? "" : ",") + std::to_string(r);
    return s;
  }

  // One deadline for the whole hierarchical op: each step gets what is left of it, passed with
  // the step's own options (the sub-communicator's timeout stays as it is).
  struct Within {
    Communicator& c;
    OpOptions o;
    void allreduce(void* d, size_t n, DType t, ReduceOp op) { c.allreduce(d, n, t, op, o); }
    void broadcast(void* d, size_t n, DType t, int root) { c.broadcast(d, n, t, root, o); }
    void allgather(const void* s, void* r, size_t n, DType t) { c.allgather(s, r, n, t, o); }
    void allgatherv(const void* s, void* r, const std::vector<size_t>& n, DType t) { c.allgatherv(s, r, n, t, o); }
    void reduce_scatter(const void* s, void* r, size_t n, DType t, ReduceOp op) {
      c.reduce_scatter(s, r, n, t, op, o);
    }
    void reduce(void* d, size_t n, DType t, ReduceOp op, int root) { c.reduce(d, n, t, op, root, o); }
    void barrier() { c.barrier(o); }
    void send(const void* d, size_t n, DType t, int peer, int tag) {
      OpOptions p = o;
      p.tag = tag;
      c.send(d, n, t, peer, p);
    }
    void recv(void* d, size_t n, DType t, int peer, int tag) {
      OpOptions p = o;
      p.tag = tag;
      c.recv(d, n, t, peer, p);
    }
  };
  Within within(const CommPtr& c) {
    sub_ = c.get();
    return Within{*c, OpOptions::until(op_deadline())};
  }

  // Point-to-point needs the communicator over all ranks (see InterMaker::flat); within a node the
  // local one serves.
  const CommPtr& p2p_comm(int peer, int* at) {
    if (layout_.node_of_rank[peer] == node_) {
      const auto& mine = layout_.ranks_of_node[node_];
      *at = static_cast<int>(std::find(mine.begin(), mine.end(), peer) - mine.begin());
      return local_;
    }
    if (!flat_)
      GZ_THROW(InvalidArgument, "hier: point-to-point with rank ", peer, " on another node needs the communicator over "
               "all ranks, which this one was built without (GZ_HIER_FLAT=0)");
    *at = peer;
    return flat_;
  }

  // Global rank of position `peer` in the sub-communicator the current step runs on.
  int global_peer(int peer) const {
    if (peer < 0 || !sub_) return -1;
    if (sub_ == flat_.get()) return peer;
    if (sub_ == local_.get()) {
      const auto& mine = layout_.ranks_of_node[node_];
      return peer < static_cast<int>(mine.size()) ? mine[peer] : -1;
    }
    // Leaders and rails are sorted member lists of one rank per node.
    std::vector<int> members;
    const int j = sub_ == leaders_.get() ? 0 : local_->rank();
    for (const auto& n : layout_.ranks_of_node) members.push_back(n[j]);
    std::sort(members.begin(), members.end());
    return peer < static_cast<int>(members.size()) ? members[peer] : -1;
  }

  std::vector<Communicator*> subs() const {
    std::vector<Communicator*> v{local_.get(), flat_.get(), leaders_.get(), rail_.get()};
    return v;
  }

  bool sub_aborted() const {
    for (auto* c : subs())
      if (c && c->aborted()) return true;
    return false;
  }

  // A failed step leaves peers blocked in later steps: abort every sub-communicator so they
  // fail now (the backends tell their peers) instead of at their own timeouts.
  void poison(const std::string& reason) {
    for (auto* c : subs()) {
      if (!c) continue;
      try {
        c->abort(reason);
      } catch (...) {
      }
    }
  }

  // Runs one hierarchical op. A failed step is rethrown as the same error type, with the step
  // named, the sub-group's peer mapped to its global rank and the original error kept as cause.
  template <typename F>
  void guarded(const char* op, F&& fn) {
    check_aborted();
    step_ = Step::none;
    sub_ = nullptr;
    Stopwatch sw;
    auto where = [&](const Error& e) {
      const int peer = global_peer(e.peer());
      return detail::concat(op_failure(op, peer, sw.elapsed()), " (node ", node_, ")",
                            step_ == Step::none ? std::string()
                                                : " in the " + step_text() +
                                                      " (ranks below are positions in that sub-group)",
                            ": ");
    };
    try {
      fn();
    } catch (const InvalidArgument&) {
      throw;
    } catch (const Aborted& e) {
      if (aborted() || sub_aborted()) throw;  // this op was aborted, or an earlier one poisoned us
      // A sub-communicator aborted without us: a peer gave up (or its rank died) mid-step.
      std::string w = where(e);
      poison(w + e.what());
      throw PeerError(w + "a peer gave up: " + e.what(), global_peer(e.peer()), std::current_exception());
    } catch (const TimeoutError& e) {
      std::string w = where(e);
      poison(w + e.what());
      throw TimeoutError(w + e.what(), global_peer(e.peer()), std::current_exception());
    } catch (const PeerError& e) {
      std::string w = where(e);
      poison(w + e.what());
      throw PeerError(w + e.what(), global_peer(e.peer()), std::current_exception());
    } catch (const Error& e) {
      std::string w = where(e);
      poison(w + e.what());
      throw Error(w + e.what(), global_peer(e.peer()), std::current_exception());
    }
  }

  int rank_;
  NodeLayout layout_;
  int node_;
  CommPtr local_, flat_, leaders_, rail_;
  bool uniform_;
  // Which sub-step of allreduce runs now; turned into text only for error messages.
  enum class Step {
    none,
    local_reduce_scatter,
    rail_allreduce,
    rail_reduce_scatter,
    rail_allgather,
    local_allgather,
    local_reduce,
    leaders_allreduce,
    local_broadcast
  };
  Step step_ = Step::none;
  std::vector<uint8_t> padded_, shard_;  // scratch, reused across ops
  std::vector<std::vector<int>> rail_pos_;  // see rail_pos()
  Communicator* sub_ = nullptr;           // sub-communicator of the step now running
  InterMaker inter_;
  std::shared_ptr<Store> store_;
  int groups_ = 0;                // new_group calls so far (names their store namespace)
};

}  // namespace

CommPtr create_hierarchical_communicator(int rank, const NodeLayout& layout, std::shared_ptr<Store> store,
                                         const CommMaker& make_local, const InterMaker& inter, Duration timeout) {
  const int size = static_cast<int>(layout.node_of_rank.size());
  GZ_CHECK_ARG(rank >= 0 && rank < size, "hierarchical: rank ", rank, " of ", size);
  GZ_CHECK_ARG(store != nullptr, "hierarchical: a store is required");
  const int node = layout.node_of_rank[rank];
  const auto& mine = layout.ranks_of_node[node];
  const int local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  CommPtr local = make_local(local_rank, static_cast<int>(mine.size()),
                             std::make_shared<PrefixStore>("hier/local/" + std::to_string(node), store));
  // Without a flat communicator (any_group, !flat), nothing connects every rank to every other:
  // each rank connects only to its node and to its rail, N + L - 2 peers instead of N * L - 1.
  CommPtr flat = inter.any_group && !inter.flat
                     ? nullptr
                     : (inter.make_flat ? inter.make_flat : inter.make)(
                           rank, size, std::make_shared<PrefixStore>("hier/flat", store));
  CommPtr leaders, rail;
  // Every rank takes part in building every rail in the same order (new_group is collective).
  const size_t rails = layout.uniform() ? mine.size() : 1;
  for (size_t j = 0; j < rails; ++j) {
    std::vector<int> members;
    for (const auto& n : layout.ranks_of_node) members.push_back(n[j]);
    std::sort(members.begin(), members.end());
    CommPtr g;
    if (!inter.any_group) {
      g = flat->new_group(members);
    } else if (static_cast<int>(j) == local_rank) {
      const int at = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
      g = inter.make(at, static_cast<int>(members.size()),
                     std::make_shared<PrefixStore>("hier/rail/" + std::to_string(j), store));
    }
    if (g && j == 0) leaders = g;
    if (g && static_cast<int>(j) == local_rank) rail = g;
  }
  auto hier = std::make_shared<HierarchicalCommunicator>(rank, layout, std::move(local), std::move(flat),
                                                         std::move(leaders), std::move(rail), inter,
                                                         std::move(store), timeout);
  hier->set_flight_identity("hier");  // names its parts; the factory renames it
  return hier;
}

CommPtr create_hierarchical_communicator(int rank, const NodeLayout& layout, std::shared_ptr<Store> store,
                                         const CommMaker& make_local, const CommMaker& make_inter,
                                         Duration timeout) {
  InterMaker inter;
  inter.make = make_inter;
  inter.any_group = false;
  return create_hierarchical_communicator(rank, layout, std::move(store), make_local, inter, timeout);
}

}  // namespace gz::comm
