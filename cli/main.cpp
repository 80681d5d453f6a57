// headlab: the command line. Each command registers its flags (cli/<command>.cpp); main parses
// them, joins an MPI job when started by mpirun, and runs the chosen one.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "lib/fileutil.h"
#include "lib/messages.h"
#include "train/distributed.h"
#ifdef HEADLAB_HAVE_MPI
#include "cli/mpi_job.h"
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
int report_error(const char* message) {
  const std::string plain = hl::user_message(message);
  const char* what = plain.c_str();
  if (hl::in_multi_rank_job() && hl::job()->rank() > 0)
    std::fprintf(stderr, "headlab: rank %d: error: %s\n", hl::job()->rank(), what);
  else
    std::fprintf(stderr, "headlab: error: %s\n", what);
  if (hl::in_multi_rank_job()) hl::job()->abort(1);
  return 1;
}
// --threads above the cores this process may use runs on those cores (set_num_threads caps
// it): said once, here, for every command.
void warn_about_threads(const CLI::App& sub) {
  const CLI::Option* opt = sub.get_option_no_throw("--threads");
  if (!opt || opt->count() == 0 || (hl::job() && hl::job()->rank() > 0)) return;
  int most = 0;
  for (const std::string& v : opt->results()) most = std::max(most, std::atoi(v.c_str()));
  const int cores = hl::usable_cores();
  if (most > cores)
    std::fprintf(stderr, "headlab: warning: --threads %d is more than the %d cores this process may use; using %d\n", most,
                 cores, cores);
}
// A flag given an empty value ('--to ""', '--axes=') would otherwise read as its default and run
// the full analysis: refused here, for every flag of every command, naming the flag.
void refuse_empty_values(const CLI::App& sub) {
  for (const CLI::Option* opt : sub.get_options()) {
    if (opt->count() == 0 || opt->get_expected_max() == 0) continue;  // not given, or a switch
    for (const std::string& v : opt->results())
      if (v.find_first_not_of(" \t\n") == std::string::npos)
        throw std::runtime_error(opt->get_name() + " is empty: give a value, or leave the flag out for its default");
  }
  for (const CLI::App* nested : sub.get_subcommands()) refuse_empty_values(*nested);
}
// CLI11 drops the empty items of a comma list ('--head-counts 1,,2' reads as 1,2), so the raw
// words are checked: a list flag with an empty item is refused, naming the flag.
void refuse_empty_list_items(const CLI::App& sub, int argc, char** argv) {
  auto empty_item = [](const std::string& v) {
    size_t at = 0;
    while (true) {
      const size_t comma = v.find(',', at);
      const std::string item = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (item.find_first_not_of(" \t\n") == std::string::npos) return true;
      if (comma == std::string::npos) return false;
      at = comma + 1;
    }
  };
  for (const CLI::Option* opt : sub.get_options()) {
    if (opt->count() == 0 || opt->get_delimiter() != ',') continue;
    for (int i = 1; i < argc; ++i) {
      const std::string word = argv[i];
      const size_t eq = word.find('=');
      const bool joined = word.rfind("--", 0) == 0 && eq != std::string::npos;
      const std::string name = joined ? word.substr(0, eq) : word;
      if (name.empty() || name[0] != '-' || !opt->check_name(name)) continue;
      if (!joined && i + 1 >= argc) continue;
      const std::string value = joined ? word.substr(eq + 1) : argv[i + 1];
      if (empty_item(value))
        throw std::runtime_error(opt->get_name() + " '" + value + "' has an empty item: give values separated by single commas");
    }
  }
  for (const CLI::App* nested : sub.get_subcommands()) refuse_empty_list_items(*nested, argc, argv);
}
}  // namespace

int main(int argc, char** argv) {
  select_blas_kernels(argv);
  // Paths and text are recorded in JSON (summaries, metadata), which holds UTF-8 only.
  // The advice fits the argument: a name of an existing file can be renamed, text re-encoded.
  for (int i = 1; i < argc; ++i)
    if (!hl::is_valid_utf8(argv[i])) {
      const std::string arg = argv[i];
      const size_t eq = arg.rfind("--", 0) == 0 ? arg.find('=') : std::string::npos;
      const std::string flag = eq != std::string::npos ? arg.substr(0, eq)
                               : i > 1 && std::string(argv[i - 1]).rfind("--", 0) == 0 ? argv[i - 1] : "";
      std::error_code ec;
      const bool names_a_file = std::filesystem::exists(eq != std::string::npos ? arg.substr(eq + 1) : arg, ec);
      std::fprintf(stderr, "headlab: error: %s%s is not valid UTF-8; headlab records paths and text in JSON, which holds "
                           "UTF-8 only: %s\n", flag.empty() ? "argument " : "the value of ",
                   flag.empty() ? std::to_string(i).c_str() : flag.c_str(),
                   names_a_file ? "rename the file or directory" : "give it as UTF-8 text");
      return 2;
    }
  CLI::App app{"headlab: train small transformers and study multi-head attention, head by head"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "headlab 0.1");
  hl::CommandRunner runner;
#define HEADLAB_ADD_COMMAND(name) hl::add_##name##_command(app, runner);
  HEADLAB_COMMANDS(HEADLAB_ADD_COMMAND)
#undef HEADLAB_ADD_COMMAND
  // Started by mpirun or srun: join the job before parsing, so that ranks started with different
  // arguments are told apart (start_mpi_job compares them) and a bad flag is said once, by rank 0.
  // Only train (data-parallel) and ablate (runs shared among the ranks) work across ranks; the
  // other commands refuse rather than run N times.
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // every rank has the same arguments (checked above), so rank 0 alone says what is wrong
    if (mpi && mpi->rank() > 0) return e.get_exit_code();
    return app.exit(e);
  }
  try {
    refuse_empty_values(*app.get_subcommands().front());
    refuse_empty_list_items(*app.get_subcommands().front(), argc, argv);
  } catch (const std::exception& e) {
    return report_error(e.what());
  }
  const std::string command = app.get_subcommands().front()->get_name();
  warn_about_threads(*app.get_subcommands().front());
  if (hl::in_multi_rank_job() && command != "train" && command != "ablate") {
    if (hl::job()->rank() == 0)
      std::fprintf(stderr, "headlab: error: headlab %s runs in one process; across MPI ranks only train and ablate "
                           "run: start it without mpirun\n", command.c_str());
    return 1;
  }
  hl::install_stop_handler();
  try {
    return runner ? runner() : 0;
  } catch (const hl::Stopped& e) {  // an analysis stopped between examples: nothing written
    std::fprintf(stderr, "headlab %s: %s before the end; nothing was written\n", command.c_str(), e.what());
    if (hl::in_multi_rank_job()) hl::job()->abort(hl::stop_exit_code());
    return hl::stop_exit_code();
  } catch (const std::bad_alloc&) {  // work whose size was not estimated beforehand
    return report_error("out of memory: the command needed more memory than this process may use (ulimit -v, the "
                        "cgroup's limit or the machine's); give it smaller sizes (--examples, --batch, a smaller model)");
  } catch (const std::exception& e) {
    return report_error(e.what());
  }
}
