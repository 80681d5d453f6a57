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

}  // namespace hl
