// OpenMP conventions. One parallel level only: loops here never call multi-threaded BLAS.
// Static schedules with fixed chunking keep results identical for a given thread count.
#pragma once
#include <omp.h>

#include <cstdint>

namespace hl {

// Below this much work (elements touched) a loop runs on the calling thread: forking costs
// more than it saves.
constexpr int64_t kParallelMinElems = 1 << 15;

// for i in [0, n): f(i), split statically over the threads when `work` is large enough.
// Small loops never enter an OpenMP region at all: libgomp allocates a fresh team for every
// region run on one thread (an `if(false)` clause), which would cost heap allocations per op.
template <class F>
inline void parallel_for(int64_t n, int64_t work, F&& f) {
  if (n < 2 || work < kParallelMinElems || omp_in_parallel() || omp_get_max_threads() == 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace hl
