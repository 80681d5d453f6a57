#include "cli/alloc_counter.h"

#include <atomic>
#include <cstddef>

namespace {
std::atomic<uint64_t> g_calls{0};
}

#if !defined(HEADLAB_NO_POOL) && defined(__GLIBC__)
// Interpose the malloc family and forward to glibc's implementation.
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t s) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(n, s);
}
void* realloc(void* p, size_t n) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(p, n);
}
void* memalign(size_t a, size_t n) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(a, n);
}
void* aligned_alloc(size_t a, size_t n) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(a, n);
}
int posix_memalign(void** out, size_t a, size_t n) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  void* p = __libc_memalign(a, n);
  if (!p && n) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}
namespace hl::alloc_counter {
bool available() { return true; }
}  // namespace hl::alloc_counter
#else
namespace hl::alloc_counter {
bool available() { return false; }
}  // namespace hl::alloc_counter
#endif

namespace hl::alloc_counter {
uint64_t count() { return g_calls.load(std::memory_order_relaxed); }
}  // namespace hl::alloc_counter
