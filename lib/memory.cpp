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

// A tensor's bytes: whole 64-byte lines (what the statistics count).
size_t tensor_bytes(size_t n_floats) {
  const size_t bytes = n_floats ? n_floats * sizeof(float) : kAlign;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// The size class of a pooled buffer: 64-byte multiples up to 4 KiB, then eight classes per
// doubling (at most 12.5% unused). Batches whose size varies from step to step (the live
// positions of padded tasks) then reuse a few classes instead of missing the cache on every new
// size. Without the pool (sanitizer builds) a buffer is its tensor's size, so AddressSanitizer
// sees any read past it.
size_t rounded_bytes(size_t n_floats) {
  const size_t bytes = tensor_bytes(n_floats);
  size_t step = kAlign;
#ifndef HEADLAB_NO_POOL
  if (bytes > 4096) {
    const int top = 63 - __builtin_clzll(bytes);  // bytes in [2^top, 2^(top+1))
    step = size_t{1} << (top - 3);
  }
#endif
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
  const size_t bytes = rounded_bytes(n_floats);
  Pool& P = pool();
  P.stats.bytes_live += tensor_bytes(n_floats);
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
  const size_t bytes = rounded_bytes(n_floats);
  Pool& P = pool();
  P.stats.bytes_live -= tensor_bytes(n_floats);
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
