// Reductions over a set of axes (sum, mean, max), keepdim or not. Each input element maps
// to one output element through a broadcast plan in which the reduced axes have stride 0.
#include <algorithm>
#include <limits>

#include "autograd.h"
#include "broadcast.h"
#include "ops.h"

namespace hl {
namespace {

struct ReducePlan {
  Shape keep;    // output shape with reduced axes kept as 1
  Shape out;     // keep, or keep without the reduced axes
  int64_t count = 1;  // elements reduced into each output
};

ReducePlan plan_reduce(const char* op, const Shape& s, std::vector<int> axes, bool keepdim) {
  ReducePlan p;
  bool reduced[kMaxDims] = {false};
  if (axes.empty())
    for (int d = 0; d < s.ndim; ++d) reduced[d] = true;
  for (int a : axes) {
    const int d = normalize_axis(op, a, s.ndim);
    if (reduced[d] && !axes.empty()) fail(op, ": axis ", a, " given twice for shape ", s.str());
    reduced[d] = true;
  }
  p.keep = s;
  for (int d = 0; d < s.ndim; ++d)
    if (reduced[d]) {
      p.count *= s[d];
      p.keep[d] = 1;
      if (s[d] == 0) fail(op, ": cannot reduce over empty axis ", d, " of shape ", s.str());
    }
  if (keepdim) {
    p.out = p.keep;
  } else {
    for (int d = 0; d < s.ndim; ++d)
      if (!reduced[d]) p.out.push_back(s[d]);
  }
  return p;
}

Tensor sum_scaled(const char* name, const Tensor& x, std::vector<int> axes, bool keepdim,
                  bool divide) {
  const ReducePlan rp = plan_reduce(name, x.shape(), std::move(axes), keepdim);
  const float scale = divide ? 1.f / static_cast<float>(rp.count) : 1.f;
  const BroadcastPlan bp = plan_broadcast(name, x.shape(), rp.keep);
  Tensor out = Tensor::zeros(rp.out);
  const float* X = x.data();
  float* Y = out.data();
  for_each_broadcast(bp, [&](int64_t i, int64_t, int64_t j) { Y[j] += X[i]; });
  if (scale != 1.f)
    for (int64_t j = 0, n = out.numel(); j < n; ++j) Y[j] *= scale;
  if (needs_graph({&x}))
    attach(out, name, {x}, [x, keep = rp.keep, scale, name](TensorImpl& self) {
      const BroadcastPlan bp = plan_broadcast(name, x.shape(), keep);
      const float* g = self.grad->data();
      float* gx = grad_buffer(x);
      for_each_broadcast(bp, [&](int64_t i, int64_t, int64_t j) { gx[i] += g[j] * scale; });
    });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, std::vector<int> axes, bool keepdim) {
  return sum_scaled("sum", x, std::move(axes), keepdim, false);
}
Tensor mean(const Tensor& x, std::vector<int> axes, bool keepdim) {
  return sum_scaled("mean", x, std::move(axes), keepdim, true);
}

Tensor max(const Tensor& x, std::vector<int> axes, bool keepdim) {
  const ReducePlan rp = plan_reduce("max", x.shape(), std::move(axes), keepdim);
  const BroadcastPlan bp = plan_broadcast("max", x.shape(), rp.keep);
  Tensor out = Tensor::full(rp.out, -std::numeric_limits<float>::infinity());
  std::vector<int64_t> argmax(static_cast<size_t>(out.numel()), -1);
  const float* X = x.data();
  float* Y = out.data();
  for_each_broadcast(bp, [&](int64_t i, int64_t, int64_t j) {
    if (argmax[j] < 0 || X[i] > Y[j]) {  // first occurrence wins ties
      Y[j] = X[i];
      argmax[j] = i;
    }
  });
  if (needs_graph({&x}))
    attach(out, "max", {x}, [x, argmax = std::move(argmax)](TensorImpl& self) {
      const float* g = self.grad->data();
      float* gx = grad_buffer(x);
      for (size_t j = 0; j < argmax.size(); ++j) gx[argmax[j]] += g[j];
    });
  return out;
}

}  // namespace hl
