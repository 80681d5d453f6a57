// Tensor: an N-d float32 array (row-major, 64-byte aligned) with reverse-mode autograd.
//
// Layout policy: every tensor is contiguous. `reshape` and `detach` share storage (views);
// transpose/permute/slice/concat/split copy. Matrix transposes never copy: matmul and
// linear pass them to BLAS as flags. Contiguity keeps every kernel a simple loop.
//
// Autograd (define-by-run, micrograd's shape): an op computes its output, then attaches a
// backward closure and its parents to the output (see `attach` in autograd.h). backward()
// walks the graph in reverse topological order (iteratively), each closure accumulates (+=)
// into its parents' .grad, and each node's closure and parent links are dropped once run,
// so the graph is freed by backward.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "core.h"
#include "inline_function.h"
#include "memory.h"
#include "rng.h"

namespace hl {

constexpr int kMaxParents = 8;  // linear_stacked: x, 3 weights, 3 biases

struct Storage {
  std::atomic<int> refs{0};
  float* data = nullptr;
  size_t n_floats = 0;
  explicit Storage(size_t n) : data(buffer_alloc(n)), n_floats(n) {}
  ~Storage() { buffer_free(data, n_floats); }
  static void* operator new(size_t) { return FreeList<Storage>::take(); }
  static void operator delete(void* p) { FreeList<Storage>::give(p); }
};

struct TensorImpl;
using BackwardFn = InlineFunction<void(TensorImpl& self)>;

struct TensorImpl {
  std::atomic<int> refs{0};
  Ref<Storage> storage;
  int64_t offset = 0;  // in floats, into storage
  Shape shape;
  bool requires_grad = false;
  bool retains_grad = false;  // keep .grad of a non-leaf after backward
  Ref<TensorImpl> grad;
  // Graph: set only on outputs of ops recorded while grad mode is on.
  BackwardFn backward;
  Ref<TensorImpl> parents[kMaxParents];
  int n_parents = 0;
  const char* op = nullptr;  // name of the op that made it (nullptr for leaves)
  uint32_t visit_mark = 0;

  float* data() { return storage->data + offset; }
  bool is_leaf() const { return op == nullptr; }

  TensorImpl() { live_count.fetch_add(1, std::memory_order_relaxed); }
  ~TensorImpl() {
    release_graph();
    live_count.fetch_sub(1, std::memory_order_relaxed);
  }
  // Drops parents and closure without recursion, so a very long graph (100k ops) that is
  // dropped without backward cannot overflow the stack.
  void release_graph();
  static inline std::atomic<int64_t> live_count{0};  // for leak tests
  static void* operator new(size_t) { return FreeList<TensorImpl>::take(); }
  static void operator delete(void* p) { FreeList<TensorImpl>::give(p); }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Ref<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories -----------------------------------------------------------------------
  static Tensor empty(const Shape& shape);  // uninitialised
  static Tensor zeros(const Shape& shape);
  static Tensor ones(const Shape& shape);
  static Tensor full(const Shape& shape, float value);
  static Tensor scalar(float value);  // shape ()
  static Tensor arange(int64_t n);    // 0..n-1, shape (n)
  static Tensor from(const Shape& shape, const std::vector<float>& values);
  static Tensor randn(const Shape& shape, Rng& rng, float mean = 0.f, float std = 1.f);
  static Tensor uniform(const Shape& shape, Rng& rng, float lo = 0.f, float hi = 1.f);

  // ---- metadata and element access -----------------------------------------------------------
  bool defined() const { return static_cast<bool>(impl_); }
  const Shape& shape() const { return impl_->shape; }
  int ndim() const { return impl_->shape.ndim; }
  int64_t size(int axis) const;  // negative axes count from the end
  int64_t numel() const { return impl_->shape.numel(); }
  float* data() const { return impl_->data(); }
  float item() const;  // the only element of a one-element tensor
  float at(std::initializer_list<int64_t> index) const;
  float& at(std::initializer_list<int64_t> index);
  std::vector<float> to_vector() const;
  void copy_from(const Tensor& src);  // same numel; no autograd
  void fill_(float value);            // in place; no autograd
  Tensor clone() const;               // deep copy, no graph
  std::string str() const;            // short human-readable dump

  // ---- autograd ---------------------------------------------------------------------------
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& requires_grad_(bool on = true);  // leaves only
  bool is_leaf() const { return impl_->is_leaf(); }
  Tensor grad() const { return Tensor(impl_->grad); }  // undefined until a backward reaches it
  void zero_grad() const;                              // drops .grad
  void retain_grad() const;  // keep this non-leaf's gradient after backward (e.g. attention weights)
  Tensor detach() const;  // shares storage, no graph
  // Backward from this tensor. A one-element tensor may omit grad_output (taken as 1).
  void backward(const Tensor& grad_output = Tensor(), bool retain_graph = false) const;

  TensorImpl* impl() const { return impl_.get(); }
  const Ref<TensorImpl>& ref() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  Ref<TensorImpl> impl_;
};

// A leaf of `shape` over base's storage from element `offset` (relative to base's data):
// writes through either are seen by both. Used for parameter slabs, e.g. W_Q, W_K and W_V as
// consecutive rows of one (3d, d) block so one sgemm computes all three projections.
Tensor storage_view(const Tensor& base, int64_t offset, const Shape& shape);

// ---- grad mode ------------------------------------------------------------------------------
bool grad_enabled();
// Within its scope no op records a graph: outputs do not require grad and keep no parents.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// ---- threads --------------------------------------------------------------------------------
// Sets the thread count of our OpenMP loops and of OpenBLAS (the OpenMP build shares the pool),
// at most usable_cores(): more threads than cores only wait for each other.
void set_num_threads(int n);
int usable_cores();  // the cores this process may run on (its CPU affinity)
// Of those cores, how many other processes leave idle, sampled over `window_s` seconds of
// /proc/stat (the calling process sleeps meanwhile): with one other CPU-bound process on two
// cores, 1. Where /proc/stat cannot be read, usable_cores().
int idle_cores(double window_s = 0.06);
int num_threads();

}  // namespace hl
