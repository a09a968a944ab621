// Adapter: our gz::Store seen as Gloo's rendezvous store, with our deadlines.
#pragma once

#include <gloo/rendezvous/store.h>

#include <cctype>
#include <map>
#include <memory>
#include <string>

#include "gz/store/store.h"

namespace gz::comm::gloo_impl {

/// @brief gloo::rendezvous::Store over a gz::Store. Blocking calls wait at most `timeout` and
/// throw gz::TimeoutError (naming the keys) instead of Gloo's own untimed waits.
///
/// Gloo's full-mesh rendezvous sets one key per rank, named by the rank number after a prefix, and
/// then waits for and reads the key of every other rank (or every lower one): two round trips per
/// peer, so a rank's connect cost grows with the group. Given (rank, size), the adapter gathers those keys in
/// one StoreAllgather instead: the set publishes this rank's, the first read of a peer's key fetches every
/// rank's at once, and later reads are served from that copy. Keys of any other shape go to the store.
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<gz::Store> store, Duration timeout, int rank = -1, int size = 0)
      : store_(std::move(store)), timeout_(timeout), rank_(rank), size_(size) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    // This rank's key is the rank number after a prefix ("7" or "rank_7", by Gloo version).
    const std::string r = std::to_string(rank_);
    if (rank_ >= 0 && key.size() >= r.size() && key.compare(key.size() - r.size(), r.size(), r) == 0 &&
        (key.size() == r.size() ||
         !std::isdigit(static_cast<unsigned char>(key[key.size() - r.size() - 1])))) {
      const std::string prefix = key.substr(0, key.size() - r.size());
      if (!families_.count(prefix)) {
        // Published at once (a rank may never read a peer's key: Gloo's lowest rank only waits
        // for the others to connect to it), collected at the first read of a peer's key.
        families_[prefix].gather = std::make_unique<StoreAllgather>(*store_, "gloo_mesh/" + prefix, rank_,
                                                                    size_, Bytes(data.begin(), data.end()));
        return;
      }
    }
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    if (const Bytes* b = gathered(key)) return std::vector<char>(b->begin(), b->end());
    Bytes b = store_->get(key, Deadline::after(timeout_));
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait_for(keys, timeout_); }

  /// @brief Every rank's value of the key family `prefix` ("" = Gloo's pair addresses) when it has
  /// been gathered (empty otherwise): for error messages after a failed connect.
  std::vector<Bytes> gathered_family(const std::string& prefix) const {
    auto it = families_.find(prefix);
    return it == families_.end() ? std::vector<Bytes>{} : it->second.all;
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    // Gloo passes its own default (30 s) here; never wait longer than our timeout.
    wait_for(keys, timeout.count() > 0 ? std::min<Duration>(timeout, timeout_) : timeout_);
  }

 private:
  void wait_for(const std::vector<std::string>& keys, Duration t) {
    std::vector<std::string> rest;
    for (const auto& k : keys)
      if (!gathered(k, t)) rest.push_back(k);
    if (!rest.empty()) store_->wait(rest, Deadline::after(t));
  }

  // The gathered value of a rank's key, or null when `key` is not one.
  const Bytes* gathered(const std::string& key, Duration t = Duration(0)) {
    for (auto& [prefix, f] : families_) {
      if (key.size() <= prefix.size() || key.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string num = key.substr(prefix.size());
      if (num.find_first_not_of("0123456789") != std::string::npos || num.size() > 9) continue;
      const int r = std::stoi(num);
      if (r >= size_) continue;
      if (f.all.empty()) f.all = f.gather->collect(Deadline::after(t.count() ? t : timeout_));
      return &f.all[r];
    }
    return nullptr;
  }

  std::shared_ptr<gz::Store> store_;
  Duration timeout_;
  int rank_, size_;
  // Gloo's key families: what precedes the rank number ("rank_" for host names, "" for the pair
  // addresses in this Gloo), each gathered once.
  struct Family {
    std::unique_ptr<StoreAllgather> gather;
    std::vector<Bytes> all;
  };
  std::map<std::string, Family> families_;
};

}  // namespace gz::comm::gloo_impl
