// OpenMP conventions. One parallel level only: loops here never call multi-threaded BLAS.
// Static schedules with fixed chunking keep results identical for a given thread count.
#pragma once
#include <cstdint>

namespace hl {
// Below this many elements a loop runs on one thread: forking costs more than it saves.
constexpr int64_t kParallelMinElems = 1 << 15;
}  // namespace hl
