// gz-bench train --memory: what gradients, optimizer state and the process really hold.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

namespace gz::comm {
class Communicator;
}

namespace gz::bench {

/// @brief Process memory in MiB: /proc/self/status (VmRSS, VmHWM) and /proc/self/smaps_rollup
/// (Pss, Pss_Anon, Pss_Shmem). PSS charges a page mapped by k processes 1/k to each: shm buckets
/// that every rank maps (zero copy) count once over the ranks, not once per rank as in RSS.
struct ProcMemory {
  double rss = 0, peak = 0, pss = 0, pss_anon = 0, pss_shmem = 0;
};
ProcMemory read_proc_memory();
/// @brief Restart VmHWM from the current RSS (Linux: "5" > /proc/self/clear_refs); false if refused.
bool reset_peak_rss();

/// @brief Bytes of the distinct storages behind the module's parameters' .grad plus `extra`
/// (e.g. ZeRO's gradient blocks): the gradient memory really held, shared buckets counted once.
int64_t gradient_bytes(const torch::nn::Module& module, const std::vector<torch::Tensor>& extra);

/// @brief Bytes of the distinct storages behind the module's parameters plus `extra` (stage 3's
/// shards; its unsharded parameters hold no memory between steps).
int64_t parameter_bytes(const torch::nn::Module& module, const std::vector<torch::Tensor>& extra);

/// @brief Rank 0 prints one "MEMORY rank=..." line per rank and a "MEMORY_MEAN ..." line:
/// optimizer state and gradient bytes (tensors), PSS now minus `base` with its anonymous and
/// shared-memory parts, RSS now minus `base`, the peak RSS since reset_peak_rss() minus
/// `base`'s RSS, then parameter bytes and parameters + gradients + state. Collective.
void report_memory(comm::Communicator& group, const std::string& label, int64_t state_bytes,
                   int64_t grad_bytes, const ProcMemory& base, int64_t param_bytes);

}  // namespace gz::bench
