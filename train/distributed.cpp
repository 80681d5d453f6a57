#include "train/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "lib/tensor.h"

namespace hl {

namespace {
ProcessGroup* g_job = nullptr;
}

ProcessGroup* job() { return g_job; }
void set_job(ProcessGroup* group) { g_job = group; }

int launcher_world_size() {
  // Open MPI's mpirun; MPICH/Hydra and Slurm's PMI-2; PMIx (srun --mpi=pmix) names the rank only
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return std::getenv("PMIX_RANK") ? 1 : 0;
}

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(var)) return std::max(0, std::atoi(v));
  return 0;
}

int default_threads_per_rank(int ranks_on_node) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  // a launcher may bind each rank to its own cores: never more threads than this rank may use
  const int allowed = usable_cores();
  const int share = static_cast<int>(online) / std::max(1, ranks_on_node);
  return std::max(1, std::min(allowed, share));
}

int default_threads(int alone) {
  return in_multi_rank_job() ? default_threads_per_rank(job()->ranks_on_node()) : alone;
}

}  // namespace hl
