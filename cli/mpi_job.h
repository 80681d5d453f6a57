// Starting the MPI job (cli/mpi_job.cpp): only in the headlab executable, only when it was
// started by an MPI launcher (see launcher_world_size()).
#pragma once
#include <memory>

#include "train/distributed.h"

namespace hl {

// MPI_Init; the group of MPI_COMM_WORLD (MPI_Finalize when it is destroyed).
std::unique_ptr<ProcessGroup> start_mpi_job(int& argc, char**& argv);

}  // namespace hl
