// Memory for tensors: 64-byte aligned float buffers from a caching pool, and free lists for
// the small fixed-size objects (tensor handles, storages) created by every op.
//
// Why: a training step creates the same buffers in the same sizes every iteration. Keeping
// freed buffers in size-class buckets makes the steady state allocate nothing from the heap
// (DESIGN.md), and keeps peak RSS equal to the peak of live tensors.
// Not thread-safe: tensors are created and destroyed on the calling thread only; OpenMP
// loops inside ops compute into buffers allocated before the loop.
// Build with -DHEADLAB_NO_POOL (the sanitizer build does) to bypass all caching, so that
// AddressSanitizer sees every use-after-free.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hl {

float* buffer_alloc(size_t n_floats);  // 64-byte aligned, contents undefined
void buffer_free(float* p, size_t n_floats);

struct PoolStats {
  size_t bytes_live = 0;     // of tensors handed out and not yet returned (their own size)
  size_t bytes_cached = 0;   // returned, kept for reuse
  size_t heap_allocs = 0;    // buffers that had to come from the heap (cache misses)
  size_t bytes_peak = 0;     // most bytes live at once since the last pool_reset_peak()
};
PoolStats pool_stats();
void pool_reset_peak();
void pool_trim();  // gives cached buffers back to the heap

// A free list for objects of one type. Objects are recycled, never returned to the heap.
template <class T>
struct FreeList {
  static void* take() {
#ifndef HEADLAB_NO_POOL
    if (head) {
      Node* n = head;
      head = n->next;
      return n;
    }
#endif
    return ::operator new(sizeof(T) > sizeof(Node) ? sizeof(T) : sizeof(Node));
  }
  static void give(void* p) {
#ifndef HEADLAB_NO_POOL
    Node* n = static_cast<Node*>(p);
    n->next = head;
    head = n;
#else
    ::operator delete(p);
#endif
  }

 private:
  struct Node { Node* next; };
  static inline Node* head = nullptr;
};

}  // namespace hl
