#include "gz/torch/bucket_plan.h"

#include <algorithm>
#include <map>

#include "gz/core/error.h"

namespace gz {

// min_buckets: the last bucket's reduction cannot overlap backward, so it should stay a small share
// of the step even for models far smaller than bucket_bytes x min_buckets. bert-small at 1 Gbit/s:
// 25 MiB buckets put 12.6 MB of layer gradients on the wire after backward; 1.6 MB buckets send
// them during backward.
size_t bucket_cap(const std::vector<BucketItem>& items, const std::vector<size_t>& order,
                  const BucketLimits& limits) {
  if (limits.min_buckets <= 1) return limits.bucket_bytes;
  size_t total = 0;
  for (size_t i : order)
    if (i < items.size() && !items[i].alone) total += items[i].bytes;
  return std::min(limits.bucket_bytes, std::max(limits.first_bucket_bytes, total / limits.min_buckets));
}

namespace {
// The open bucket of one key.
struct Open {
  size_t bucket = 0;
  size_t bytes = 0;
};
}  // namespace

std::vector<std::vector<size_t>> plan_buckets(const std::vector<BucketItem>& items,
                                              const std::vector<size_t>& order, const BucketLimits& limits) {
  GZ_CHECK_ARG(limits.first_bucket_bytes > 0 && limits.bucket_bytes > 0,
               "plan_buckets: bucket sizes must be positive");
  std::vector<uint8_t> seen(items.size(), 0);
  for (size_t i : order) {
    GZ_CHECK_ARG(i < items.size() && !seen[i], "plan_buckets: item ", i, " out of range or named twice");
    seen[i] = 1;
  }
  const size_t cap = bucket_cap(items, order, limits);
  std::vector<std::vector<size_t>> out;
  std::map<uint64_t, Open> open;
  std::map<uint64_t, bool> first_done;  // the key's first bucket has closed
  auto close = [&](uint64_t key) {
    open.erase(key);
    first_done[key] = true;
  };
  for (size_t i : order) {
    const BucketItem& item = items[i];
    if (item.alone) {
      while (!open.empty()) close(open.begin()->first);
      out.push_back({i});
      continue;
    }
    auto limit = [&] { return first_done[item.key] ? cap : limits.first_bucket_bytes; };
    auto it = open.find(item.key);
    if (it != open.end() && item.bytes >= limit()) {  // big: do not hold back the bucket's others
      close(item.key);
      it = open.end();
    }
    if (it == open.end()) {
      out.emplace_back();
      it = open.emplace(item.key, Open{out.size() - 1, 0}).first;
    }
    out[it->second.bucket].push_back(i);
    it->second.bytes += item.bytes;
    if (it->second.bytes >= limit()) close(item.key);
  }
  return out;
}

}  // namespace gz
