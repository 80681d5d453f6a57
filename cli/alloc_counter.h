// Counts heap allocations (every malloc-family call in the process, including OpenBLAS's and
// libstdc++'s) so `headlab bench` can show allocations per training step. The counting
// wrappers are compiled into the headlab binary only, and not in sanitizer builds (ASan
// intercepts malloc itself): there `available()` is false.
#pragma once
#include <cstdint>

namespace hl::alloc_counter {
bool available();
uint64_t count();  // malloc-family calls so far
}  // namespace hl::alloc_counter
