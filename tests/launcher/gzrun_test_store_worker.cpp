// Worker that rendezvouses through the store gzrun hosts (env://), exchanges one value per rank
// and checks the sum, so the test sees the store actually connect all workers.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gz/store/rendezvous.h"

int main() {
  try {
    gz::InitOptions opt;
    opt.timeout = std::chrono::seconds(20);
    gz::Rendezvous rv = gz::rendezvous(opt);
    const int rank = rv.world.rank, world = rv.world.world_size;
    rv.store->set("value/" + std::to_string(rank), gz::to_bytes(std::to_string(rank * rank + 1)));
    long long sum = 0;
    for (int r = 0; r < world; ++r)
      sum += std::stoll(
          gz::to_string(rv.store->get("value/" + std::to_string(r), gz::Deadline::after(opt.timeout))));
    // Nobody leaves before everyone has read (the values live in gzrun's store anyway).
    gz::store_barrier(*rv.store, "done", world, gz::Deadline::after(opt.timeout));
    std::printf("rank=%d world=%d launcher=%s hosts_server=%d sum=%lld\n", rank, world,
                rv.world.launcher.c_str(), rv.server ? 1 : 0, sum);
    const char* run_id = std::getenv("GZ_RUN_ID");
    std::printf("RUN_ID=%s\n", run_id ? run_id : "<unset>");
    const char* master = std::getenv("MASTER_ADDR");
    std::printf("MASTER_ADDR=%s\n", master ? master : "<unset>");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store worker failed: %s\n", e.what());
    return 1;
  }
}
