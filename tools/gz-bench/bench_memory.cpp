#include "bench_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "gz/comm/communicator.h"

namespace gz::bench {

ProcMemory read_proc_memory() {
  ProcMemory m;
  auto scan = [&](const char* path) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream is(line);
      std::string key;
      double kb = 0;
      if (!(is >> key >> kb)) continue;
      if (key == "VmRSS:") m.rss = kb / 1024;
      if (key == "VmHWM:") m.peak = kb / 1024;
      if (key == "Pss:") m.pss = kb / 1024;
      if (key == "Pss_Anon:") m.pss_anon = kb / 1024;
      if (key == "Pss_Shmem:") m.pss_shmem = kb / 1024;
    }
  };
  scan("/proc/self/status");
  scan("/proc/self/smaps_rollup");
  return m;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

int64_t gradient_bytes(const torch::nn::Module& module, const std::vector<torch::Tensor>& extra) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& t) {
    if (!t.defined()) return;
    const auto& st = t.storage();
    if (seen.insert(st.data()).second) bytes += static_cast<int64_t>(st.nbytes());
  };
  for (const auto& p : module.parameters()) add(p.grad());
  for (const auto& t : extra) add(t);
  return bytes;
}

int64_t parameter_bytes(const torch::nn::Module& module, const std::vector<torch::Tensor>& extra) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& t) {
    const auto& st = t.storage();
    if (seen.insert(st.unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(st.nbytes());
  };
  for (const auto& p : module.parameters()) add(p);
  for (const auto& t : extra) add(t);
  return bytes;
}

void report_memory(comm::Communicator& group, const std::string& label, int64_t state_bytes,
                   int64_t grad_bytes, const ProcMemory& base, int64_t param_bytes) {
  const ProcMemory now = read_proc_memory();
  constexpr int kN = 8;
  std::vector<double> mine{static_cast<double>(state_bytes) / (1 << 20),
                           static_cast<double>(grad_bytes) / (1 << 20),
                           now.pss - base.pss,
                           now.pss_anon - base.pss_anon,
                           now.pss_shmem - base.pss_shmem,
                           now.rss - base.rss,
                           now.peak - base.rss,
                           static_cast<double>(param_bytes) / (1 << 20)};
  std::vector<double> all(static_cast<size_t>(kN) * group.size());
  group.allgather(mine.data(), all.data(), kN, DType::f64);
  if (group.rank() != 0) return;
  std::vector<double> mean(kN, 0);
  const char* fmt =
      "state_mb=%.2f grad_mb=%.2f state_grad_mb=%.2f pss_delta_mb=%.1f pss_anon_delta_mb=%.1f "
      "pss_shmem_delta_mb=%.1f rss_delta_mb=%.1f peak_rss_delta_mb=%.1f param_mb=%.2f "
      "param_state_grad_mb=%.2f\n";
  for (int r = 0; r < group.size(); ++r) {
    const double* v = &all[static_cast<size_t>(r) * kN];
    std::printf("MEMORY %s rank=%d ", label.c_str(), r);
    std::printf(fmt, v[0], v[1], v[0] + v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[0] + v[1] + v[7]);
    for (int i = 0; i < kN; ++i) mean[i] += v[i] / group.size();
  }
  std::printf("MEMORY_MEAN %s ", label.c_str());
  std::printf(fmt, mean[0], mean[1], mean[0] + mean[1], mean[2], mean[3], mean[4], mean[5], mean[6], mean[7],
              mean[0] + mean[1] + mean[7]);
  std::fflush(stdout);
}

}  // namespace gz::bench
