// The other processes of a job started by mpirun or srun (MPI ranks). A process started any
// other way is alone and never sees this: job() is null, and every command runs as it always
// has. The MPI implementation lives in cli/mpi_job.cpp and is linked only into the headlab
// executable (built when CMake finds MPI), so the libraries and the Python module stay free
// of MPI.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hl {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int ranks_on_node() const = 0;  // ranks of this job on this machine
  // Elementwise sum over the ranks of `n` floats, in place on every rank, added in rank order
  // ((x_0 + x_1) + x_2) + ...: every rank, and every run with the same number of ranks, gets
  // the same bits (a library allreduce may add in an order that depends on message sizes).
  virtual void sum_in_rank_order(float* data, int64_t n) = 0;
  // Rank 0's `text` on every rank.
  virtual void broadcast(std::string& text) = 0;
  // Work items 0..n-1, each done once by `work` on whichever rank is free next (dynamic: a rank
  // that finishes early takes the next untaken item). Rank 0 gets every item's returned text,
  // indexed by item; the other ranks get an empty vector. An error on any rank ends the job.
  virtual std::vector<std::string> share_work(int n, const std::function<std::string(int item)>& work) = 0;
  // Ends every rank of the job with this exit code (after the caller printed why).
  [[noreturn]] virtual void abort(int code) = 0;
};

// The job this process is a rank of, or null when it runs alone (also under `mpirun -np 1`
// the group has size 1 and the commands behave as without MPI).
ProcessGroup* job();
void set_job(ProcessGroup* group);
inline bool in_multi_rank_job() { return job() && job()->size() > 1; }

// How many ranks the launcher started, from its environment (mpirun, srun), or 0 when this
// process was not started by an MPI launcher.
int launcher_world_size();
// This process's rank as the launcher names it before MPI starts (0 when not launched).
int launcher_rank();
// Threads for one rank when --threads is not given: the cores this process may run on, shared
// among the ranks on this node (at least 1).
int default_threads_per_rank(int ranks_on_node);
// Threads when --threads is not given: `alone` for a process on its own, else the rank's share.
int default_threads(int alone);

}  // namespace hl
