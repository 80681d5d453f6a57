// OpenMP conventions. One parallel level only: loops here never call multi-threaded BLAS.
// Static schedules with fixed chunking keep results identical for a given thread count.
// Small loops never enter an OpenMP region at all: libgomp allocates a fresh team for every
// region run on one thread (an `if(false)` clause), which would cost heap allocations per op.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace hl {

// Below this much work (elements touched) a loop runs on the calling thread: forking costs
// more than it saves.
constexpr int64_t kParallelMinElems = 1 << 15;

// Threads for a kernel touching `work` elements: all of them, or 1 when small or nested.
inline int threads_for(int64_t work) {
  return work < kParallelMinElems || omp_in_parallel() ? 1 : omp_get_max_threads();
}

// Rows [lo, hi) of thread t of n, boundaries on multiples of 16 (whole register tiles and
// cache lines).
inline std::pair<int64_t, int64_t> row_block(int64_t rows, int t, int n) {
  const int64_t lo = std::min(rows, (rows * t / n + 15) / 16 * 16);
  const int64_t hi = t + 1 == n ? rows : std::min(rows, (rows * (t + 1) / n + 15) / 16 * 16);
  return {lo, std::max(lo, hi)};
}

// Runs f(t, n) once on each of n threads in one region, for kernels whose threads share more
// than one loop (e.g. work on their own rows, a barrier, then add partial sums in thread
// order). n <= 1 runs f(0, 1) on the caller without entering OpenMP.
template <class F>
inline void run_on_threads(int n, F&& f) {
  if (n <= 1) {
    f(0, 1);
    return;
  }
#pragma omp parallel num_threads(n)
  f(omp_get_thread_num(), omp_get_num_threads());
}

// for i in [0, n): f(i), split statically over the threads when `work` is large enough.
template <class F>
inline void parallel_for(int64_t n, int64_t work, F&& f) {
  if (n < 2 || threads_for(work) == 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// For each thread's contiguous part [lo, hi) of [0, n): f(lo, hi) (all on the caller when
// `work` is small). For elementwise loops: copy the pointers into locals inside f. GCC does
// not vectorise a loop whose pointers it loads through a lambda's by-reference captures,
// which is what `parallel_for(n, n, [&](i) { y[i] = ... })` compiles to.
template <class F>
inline void parallel_ranges(int64_t n, int64_t work, F&& f) {
  run_on_threads(n < 32 ? 1 : threads_for(work), [&](int t, int k) {
    const auto [lo, hi] = row_block(n, t, k);
    if (hi > lo) f(lo, hi);
  });
}

}  // namespace hl
