// What an op needs to record itself in the graph. Every op follows one pattern:
//
//   Tensor out = Tensor::empty(shape);            // forward: compute into out
//   ...
//   if (needs_graph({&a, &b}))
//     attach(out, "add", {a, b}, [a, b](TensorImpl& self) {
//       const float* g = self.grad->data();       // dL/d(out)
//       if (float* ga = grad_buffer(a)) ...       // ga += dL/da
//     });
//
// Closures capture what backward needs (inputs, saved statistics) but never `out` itself,
// which they receive as `self` (capturing it would make a reference cycle).
#pragma once
#include <span>

#include "tensor.h"

namespace hl {

inline bool needs_graph(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

template <class F>
void attach(Tensor& out, const char* op, std::initializer_list<Tensor> parents, F&& backward) {
  TensorImpl* o = out.impl();
  HL_CHECK(parents.size() <= kMaxParents, op, ": too many parents");
  o->requires_grad = true;
  o->op = op;
  o->n_parents = 0;
  for (const Tensor& p : parents)
    if (p.defined() && p.requires_grad()) o->parents[o->n_parents++] = p.ref();
  o->backward.set(std::forward<F>(backward));
}

// The gradient buffer of `t` to accumulate into (allocated and zeroed on first use), or
// nullptr when t needs no gradient.
float* grad_buffer(const Tensor& t);
// Like grad_buffer, but a buffer allocated by this call is left uninitialised and `fresh` is
// set: the caller must then write every element (gemm with beta = 0, `=` instead of `+=`).
// Saves a memset and a read of zeros on most activation gradients.
float* grad_buffer_for_overwrite(const Tensor& t, bool& fresh);

// For tensors that lie back to back in one storage (see storage_view): their gradients as
// one contiguous block, so one kernel can write all of them. If none has a gradient yet, one
// uninitialised block is allocated and each gets a view of it (`fresh` is set: write every
// element). Returns nullptr when the gradients cannot be one block (a tensor needs no
// gradient, or existing gradients are separate buffers): the caller then goes tensor by tensor.
float* grad_slab_for_overwrite(std::span<const Tensor> ts, bool& fresh);
// True if ts[i+1] starts where ts[i] ends in the same storage.
bool back_to_back(std::span<const Tensor> ts);

}  // namespace hl
