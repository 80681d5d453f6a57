// headlab: train small transformers on the copy task and study their attention heads.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "train/commands.h"

extern "C" char* openblas_get_corename();

namespace {
// Debian 12's OpenBLAS 0.3.21 does not recognise recent CPUs (Zen 5, new Xeons) and falls back
// to its Prescott (SSE3) kernels, about 5x slower than the AVX-512 ones. When the user has not
// chosen OPENBLAS_CORETYPE, pick the best kernels this CPU supports and restart once (the core
// is chosen when libopenblas loads, before main). An explicit OPENBLAS_CORETYPE always wins.
void select_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("HEADLAB_BLAS_CORE_CHOSEN")) return;
  const std::string core = openblas_get_corename();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* pick = nullptr;
  if (avx512 && core != "SkylakeX" && core != "Cooperlake" && core != "SapphireRapids") pick = "SkylakeX";
  else if (!avx512 && avx2 && core != "Haswell" && core != "Zen" && core != "SkylakeX") pick = "Haswell";
  if (!pick) return;
  ::setenv("OPENBLAS_CORETYPE", pick, 1);
  ::setenv("HEADLAB_BLAS_CORE_CHOSEN", core.c_str(), 1);
  ::execv("/proc/self/exe", argv);  // if this fails, run on with OpenBLAS's own choice
}
}  // namespace

int main(int argc, char** argv) {
  select_blas_kernels(argv);
  CLI::App app{"headlab: train small transformers and study multi-head attention, head by head"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "headlab 0.1");
  hl::CommandRunner runner;
  hl::add_train_command(app, runner);
  hl::add_grads_command(app, runner);
  hl::add_attn_command(app, runner);
  hl::add_bench_command(app, runner);
  hl::add_ablate_command(app, runner);
  hl::add_prune_command(app, runner);
  hl::add_hooks_command(app, runner);
  hl::add_view_command(app, runner);
  hl::add_role_commands(app, runner);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  hl::install_stop_handler();
  try {
    return runner ? runner() : 0;
  } catch (const hl::Error& e) {
    std::fprintf(stderr, "headlab: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "headlab: error: %s\n", e.what());
    return 1;
  }
}
