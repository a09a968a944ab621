// gz-bench: benchmarks in the style of nccl-tests. Subcommands live in their own files.
#include <cstdio>
#include <cstring>
#include <exception>

#ifdef GZ_BENCH_COLLECTIVES
int bench_collectives(int argc, char** argv);
#endif
#ifdef GZ_BENCH_TRAIN
int bench_train(int argc, char** argv);
#endif
int bench_recorder(int argc, char** argv);

static int usage() {
  std::fprintf(stderr,
               "usage: gzrun --nproc-per-node N gz-bench collectives [options]\n"
               "       gzrun --nproc-per-node N gz-bench train [options]\n"
               "       gzrun --nproc-per-node N gz-bench recorder [options]\n"
               "run 'gz-bench SUBCOMMAND --help' for the options\n");
  return 2;
}

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  try {
#ifdef GZ_BENCH_COLLECTIVES
    if (!std::strcmp(argv[1], "collectives")) return bench_collectives(argc - 1, argv + 1);
#endif
    if (!std::strcmp(argv[1], "recorder")) return bench_recorder(argc - 1, argv + 1);
#ifdef GZ_BENCH_TRAIN
    if (!std::strcmp(argv[1], "train")) return bench_train(argc - 1, argv + 1);
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gz-bench: %s\n", e.what());
    return 1;
  }
  return usage();
}
