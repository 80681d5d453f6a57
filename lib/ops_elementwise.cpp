// Elementwise ops: binary with broadcasting, unary, scalar. Each op is a forward formula and
// its derivative, side by side, handed to one of two drivers (binary_op, unary_op).
#include <cmath>

#include "autograd.h"
#include "broadcast.h"
#include "activations.h"
#include "ops.h"
#include "parallel.h"
#include "profile.h"

namespace hl {

BroadcastPlan plan_broadcast(const char* op, const Shape& a, const Shape& b) {
  BroadcastPlan p;
  const int nd = std::max(a.ndim, b.ndim);
  p.out.ndim = nd;
  p.same = (a == b);
  int64_t sa = 1, sb = 1;
  for (int d = nd - 1; d >= 0; --d) {
    const int ia = d - (nd - a.ndim), ib = d - (nd - b.ndim);
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      fail(op, ": ", a.str(), " and ", b.str(), ": shapes cannot be broadcast (dimension ", d,
           ": ", da, " vs ", db, ")");
    p.out[d] = da == 1 ? db : da;
    p.stride_a[d] = da == 1 ? 0 : sa;
    p.stride_b[d] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  return p;
}

namespace {

// If b's shape is a's trailing dims (leading 1s allowed), the size of that block; else 0.
int64_t suffix_block(const Shape& a, const Shape& b) {
  int lead = 0;
  while (lead < b.ndim && b[lead] == 1) ++lead;
  const int k = b.ndim - lead;
  if (k == 0 || k > a.ndim || b.ndim > a.ndim) return 0;
  for (int d = 0; d < k; ++d)
    if (b[lead + d] != a[a.ndim - k + d]) return 0;
  return b.numel();
}

// z = f(x, y) with broadcasting. dfx(x, y, z, g) and dfy(...) are the contributions of one
// output element to dL/dx and dL/dy. dx_is_g: dL/dx = dL/dz (add, sub), so x may take over
// the output's gradient buffer instead of a copy of it (the residual stream's adds).
template <class F, class DX, class DY>
Tensor binary_op(const char* name, const Tensor& a, const Tensor& b, F f, DX dfx, DY dfy, bool dx_is_g = false) {
  HL_PROFILE(Elementwise);
  const BroadcastPlan plan = plan_broadcast(name, a.shape(), b.shape());
  Tensor out = Tensor::empty(plan.out);
  const float *x = a.data(), *y = b.data();
  float* z = out.data();
  const int64_t n = out.numel();
  const int64_t inner = suffix_block(a.shape(), b.shape());
  if (plan.same) {
    parallel_ranges(n, n, [&](int64_t lo, int64_t hi) {
      const float *xs = x, *ys = y;  // locals, so the loop vectorises (see parallel_ranges)
      float* zs = z;
      for (int64_t i = lo; i < hi; ++i) zs[i] = f(xs[i], ys[i]);
    });
  } else if (inner > 0) {  // b repeats along a's leading dims (bias, positions): no index math
    parallel_for(n / inner, n, [&](int64_t o) {
      const float *xs = x + o * inner, *ys = y;
      float* zs = z + o * inner;
      for (int64_t j = 0; j < inner; ++j) zs[j] = f(xs[j], ys[j]);
    });
  } else {
    for_each_broadcast(plan, [&](int64_t i, int64_t ia, int64_t ib) { z[i] = f(x[ia], y[ib]); });
  }
  if (needs_graph({&a, &b}))
    attach(out, name, {a, b}, [a, b, dfx, dfy, name, dx_is_g](TensorImpl& self) {
      HL_PROFILE(Elementwise);
      const BroadcastPlan plan = plan_broadcast(name, a.shape(), b.shape());
      const float *g = self.grad->data(), *z = self.data(), *x = a.data(), *y = b.data();
      const int64_t n = self.shape.numel();
      const int64_t inner = suffix_block(a.shape(), b.shape());
      if (plan.same) {  // fresh gradient buffers are written, not accumulated
        bool fx = false, fy = false;
        // d (+)= df(x, y, z, g) elementwise, pointers as locals (see parallel_ranges)
        auto grad_pass = [&](float* d, bool overwrite, auto df) {
          parallel_ranges(n, n, [&](int64_t lo, int64_t hi) {
            const float *xs = x, *ys = y, *zs = z, *gs = g;
            float* ds = d;
            if (overwrite)
              for (int64_t i = lo; i < hi; ++i) ds[i] = df(xs[i], ys[i], zs[i], gs[i]);
            else
              for (int64_t i = lo; i < hi; ++i) ds[i] += df(xs[i], ys[i], zs[i], gs[i]);
          });
        };
        if (dx_is_g && a.requires_grad() && !a.impl()->grad && !self.retains_grad) {
          // dL/dx = dL/dz exactly: x takes over this node's gradient buffer, which backward
          // drops after this closure anyway (nothing else holds it: no retain_grad)
          a.impl()->grad = self.grad;
        } else if (float* gx = grad_buffer_for_overwrite(a, fx)) {
          grad_pass(gx, fx, dfx);
        }
        float* gy = grad_buffer_for_overwrite(b, fy);  // after gx: a and b may be one tensor
        if (gy) grad_pass(gy, fy, dfy);
        return;
      }
      float* gx = grad_buffer(a);
      float* gy = grad_buffer(b);
      if (inner > 0) {
        if (gx)
          parallel_for(n / inner, n, [&](int64_t o) {
            const float *xs = x + o * inner, *ys = y, *zs = z + o * inner, *gs = g + o * inner;
            float* ds = gx + o * inner;
            for (int64_t j = 0; j < inner; ++j) ds[j] += dfx(xs[j], ys[j], zs[j], gs[j]);
          });
        if (gy)  // rows in order: a fixed summation order
          for (int64_t o = 0; o < n / inner; ++o) {
            const float *xs = x + o * inner, *ys = y, *zs = z + o * inner, *gs = g + o * inner;
            float* ds = gy;
            for (int64_t j = 0; j < inner; ++j) ds[j] += dfy(xs[j], ys[j], zs[j], gs[j]);
          }
      } else {  // sequential: broadcast inputs receive from many outputs
        for_each_broadcast(plan, [&](int64_t i, int64_t ia, int64_t ib) {
          if (gx) gx[ia] += dfx(x[ia], y[ib], z[i], g[i]);
          if (gy) gy[ib] += dfy(x[ia], y[ib], z[i], g[i]);
        });
      }
    });
  return out;
}

// y = f(x); df(x, y, g) is dL/dx for one element.
template <class F, class DF>
Tensor unary_op(const char* name, const Tensor& a, F f, DF df) {
  HL_PROFILE(Elementwise);
  Tensor out = Tensor::empty(a.shape());
  const float* x = a.data();
  float* y = out.data();
  const int64_t n = a.numel();
  parallel_ranges(n, n, [&](int64_t lo, int64_t hi) {
    const float* xs = x;  // locals, so the loop vectorises (see parallel_ranges)
    float* ys = y;
    for (int64_t i = lo; i < hi; ++i) ys[i] = f(xs[i]);
  });
  if (needs_graph({&a}))
    attach(out, name, {a}, [a, df](TensorImpl& self) {
      HL_PROFILE(Elementwise);
      bool fresh;
      float* gx = grad_buffer_for_overwrite(a, fresh);
      const float *g = self.grad->data(), *y = self.data(), *x = a.data();
      const int64_t n = self.shape.numel();
      parallel_ranges(n, n, [&](int64_t lo, int64_t hi) {
        const float *xs = x, *ys = y, *gs = g;
        float* ds = gx;
        if (fresh)
          for (int64_t i = lo; i < hi; ++i) ds[i] = df(xs[i], ys[i], gs[i]);
        else
          for (int64_t i = lo; i < hi; ++i) ds[i] += df(xs[i], ys[i], gs[i]);
      });
    });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary_op("add", a, b, [](float x, float y) { return x + y; },
                   [](float, float, float, float g) { return g; },
                   [](float, float, float, float g) { return g; }, /*dx_is_g=*/true);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary_op("sub", a, b, [](float x, float y) { return x - y; },
                   [](float, float, float, float g) { return g; },
                   [](float, float, float, float g) { return -g; }, /*dx_is_g=*/true);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary_op("mul", a, b, [](float x, float y) { return x * y; },
                   [](float, float y, float, float g) { return g * y; },
                   [](float x, float, float, float g) { return g * x; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary_op("div", a, b, [](float x, float y) { return x / y; },
                   [](float, float y, float, float g) { return g / y; },
                   [](float, float y, float z, float g) { return -g * z / y; });
}

Tensor neg(const Tensor& x) {
  return unary_op("neg", x, [](float v) { return -v; }, [](float, float, float g) { return -g; });
}
Tensor add_scalar(const Tensor& x, float s) {
  return unary_op("add_scalar", x, [s](float v) { return v + s; },
                  [](float, float, float g) { return g; });
}
Tensor mul_scalar(const Tensor& x, float s) {
  return unary_op("mul_scalar", x, [s](float v) { return v * s; },
                  [s](float, float, float g) { return g * s; });
}
Tensor pow(const Tensor& x, float p) {
  return unary_op("pow", x, [p](float v) { return std::pow(v, p); },
                  [p](float v, float, float g) { return g * p * std::pow(v, p - 1.f); });
}
Tensor exp(const Tensor& x) {
  return unary_op("exp", x, [](float v) { return std::exp(v); },
                  [](float, float y, float g) { return g * y; });
}
Tensor log(const Tensor& x) {
  return unary_op("log", x, [](float v) { return std::log(v); },
                  [](float v, float, float g) { return g / v; });
}
Tensor sqrt(const Tensor& x) {
  return unary_op("sqrt", x, [](float v) { return std::sqrt(v); },
                  [](float, float y, float g) { return g * 0.5f / y; });
}
Tensor tanh(const Tensor& x) {
  return unary_op("tanh", x, [](float v) { return std::tanh(v); },
                  [](float, float y, float g) { return g * (1.f - y * y); });
}
Tensor sigmoid(const Tensor& x) {
  return unary_op("sigmoid", x, [](float v) { return 1.f / (1.f + std::exp(-v)); },
                  [](float, float y, float g) { return g * y * (1.f - y); });
}
Tensor relu(const Tensor& x) {
  return unary_op("relu", x, [](float v) { return act::relu(v); }, [](float v, float, float g) { return act::relu_backward(v, g); });
}
Tensor relu2(const Tensor& x) {
  return unary_op("relu2", x, [](float v) { return act::relu2(v); }, [](float v, float, float g) { return act::relu2_backward(v, g); });
}
Tensor silu(const Tensor& x) {
  return unary_op("silu", x, [](float v) { return act::silu(v); }, [](float v, float, float g) { return act::silu_backward(v, g); });
}
Tensor gelu_tanh(const Tensor& x) {
  return unary_op("gelu_tanh", x, [](float v) { return act::gelu_tanh(v); }, [](float v, float, float g) { return act::gelu_tanh_backward(v, g); });
}
Tensor gelu_erf(const Tensor& x) {
  return unary_op("gelu_erf", x, [](float v) { return act::gelu_erf(v); }, [](float v, float, float g) { return act::gelu_erf_backward(v, g); });
}

// act(gate) * up in one pass over the elements, both gradients in one backward (the gated MLP's elementwise
// work: silu for SwiGLU, gelu for GeGLU, any activation of the list).
namespace {
// Calls f with the activation's forward and backward as branch-free functors (the loops then
// vectorise per activation, as linear_act's do).
template <class F>
void with_activation(Activation a, F&& f) {
  switch (a) {
    case Activation::GeluTanh: f([](float v) { return act::gelu_tanh(v); }, [](float v, float g) { return act::gelu_tanh_backward(v, g); }); break;
    case Activation::GeluErf: f([](float v) { return act::gelu_erf(v); }, [](float v, float g) { return act::gelu_erf_backward(v, g); }); break;
    case Activation::Relu: f([](float v) { return act::relu(v); }, [](float v, float g) { return act::relu_backward(v, g); }); break;
    case Activation::Relu2: f([](float v) { return act::relu2(v); }, [](float v, float g) { return act::relu2_backward(v, g); }); break;
    case Activation::Silu: f([](float v) { return act::silu(v); }, [](float v, float g) { return act::silu_backward(v, g); }); break;
  }
}
}  // namespace

// The loops below are `flatten`ed: with five activations instantiated in one function GCC stopped
// inlining exp_fast into them (a call per element, no vectors: 45% of S-llama's step, against 8%
// for S's fused GELU). flatten inlines every call in the loop's body, so each loop vectorises.
Tensor gated_act(const Tensor& gate, const Tensor& up, Activation activation) {
  HL_PROFILE(Elementwise);
  if (gate.shape() != up.shape())
    fail("gated_act: gate ", gate.shape().str(), " and up ", up.shape().str(), " must have the same shape");
  Tensor out = Tensor::empty(gate.shape());
  const int64_t n = gate.numel();
  with_activation(activation, [&](auto f, auto) {
    parallel_ranges(n, n, [&](int64_t lo, int64_t hi) __attribute__((flatten)) {
      const float *G = gate.data(), *U = up.data();
      float* Y = out.data();
      for (int64_t i = lo; i < hi; ++i) Y[i] = f(G[i]) * U[i];
    });
  });
  if (needs_graph({&gate, &up}))
    attach(out, "gated_act", {gate, up}, [gate, up, activation](TensorImpl& self) {
      HL_PROFILE(Elementwise);
      float* dg = grad_buffer(gate);
      float* du = grad_buffer(up);
      const int64_t n = self.shape.numel();
      with_activation(activation, [&](auto f, auto df) {
        parallel_ranges(n, n, [&](int64_t lo, int64_t hi) __attribute__((flatten)) {
          const float *G = gate.data(), *U = up.data(), *g = self.grad->data();
          float *dG = dg, *dU = du;
          if (dG)
            for (int64_t i = lo; i < hi; ++i) dG[i] += df(G[i], g[i] * U[i]);
          if (dU)
            for (int64_t i = lo; i < hi; ++i) dU[i] += f(G[i]) * g[i];
        });
      });
    });
  return out;
}

}  // namespace hl
