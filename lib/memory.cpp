#include "memory.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <unordered_map>
#include <vector>

namespace hl {
namespace {

constexpr size_t kAlign = 64;

// Process-wide statistics (every thread's pool).
std::atomic<size_t> g_bytes_live{0}, g_bytes_cached{0}, g_heap_allocs{0}, g_bytes_peak{0};

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

// One thread's cache of freed buffers by size class.
struct Pool {
  std::unordered_map<size_t, std::vector<float*>> free_by_size;
  size_t bytes_cached = 0;
  // Bytes this thread's allocations hold now (negative when other threads' buffers were freed
  // here), and the most that its allocations and its cache held together: the cache never grows
  // past that, so a thread that only drops what others made hands those buffers to the heap.
  int64_t live = 0, high_water = 0;
  void trim() {
    for (auto& [bytes, list] : free_by_size)
      for (float* p : list) std::free(p);
    free_by_size.clear();
    g_bytes_cached.fetch_sub(bytes_cached, std::memory_order_relaxed);
    bytes_cached = 0;
  }
};

// Plain thread-locals (no destructor) stay readable while the thread's destructors run, so a
// buffer freed by a static destructor at exit, after the reaper, goes straight to the heap.
thread_local Pool* t_pool = nullptr;
thread_local bool t_pool_ended = false;
struct PoolReaper {
  ~PoolReaper() {
    if (t_pool) t_pool->trim();
    delete t_pool;
    t_pool = nullptr;
    t_pool_ended = true;
  }
};

Pool* pool() {  // null once the thread is ending
  if (!t_pool && !t_pool_ended) {
    static thread_local PoolReaper reaper;
    (void)reaper;
    t_pool = new Pool();
  }
  return t_pool;
}

void count_live(size_t bytes) {
  const size_t live = g_bytes_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = g_bytes_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_bytes_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

}  // namespace

float* buffer_alloc(size_t n_floats) {
  const size_t bytes = rounded_bytes(n_floats);
  count_live(tensor_bytes(n_floats));
#ifndef HEADLAB_NO_POOL
  if (Pool* P = pool()) {
    P->live += static_cast<int64_t>(bytes);
    P->high_water = std::max(P->high_water, P->live + static_cast<int64_t>(P->bytes_cached));
    auto it = P->free_by_size.find(bytes);
    if (it != P->free_by_size.end() && !it->second.empty()) {
      float* p = it->second.back();
      it->second.pop_back();
      P->bytes_cached -= bytes;
      g_bytes_cached.fetch_sub(bytes, std::memory_order_relaxed);
      return p;
    }
  }
#endif
  g_heap_allocs.fetch_add(1, std::memory_order_relaxed);
  void* p = std::aligned_alloc(kAlign, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<float*>(p);
}

void buffer_free(float* p, size_t n_floats) {
  if (!p) return;
  const size_t bytes = rounded_bytes(n_floats);
  g_bytes_live.fetch_sub(tensor_bytes(n_floats), std::memory_order_relaxed);
#ifndef HEADLAB_NO_POOL
  Pool* P = pool();
  if (P) P->live -= static_cast<int64_t>(bytes);
  if (P && P->bytes_cached + bytes <= static_cast<size_t>(P->high_water)) {
    P->free_by_size[bytes].push_back(p);
    P->bytes_cached += bytes;
    g_bytes_cached.fetch_add(bytes, std::memory_order_relaxed);
    return;
  }
#endif
  std::free(p);
}

PoolStats pool_stats() {
  PoolStats s;
  s.bytes_live = g_bytes_live.load(std::memory_order_relaxed);
  s.bytes_cached = g_bytes_cached.load(std::memory_order_relaxed);
  s.heap_allocs = g_heap_allocs.load(std::memory_order_relaxed);
  s.bytes_peak = g_bytes_peak.load(std::memory_order_relaxed);
  return s;
}
void pool_reset_peak() { g_bytes_peak.store(g_bytes_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }
void pool_trim() {
  if (Pool* P = pool()) P->trim();
  malloc_trim(0);  // hand the freed pages back to the OS, so RSS falls after an evaluation
}

}  // namespace hl
