// gz-train: train a classifier from a YAML config, one process or many under gzrun.
//   gz-train --config configs/fashion_mnist.yaml [--key value | --key=value ...]
//   gzrun --nproc-per-node 2 gz-train --config configs/fashion_mnist.yaml
//   gz-train --config WORK_DIR/config.yaml --export-checkpoint SRC OUT.pt   (consolidate)
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/torch/process_group.h"
#include "gz/train/config.h"
#include "gz/train/straggler.h"
#include "gz/train/trainer.h"

namespace {

// TEST ONLY: SIGKILL this process when step `step` begins (its peers are then inside that step's
// collectives): a worker lost without any chance to clean up.
struct KillAtStep : gz::train::Callback {
  explicit KillAtStep(int64_t s) : step(s) {}
  void on_step_begin(gz::train::Trainer& t) override {
    if (t.state().step == step) ::kill(::getpid(), SIGKILL);
  }
  int64_t step;
};

void usage(std::ostream& os) {
  os << "usage: gz-train --config FILE [--key value | --key=value ...]\n"
        "  Trains the model the YAML config describes; flags override config keys\n"
        "  (nested keys with dots: --scheduler.warmup_steps 100). Distributed modes (ddp, horovod)\n"
        "  take their rank and world from the launcher: gzrun --nproc-per-node 2 gz-train ...\n"
        "  --help-keys lists every accepted key.\n"
        "  --export-checkpoint SRC OUT: write checkpoint SRC (sharded or not, any world size) as one\n"
        "  consolidated state file OUT, in one process; the config is the job's (work_dir/config.yaml).\n";
}

// --export-checkpoint: the job's model and optimizer in one process, the checkpoint loaded whole.
int export_checkpoint(gz::train::TrainConfig config, const std::string& src, const std::string& out) {
  config.mode = "single";
  config.zero_stage = 0;
  config.checkpoint_format = "consolidated";
  config.snapshot_every = 0;
  config.resume_from_checkpoint.clear();
  config.finetune.clear();
  try {
    gz::train::Trainer trainer(config);
    trainer.export_checkpoint(src, out);
    std::cout << "exported " << src << " (step " << trainer.state().step << ") to " << out << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gz-train: export-checkpoint: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, export_src, export_out;
  std::vector<std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(std::cout);
      return 0;
    }
    if (a == "--help-keys") {
      for (auto& k : gz::train::config_keys()) std::cout << k << "\n";
      return 0;
    }
    if (a == "--config" || a == "-c") {
      if (i + 1 >= argc) {
        std::cerr << "gz-train: --config needs a file\n";
        usage(std::cerr);
        return 2;
      }
      config_path = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config_path = a.substr(9);
    } else if (a == "--export-checkpoint") {
      if (i + 2 >= argc) {
        std::cerr << "gz-train: --export-checkpoint needs SRC and OUT\n";
        usage(std::cerr);
        return 2;
      }
      export_src = argv[++i];
      export_out = argv[++i];
    } else {
      flags.push_back(a);
    }
  }
  if (config_path.empty() && flags.empty()) {
    std::cerr << "gz-train: no --config given\n";
    usage(std::cerr);
    return 2;
  }
  gz::train::TrainConfig config;
  try {
    config = gz::train::load_config(config_path, flags);
  } catch (const gz::Error& e) {
    std::cerr << "gz-train: " << e.what() << "\n";
    return 2;
  }
  if (!export_src.empty()) return export_checkpoint(config, export_src, export_out);
  int rank = 0;
  try {
    if (config.mode == "ddp" || config.mode == "horovod") {
      gz::ProcessGroupOptions po;
      po.backend = config.backend;
      gz::init(po);
      rank = gz::rank();
    }
    gz::train::Trainer trainer(config);
    // Fault injection for restart tests: the first attempt of one rank dies after a given step.
    gz::Env env = gz::Env::from_process();
    // A replacement (gzrun --recovery in-place) or a restart is not the first attempt.
    const bool first_attempt =
        env.get_int("GZ_RESTART_COUNT", 0) == 0 && env.get_int("GZ_REPLACEMENT", 0) == 0;
    long long crash_step = env.get_int("GZ_TRAIN_CRASH_AT_STEP", -1);
    if (crash_step > 0 && first_attempt && env.get_int("GZ_TRAIN_CRASH_RANK", 0) == rank)
      trainer.set_crash_at_step(crash_step);
    long long kill_step = env.get_int("GZ_TRAIN_KILL_AT_STEP", -1);
    if (kill_step > 0 && first_attempt && env.get_int("GZ_TRAIN_CRASH_RANK", 0) == rank)
      trainer.add_callback(std::make_shared<KillAtStep>(kill_step));
    // TEST ONLY: a rank whose data phase is slower (GZ_TEST_SLOW_DATA_MS), for the straggler tests.
    if (auto slow = gz::train::make_test_fault_injection(env)) trainer.add_callback(slow);
    trainer.train();
    if (trainer.is_main()) std::cout << trainer.summary_line() << std::endl;
    gz::shutdown();
    return 0;
  } catch (const gz::Aborted& e) {
    std::cerr << "gz-train: rank " << rank << ": " << e.what() << std::endl;
    std::_Exit(3);  // a crash: no orderly shutdown, peers must notice
  } catch (const std::exception& e) {
    std::cerr << "gz-train: rank " << rank << ": error: " << e.what() << std::endl;
    std::_Exit(1);
  }
}
