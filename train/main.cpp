// headlab: train small transformers on the copy task and study their attention heads.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "train/commands.h"
#include "train/distributed.h"
#ifdef HEADLAB_HAVE_MPI
#include "train/mpi_job.h"
#endif

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
// One line naming the error (the rank too, in an MPI job); in an MPI job every rank then ends,
// so no rank waits forever for one that has given up.
int report_error(const char* what) {
  if (hl::in_multi_rank_job() && hl::job()->rank() > 0)
    std::fprintf(stderr, "headlab: rank %d: error: %s\n", hl::job()->rank(), what);
  else
    std::fprintf(stderr, "headlab: error: %s\n", what);
  if (hl::in_multi_rank_job()) hl::job()->abort(1);
  return 1;
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
    // under mpirun every rank parses the same flags: rank 0 alone says what is wrong (or prints --help)
    // (the others wait a moment, so the launcher does not end rank 0 before it has said it)
    if (hl::launcher_rank() > 0) {
      ::usleep(500000);
      return e.get_exit_code();
    }
    return app.exit(e);
  }
  // Started by mpirun or srun: join the job. Only train (data-parallel) and ablate (runs shared
  // among the ranks) work across ranks; the other commands refuse rather than run N times.
  std::unique_ptr<hl::ProcessGroup> mpi;
  const int launched_ranks = hl::launcher_world_size();
#ifdef HEADLAB_HAVE_MPI
  if (launched_ranks > 0) {
    mpi = hl::start_mpi_job(argc, argv);
    hl::set_job(mpi.get());
  }
#else
  if (launched_ranks > 1) {
    std::fprintf(stderr, "headlab: error: started as one of %d MPI ranks, but this headlab was built without MPI "
                         "(install libopenmpi-dev and rebuild)\n", launched_ranks);
    return 1;
  }
#endif
  const std::string command = app.get_subcommands().front()->get_name();
  if (hl::in_multi_rank_job() && command != "train" && command != "ablate") {
    if (hl::job()->rank() == 0)
      std::fprintf(stderr, "headlab: error: headlab %s runs in one process; across MPI ranks only train and ablate "
                           "run: start it without mpirun\n", command.c_str());
    return 1;
  }
  hl::install_stop_handler();
  try {
    return runner ? runner() : 0;
  } catch (const std::exception& e) {
    return report_error(e.what());
  }
}
