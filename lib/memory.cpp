#include "memory.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <unordered_map>
#include <vector>

namespace hl {
namespace {

constexpr size_t kAlign = 64;

// The size class of a buffer: 64-byte multiples up to 4 KiB, then eight classes per doubling
// (at most 12.5% unused). Batches whose size varies from step to step (the live positions of
// padded tasks) then reuse a few classes instead of missing the cache on every new size.
size_t rounded_bytes(size_t n_floats) {
  size_t bytes = n_floats * sizeof(float);
  if (bytes == 0) bytes = kAlign;
  size_t step = kAlign;
  if (bytes > 4096) {
    const int top = 63 - __builtin_clzll(bytes);  // bytes in [2^top, 2^(top+1))
    step = size_t{1} << (top - 3);
  }
  return (bytes + step - 1) / step * step;
}

struct Pool {
  std::unordered_map<size_t, std::vector<float*>> free_by_size;
  PoolStats stats;
  ~Pool() { trim(); }
  void trim() {
    for (auto& [bytes, list] : free_by_size)
      for (float* p : list) std::free(p);
    free_by_size.clear();
    stats.bytes_cached = 0;
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: tensors in static objects may outlive it
  return *p;
}

}  // namespace

float* buffer_alloc(size_t n_floats) {
  size_t bytes = rounded_bytes(n_floats);
  Pool& P = pool();
  P.stats.bytes_live += bytes;
  P.stats.bytes_peak = std::max(P.stats.bytes_peak, P.stats.bytes_live);
#ifndef HEADLAB_NO_POOL
  auto it = P.free_by_size.find(bytes);
  if (it != P.free_by_size.end() && !it->second.empty()) {
    float* p = it->second.back();
    it->second.pop_back();
    P.stats.bytes_cached -= bytes;
    return p;
  }
#endif
  ++P.stats.heap_allocs;
  void* p = std::aligned_alloc(kAlign, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<float*>(p);
}

void buffer_free(float* p, size_t n_floats) {
  if (!p) return;
  size_t bytes = rounded_bytes(n_floats);
  Pool& P = pool();
  P.stats.bytes_live -= bytes;
#ifndef HEADLAB_NO_POOL
  P.free_by_size[bytes].push_back(p);
  P.stats.bytes_cached += bytes;
#else
  std::free(p);
#endif
}

PoolStats pool_stats() { return pool().stats; }
void pool_reset_peak() { pool().stats.bytes_peak = pool().stats.bytes_live; }
void pool_trim() {
  pool().trim();
  malloc_trim(0);  // hand the freed pages back to the OS, so RSS falls after an evaluation
}

}  // namespace hl
