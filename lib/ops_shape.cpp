// Shape ops. reshape is a view (shares storage); permute, slice and concat copy, so every
// tensor stays contiguous.
#include <cstring>

#include "autograd.h"
#include "broadcast.h"
#include "ops.h"

namespace hl {

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int d = 0; d < s.ndim; ++d) {
    if (s[d] == -1) {
      if (infer >= 0) fail("reshape: ", x.shape().str(), " to ", shape.str(), ": more than one -1");
      infer = d;
    } else if (s[d] < 0) {
      fail("reshape: ", x.shape().str(), " to ", shape.str(), ": negative dimension");
    } else {
      known *= s[d];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known)
      fail("reshape: ", x.shape().str(), " to ", shape.str(), ": cannot infer the -1 dimension");
    s[infer] = x.numel() / known;
  }
  if (s.numel() != x.numel())
    fail("reshape: ", x.shape().str(), " to ", shape.str(), ": element counts differ (",
         x.numel(), " vs ", s.numel(), ")");
  Tensor y = storage_view(x, 0, s);
  if (needs_graph({&x}))
    attach(y, "reshape", {x}, [x](TensorImpl& self) {
      const float* g = self.grad->data();
      float* gx = grad_buffer(x);
      for (int64_t i = 0, n = self.shape.numel(); i < n; ++i) gx[i] += g[i];
    });
  return y;
}

Tensor tap(const Tensor& x, std::function<void(const Tensor& grad)> on_grad) {
  Tensor y = storage_view(x, 0, x.shape());
  if (needs_graph({&x}))
    attach(y, "tap", {x}, [x, on_grad = std::move(on_grad)](TensorImpl& self) {
      const Tensor g(self.grad);
      if (on_grad) on_grad(g);
      const float* gp = self.grad->data();
      float* gx = grad_buffer(x);
      for (int64_t i = 0, n = self.shape.numel(); i < n; ++i) gx[i] += gp[i];
    });
  return y;
}

namespace {
// Output dim d of permute(x, perm) walks input dim perm[d]: strides for for_each_broadcast.
BroadcastPlan permute_plan(const Shape& in, const std::vector<int>& perm) {
  int64_t in_stride[kMaxDims];
  int64_t st = 1;
  for (int d = in.ndim - 1; d >= 0; --d) {
    in_stride[d] = st;
    st *= in[d];
  }
  BroadcastPlan p;
  p.out.ndim = in.ndim;
  for (int d = 0; d < in.ndim; ++d) {
    p.out[d] = in[perm[d]];
    p.stride_a[d] = in_stride[perm[d]];
    p.stride_b[d] = 0;
  }
  return p;
}
}  // namespace

Tensor permute(const Tensor& x, const std::vector<int>& perm_in) {
  const int nd = x.ndim();
  if (static_cast<int>(perm_in.size()) != nd)
    fail("permute: ", perm_in.size(), " axes given for shape ", x.shape().str());
  std::vector<int> perm(perm_in.size());
  bool seen[kMaxDims] = {false};
  for (int d = 0; d < nd; ++d) {
    perm[d] = normalize_axis("permute", perm_in[d], nd);
    if (seen[perm[d]]) fail("permute: axis ", perm_in[d], " repeated for shape ", x.shape().str());
    seen[perm[d]] = true;
  }
  const BroadcastPlan plan = permute_plan(x.shape(), perm);
  Tensor y = Tensor::empty(plan.out);
  const float* X = x.data();
  float* Y = y.data();
  for_each_broadcast(plan, [&](int64_t i, int64_t ix, int64_t) { Y[i] = X[ix]; });
  if (needs_graph({&x}))
    attach(y, "permute", {x}, [x, perm](TensorImpl& self) {
      const BroadcastPlan plan = permute_plan(x.shape(), perm);
      const float* g = self.grad->data();
      float* gx = grad_buffer(x);
      for_each_broadcast(plan, [&](int64_t i, int64_t ix, int64_t) { gx[ix] += g[i]; });
    });
  return y;
}

Tensor transpose(const Tensor& x, int axis0, int axis1) {
  const int a = normalize_axis("transpose", axis0, x.ndim());
  const int b = normalize_axis("transpose", axis1, x.ndim());
  std::vector<int> perm(x.ndim());
  for (int d = 0; d < x.ndim(); ++d) perm[d] = d;
  std::swap(perm[a], perm[b]);
  return permute(x, perm);
}

namespace {
// x viewed as (outer, n_axis, inner) around `axis`.
void outer_inner(const Shape& s, int axis, int64_t& outer, int64_t& inner) {
  outer = inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.ndim; ++d) inner *= s[d];
}
}  // namespace

Tensor slice(const Tensor& x, int axis_in, int64_t start, int64_t end) {
  const int axis = normalize_axis("slice", axis_in, x.ndim());
  const int64_t n = x.size(axis);
  if (start < 0 || end > n || start > end)
    fail("slice: [", start, ", ", end, ") out of range for axis ", axis_in, " of shape ",
         x.shape().str());
  int64_t outer, inner;
  outer_inner(x.shape(), axis, outer, inner);
  Shape so = x.shape();
  so[axis] = end - start;
  Tensor y = Tensor::empty(so);
  const int64_t chunk = (end - start) * inner;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(y.data() + o * chunk, x.data() + (o * n + start) * inner, sizeof(float) * chunk);
  if (needs_graph({&x}))
    attach(y, "slice", {x}, [x, outer, n, start, chunk, inner](TensorImpl& self) {
      const float* g = self.grad->data();
      float* gx = grad_buffer(x);
      for (int64_t o = 0; o < outer; ++o) {
        float* dst = gx + (o * n + start) * inner;
        for (int64_t k = 0; k < chunk; ++k) dst[k] += g[o * chunk + k];
      }
    });
  return y;
}

Tensor concat(const std::vector<Tensor>& xs, int axis_in) {
  HL_CHECK(!xs.empty(), "concat: no tensors given");
  constexpr size_t kParts = 4;  // tensors joined by one node; more are joined in a tree
  if (xs.size() > kParts) {
    const size_t half = xs.size() / 2;
    return concat({concat(std::vector<Tensor>(xs.begin(), xs.begin() + half), axis_in),
                   concat(std::vector<Tensor>(xs.begin() + half, xs.end()), axis_in)},
                  axis_in);
  }
  const Shape& s0 = xs[0].shape();
  const int axis = normalize_axis("concat", axis_in, s0.ndim);
  Shape so = s0;
  so[axis] = 0;
  for (const Tensor& t : xs) {
    bool ok = t.ndim() == s0.ndim;
    for (int d = 0; ok && d < s0.ndim; ++d) ok = d == axis || t.size(d) == s0[d];
    if (!ok) fail("concat: ", s0.str(), " and ", t.shape().str(), " differ outside axis ", axis_in);
    so[axis] += t.size(axis);
  }
  int64_t outer, inner;
  outer_inner(so, axis, outer, inner);
  Tensor y = Tensor::empty(so);
  int64_t at = 0;  // running offset along the axis
  for (const Tensor& t : xs) {
    const int64_t chunk = t.size(axis) * inner;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(y.data() + (o * so[axis] + at) * inner, t.data() + o * chunk, sizeof(float) * chunk);
    at += t.size(axis);
  }
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : xs) inputs.push_back(&t);
  bool any = false;
  for (const Tensor* t : inputs) any = any || needs_graph({t});
  if (any) {
    Tensor p[kParts];
    for (size_t i = 0; i < xs.size(); ++i) p[i] = xs[i];
    attach(y, "concat", {p[0], p[1], p[2], p[3]},
           [p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3], axis, outer, inner](TensorImpl& self) {
             const Tensor parts[kParts] = {p0, p1, p2, p3};
             const float* g = self.grad->data();
             const int64_t total = self.shape[axis];
             int64_t at = 0;
             for (const Tensor& t : parts) {
               if (!t.defined()) break;
               const int64_t chunk = t.size(axis) * inner;
               if (float* gt = grad_buffer(t))
                 for (int64_t o = 0; o < outer; ++o)
                   for (int64_t k = 0; k < chunk; ++k) gt[o * chunk + k] += g[(o * total + at) * inner + k];
               at += t.size(axis);
             }
           });
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int axis_in) {
  const int axis = normalize_axis("split", axis_in, x.ndim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) fail("split: negative size ", s, " for shape ", x.shape().str());
    total += s;
  }
  if (total != x.size(axis))
    fail("split: sizes add up to ", total, " but axis ", axis_in, " of ", x.shape().str(),
         " has ", x.size(axis));
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (int64_t s : sizes) {
    parts.push_back(slice(x, axis, at, at + s));
    at += s;
  }
  return parts;
}

}  // namespace hl
