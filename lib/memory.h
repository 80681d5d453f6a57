// Memory for tensors: 64-byte aligned float buffers from a caching pool, and free lists for
// the small fixed-size objects (tensor handles, storages) created by every op.
//
// Why: a training step creates the same buffers in the same sizes every iteration. Keeping
// freed buffers in size-class buckets makes the steady state allocate nothing from the heap
// (DESIGN.md), and keeps peak RSS equal to the peak of live tensors.
// Threads: each thread keeps its own cache (a buffer freed on another thread than the one
// that allocated it joins the freeing thread's cache), so two threads running their own models
// never share a free list; the statistics are process-wide atomics. A thread's cache is freed
// when the thread ends. OpenMP loops inside ops compute into buffers allocated before the loop.
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
PoolStats pool_stats();  // process-wide
void pool_reset_peak();
void pool_trim();  // gives the calling thread's cached buffers back to the heap

// A free list for objects of one type, one list per thread. Objects are recycled while the
// thread lives and returned to the heap when it ends.
template <class T>
struct FreeList {
  static void* take() {
#ifndef HEADLAB_NO_POOL
    if (Node* n = head) {
      head = n->next;
      return n;
    }
#endif
    return ::operator new(kBytes);
  }
  static void give(void* p) {
#ifndef HEADLAB_NO_POOL
    if (!ended) {
      static thread_local Reaper reaper;  // registers the thread-exit cleanup on first use
      (void)reaper;
      Node* n = static_cast<Node*>(p);
      n->next = head;
      head = n;
      return;
    }
#endif
    ::operator delete(p);
  }

 private:
  struct Node { Node* next; };
  static constexpr size_t kBytes = sizeof(T) > sizeof(Node) ? sizeof(T) : sizeof(Node);
  // Plain thread-locals stay readable after the thread's destructors ran (objects freed by
  // static destructors at exit then go straight to the heap).
  static inline thread_local Node* head = nullptr;
  static inline thread_local bool ended = false;
  struct Reaper {
    ~Reaper() {
      ended = true;
      while (Node* n = head) {
        head = n->next;
        ::operator delete(n);
      }
    }
  };
};

}  // namespace hl
