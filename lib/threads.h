// The busy-machine rule, one policy for every command and for Python (implemented beside
// idle_cores() in tensor.cpp): work that would run on `most` threads, when the user did not
// choose a count, runs only on the cores other processes leave idle, since a core busy elsewhere
// makes every parallel region of the shared OpenMP team wait for it.
#pragma once
#include <string>

namespace hl {

struct ThreadChoice {
  int threads = 1;
  // "1 of the 2 cores is busy with other processes: running on 1 thread"; empty when nothing
  // was lowered. Each door adds how to choose the count itself (--threads N, threads=N).
  std::string notice;
};
// Costs a 60 ms look at /proc/stat (idle_cores()).
ThreadChoice choose_threads(int most);

// The same rule inside one process, for small steps. A training step enters a dozen or more
// parallel regions; on a machine with more runnable threads than cores, each region's barrier
// can wait a scheduler slice (milliseconds) for a thread the OS has not run, so a step of tens of
// milliseconds gains at most 2x from two threads on a quiet machine and loses several times on
// a loaded one (the SAE step: docs/performance.md, "SAE training against PyTorch"). Steps whose
// largest product has fewer multiply-adds than this run on one thread, while OpenMP's threads
// spin at barriers (its default): with OMP_WAIT_POLICY=passive a descheduled thread costs only
// its own share, and two threads were 2.4-3.2x faster than one at the SAE's 64 x 8 under load.
constexpr double kParallelMinStepWork = 3e8;

// The bound in effect: kParallelMinStepWork unless changed (tests set 0 to run small steps'
// parallel paths).
double parallel_min_step_work();
void set_parallel_min_step_work(double work);

// OMP_WAIT_POLICY is passive (read each call, as the environment says now).
bool threads_wait_passively();

// While alive: OpenMP and OpenBLAS on one thread when `work` (the step's largest product's
// multiply-adds) is below parallel_min_step_work() and the threads spin (not
// threads_wait_passively()); else nothing changes. The count restored after.
class SmallStepOnOneThread {
 public:
  explicit SmallStepOnOneThread(double work);
  ~SmallStepOnOneThread();
  SmallStepOnOneThread(const SmallStepOnOneThread&) = delete;
  SmallStepOnOneThread& operator=(const SmallStepOnOneThread&) = delete;

 private:
  int restore_ = 0;  // the thread count to restore; 0: unchanged
};

}  // namespace hl
