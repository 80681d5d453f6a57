// Fused neural-net ops: softmax / log_softmax, masked_fill, cross_entropy (log-softmax + NLL),
// layer_norm, rms_norm, embedding, dropout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "autograd.h"
#include "broadcast.h"
#include "fastmath.h"
#include "ops.h"
#include "parallel.h"
#include "profile.h"

namespace hl {

Ids::Ids(const Shape& s, std::vector<int32_t> v) : shape(s), data(std::move(v)) {
  HL_CHECK(static_cast<int64_t>(data.size()) == s.numel(), "Ids: ", data.size(),
           " values for shape ", s.str());
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Integer ids saved for backward inside a pooled tensor buffer (no heap allocation per step).
Tensor save_ids(const Ids& ids) {
  Tensor t = Tensor::empty({ids.numel()});
  if (!ids.data.empty()) std::memcpy(t.data(), ids.data.data(), sizeof(int32_t) * ids.data.size());
  return t;
}
const int32_t* saved_ids(const Tensor& t) { return reinterpret_cast<const int32_t*>(t.data()); }

// A softmax axis viewed as rows: element (o, a, i) sits at o*A*inner + a*inner + i.
struct AxisRows {
  int64_t outer, A, inner;
};
AxisRows axis_rows(const char* op, const Shape& s, int axis) {
  const int ax = normalize_axis(op, axis, s.ndim);
  AxisRows r{1, s[ax], 1};
  for (int d = 0; d < ax; ++d) r.outer *= s[d];
  for (int d = ax + 1; d < s.ndim; ++d) r.inner *= s[d];
  return r;
}

// y = softmax or log_softmax of x along the axis. A row of all -inf gives 0 (softmax) or -inf
// (log_softmax) instead of NaN.
void softmax_forward(const float* x, float* y, AxisRows r, bool log_out) {
  const int64_t rows = r.outer * r.inner;
  parallel_for(rows, rows * r.A, [&](int64_t row) {
    const int64_t base = (row / r.inner) * r.A * r.inner + row % r.inner, st = r.inner;
    float m = kNegInf;
    for (int64_t a = 0; a < r.A; ++a) m = std::max(m, x[base + a * st]);
    if (m == kNegInf) {
      for (int64_t a = 0; a < r.A; ++a) y[base + a * st] = log_out ? kNegInf : 0.f;
      return;
    }
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t a = 0; a < r.A; ++a) s += exp_fast(x[base + a * st] - m);
    if (log_out) {
      const float lse = m + std::log(s);
      for (int64_t a = 0; a < r.A; ++a) y[base + a * st] = x[base + a * st] - lse;
    } else {
      const float inv = 1.f / s;
      for (int64_t a = 0; a < r.A; ++a) y[base + a * st] = exp_fast(x[base + a * st] - m) * inv;
    }
  });
}

Tensor softmax_impl(const char* name, const Tensor& x, int axis, bool log_out) {
  HL_PROFILE(SoftmaxCE);
  const AxisRows r = axis_rows(name, x.shape(), axis);
  Tensor y = Tensor::empty(x.shape());
  softmax_forward(x.data(), y.data(), r, log_out);
  if (needs_graph({&x}))
    attach(y, name, {x}, [x, r, log_out](TensorImpl& self) {
      HL_PROFILE(SoftmaxCE);
      // Backward from the saved output y: softmax dx = y (g - sum g y);
      // log_softmax dx = g - exp(y) sum g.
      const float *g = self.grad->data(), *Y = self.data();
      float* gx = grad_buffer(x);
      const int64_t rows = r.outer * r.inner;
      parallel_for(rows, rows * r.A, [&](int64_t row) {
        const int64_t base = (row / r.inner) * r.A * r.inner + row % r.inner, st = r.inner;
        float dot = 0.f;
        for (int64_t a = 0; a < r.A; ++a)
          dot += log_out ? g[base + a * st] : g[base + a * st] * Y[base + a * st];
        for (int64_t a = 0; a < r.A; ++a) {
          const int64_t k = base + a * st;
          gx[k] += log_out ? g[k] - exp_fast(Y[k]) * dot : Y[k] * (g[k] - dot);
        }
      });
    });
  return y;
}

// The norms' dx row: f(j) stored into a buffer from grad_buffer_for_overwrite when it is fresh,
// added to it otherwise.
template <class F>
inline void store_or_add_row(float* out, int64_t D, bool fresh, F&& f) {
  if (fresh) {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) out[j] = f(j);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) out[j] += f(j);
  }
}

}  // namespace

Tensor softmax(const Tensor& x, int axis) { return softmax_impl("softmax", x, axis, false); }
Tensor log_softmax(const Tensor& x, int axis) { return softmax_impl("log_softmax", x, axis, true); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  HL_PROFILE(Elementwise);
  const BroadcastPlan plan = plan_broadcast("masked_fill", x.shape(), mask.shape());
  if (plan.out != x.shape())
    fail("masked_fill: mask ", mask.shape().str(), " does not broadcast to input ", x.shape().str());
  Tensor y = Tensor::empty(x.shape());
  const float *X = x.data(), *M = mask.data();
  float* Y = y.data();
  for_each_broadcast(plan, [&](int64_t i, int64_t, int64_t im) { Y[i] = M[im] != 0.f ? value : X[i]; });
  if (needs_graph({&x}))
    attach(y, "masked_fill", {x}, [x, mask](TensorImpl& self) {
      HL_PROFILE(Elementwise);
      const BroadcastPlan plan = plan_broadcast("masked_fill", x.shape(), mask.shape());
      const float *g = self.grad->data(), *M = mask.data();
      float* gx = grad_buffer(x);
      for_each_broadcast(plan, [&](int64_t i, int64_t, int64_t im) {
        if (M[im] == 0.f) gx[i] += g[i];
      });
    });
  return y;
}

// loss = mean over counted rows r of (logsumexp(x_r) - x_r[t_r]).
Tensor cross_entropy(const Tensor& logits, const Ids& targets, int ignore_index) {
  HL_PROFILE(SoftmaxCE);
  HL_CHECK(logits.ndim() >= 1, "cross_entropy: logits need a class axis, got ", logits.shape().str());
  const int64_t C = logits.shape().back(), N = C ? logits.numel() / C : 0;
  if (targets.numel() != N)
    fail("cross_entropy: logits ", logits.shape().str(), " and targets ", targets.shape.str(),
         ": need one target per row of ", C, " classes (", N, " rows)");
  int64_t count = 0;
  for (int32_t t : targets.data) {
    if (t == ignore_index) continue;
    if (t < 0 || t >= C) fail("cross_entropy: target ", t, " out of range for ", C, " classes");
    ++count;
  }
  Tensor lse = Tensor::empty({N});  // saved: log-sum-exp per row
  Tensor ids = save_ids(targets);
  const float* X = logits.data();
  float* L = lse.data();
  const int32_t* T = targets.data.data();
  // Rows are short (13 classes for the copy task): each is done in 16-wide chunks with
  // fixed trip counts, which vectorise; a loop over C alone stays scalar below 16.
  parallel_for(N, N * C, [&](int64_t r) {
    const float* x = X + r * C;
    const float m = max_lanes(x, C);
    float s = 0.f;
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
      alignas(64) float e[16];
      const int64_t n = std::min<int64_t>(16, C - c0);
      for (int l = 0; l < 16; ++l) e[l] = exp_fast(l < n ? x[c0 + l] - m : kNegInf);
      s += sum_lanes(e, 16);
    }
    L[r] = m + std::log(s);
  });
  double total = 0.0;  // fixed-order sum: deterministic for any thread count
  for (int64_t r = 0; r < N; ++r)
    if (T[r] != ignore_index) total += static_cast<double>(L[r]) - X[r * C + T[r]];
  Tensor loss = Tensor::scalar(count ? static_cast<float>(total / count) : 0.f);
  if (needs_graph({&logits}))
    attach(loss, "cross_entropy", {logits},
           [logits, lse, ids, N, C, count, ignore_index](TensorImpl& self) {
      HL_PROFILE(SoftmaxCE);
             if (count == 0) return;
             const float g = self.grad->data()[0] / static_cast<float>(count);
             const float *X = logits.data(), *L = lse.data();
             const int32_t* T = saved_ids(ids);
             // A fresh buffer (the usual case: the logits feed only the loss) is written, not
             // zeroed and added to: at GPT-2's 50,257 classes that saves a pass over N x C floats.
             // 0 + e keeps the bits of the zeroed-buffer sum (a -0 product becomes +0 there too).
             bool fresh;
             float* gx = grad_buffer_for_overwrite(logits, fresh);
             parallel_for(N, N * C, [&](int64_t r) {  // dx = g (softmax(x) - onehot(target))
               float* d = gx + r * C;
               if (T[r] == ignore_index) {
                 if (fresh) std::fill(d, d + C, 0.f);
                 return;
               }
               const float* x = X + r * C;
               const float l = L[r];
               for (int64_t c0 = 0; c0 < C; c0 += 16) {  // 16-wide chunks, as in forward
                 alignas(64) float e[16];
                 const int64_t n = std::min<int64_t>(16, C - c0);
                 for (int k = 0; k < 16; ++k) e[k] = g * exp_fast(k < n ? x[c0 + k] - l : kNegInf);
                 if (fresh)
                   for (int64_t k = 0; k < n; ++k) d[c0 + k] = 0.f + e[k];
                 else
                   for (int64_t k = 0; k < n; ++k) d[c0 + k] += e[k];
               }
               d[T[r]] -= g;
             });
           });
  return loss;
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  HL_PROFILE(LayerNorm);
  HL_CHECK(x.ndim() >= 1, "layer_norm: input needs a feature axis, got ", x.shape().str());
  const int64_t D = x.shape().back(), N = D ? x.numel() / D : 0;
  if (w.defined() && (w.ndim() != 1 || w.size(0) != D))
    fail("layer_norm: weight ", w.shape().str(), " does not match input ", x.shape().str());
  if (b.defined() && (b.ndim() != 1 || b.size(0) != D))
    fail("layer_norm: bias ", b.shape().str(), " does not match input ", x.shape().str());
  Tensor y = Tensor::empty(x.shape());
  Tensor stats = Tensor::empty({N, 2});  // saved: (mean, rstd) per row
  // a missing weight or bias reads ones or zeros: the row loops then have no branch
  const Tensor ones = w.defined() ? Tensor() : Tensor::ones({D}), zeros = b.defined() ? Tensor() : Tensor::zeros({D});
  const float* X = x.data();
  const float* W = w.defined() ? w.data() : ones.data();
  const float* B = b.defined() ? b.data() : zeros.data();
  float *Y = y.data(), *S = stats.data();
  parallel_for(N, N * D, [&](int64_t r) {
    const float *xr = X + r * D, *Wr = W, *Br = B;  // locals: see layer_norm's backward
    const float mu = sum_lanes(xr, D) / static_cast<float>(D);
    const float var = sum_sq_dev_lanes(xr, D, mu) / static_cast<float>(D);  // biased, as PyTorch
    const float rstd = 1.f / std::sqrt(var + eps);
    S[2 * r] = mu;
    S[2 * r + 1] = rstd;
    float* yr = Y + r * D;
    for (int64_t j = 0; j < D; ++j) {
      const float xhat = (xr[j] - mu) * rstd;
      yr[j] = xhat * Wr[j] + Br[j];
    }
  });
  if (needs_graph({&x, &w, &b}))
    attach(y, "layer_norm", {x, w, b}, [x, w, b, stats, N, D](TensorImpl& self) {
      HL_PROFILE(LayerNorm);
      const float *g = self.grad->data(), *X = x.data(), *S = stats.data();
      // no weight: multiply by ones, so the row loops have no branch (a branch on W kept
      // GCC from vectorising them: 80% of layer norm's backward was one scalar loop)
      const Tensor ones = w.defined() ? Tensor() : Tensor::ones({D});
      const float* Wv = w.defined() ? w.data() : ones.data();
      bool fresh;  // a fresh dx buffer is written, not accumulated
      float* gx = grad_buffer_for_overwrite(x, fresh);
      float* gw = grad_buffer(w);
      float* gb = grad_buffer(b);
      // Each thread: dx for its rows, and partial dw, db over them (thread 0 straight into
      // dw, db; the others into scratch, added after a barrier in thread order).
      const int nt = threads_for(N * D);
      Tensor scratch = nt > 1 && (gw || gb) ? Tensor::empty({nt - 1, 2 * D}) : Tensor();
      run_on_threads(nt, [&](int t, int n) {
        const auto [lo, hi] = row_block(N, t, n);
        const float* const Wr = Wv;  // a local copy: GCC does not vectorise loads through a capture
        float* pw = gw;
        float* pb = gb;
        if (t > 0 && scratch.defined()) {
          pw = scratch.data() + (t - 1) * 2 * D;
          pb = pw + D;
          std::fill(pw, pw + 2 * D, 0.f);
        }
        for (int64_t r = lo; r < hi; ++r) {
          const float mu = S[2 * r], rstd = S[2 * r + 1];
          const float *xr = X + r * D, *gr = g + r * D;
          if (gx) {  // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w
            float m1 = 0.f, m2 = 0.f;
#pragma omp simd reduction(+ : m1, m2)
            for (int64_t j = 0; j < D; ++j) {
              const float dxhat = gr[j] * Wr[j];
              m1 += dxhat;
              m2 += dxhat * (xr[j] - mu) * rstd;
            }
            m1 /= static_cast<float>(D);
            m2 /= static_cast<float>(D);
            store_or_add_row(gx + r * D, D, fresh, [&](int64_t j) {
              const float dxhat = gr[j] * Wr[j];
              return rstd * (dxhat - m1 - (xr[j] - mu) * rstd * m2);
            });
          }
          if (pw) {
#pragma omp simd
            for (int64_t j = 0; j < D; ++j) pw[j] += gr[j] * (xr[j] - mu) * rstd;
          }
          if (pb) {
#pragma omp simd
            for (int64_t j = 0; j < D; ++j) pb[j] += gr[j];
          }
        }
        if (n == 1 || !scratch.defined()) return;
#pragma omp barrier
        if (t != 0) return;
        for (int p = 0; p < n - 1; ++p) {
          const float* part = scratch.data() + p * 2 * D;
          for (int64_t j = 0; j < D; ++j) {
            if (gw) gw[j] += part[j];
            if (gb) gb[j] += part[D + j];
          }
        }
      });
    });
  return y;
}

// y = x rstd w' with rstd = 1 / sqrt(mean(x^2) + eps) and w' = w or 1 + w. Laid out as
// layer_norm (one pass forward, dx and dw in one pass back, dw summed per thread in a fixed
// order), without the centring.
Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool one_plus) {
  HL_PROFILE(LayerNorm);
  HL_CHECK(x.ndim() >= 1, "rms_norm: input needs a feature axis, got ", x.shape().str());
  const int64_t D = x.shape().back(), N = D ? x.numel() / D : 0;
  if (!w.defined() || w.ndim() != 1 || w.size(0) != D)
    fail("rms_norm: weight ", w.defined() ? w.shape().str() : std::string("(none)"), " does not match input ", x.shape().str());
  Tensor y = Tensor::empty(x.shape());
  Tensor rstds = Tensor::empty({N});  // saved: 1 / rms per row
  const float add_w = one_plus ? 1.f : 0.f;
  const float *X = x.data(), *W = w.data();
  float *Y = y.data(), *R = rstds.data();
  parallel_for(N, N * D, [&](int64_t r) {
    const float *xr = X + r * D, *Wr = W;
    const float rstd = 1.f / std::sqrt(sum_sq_dev_lanes(xr, D, 0.f) / static_cast<float>(D) + eps);
    R[r] = rstd;
    float* yr = Y + r * D;
    for (int64_t j = 0; j < D; ++j) yr[j] = xr[j] * rstd * (Wr[j] + add_w);
  });
  if (needs_graph({&x, &w}))
    attach(y, "rms_norm", {x, w}, [x, w, rstds, N, D, add_w](TensorImpl& self) {
      HL_PROFILE(LayerNorm);
      const float *g = self.grad->data(), *X = x.data(), *R = rstds.data(), *Wv = w.data();
      bool fresh;
      float* gx = grad_buffer_for_overwrite(x, fresh);
      float* gw = grad_buffer(w);
      const int nt = threads_for(N * D);
      Tensor scratch = nt > 1 && gw ? Tensor::empty({nt - 1, D}) : Tensor();
      run_on_threads(nt, [&](int t, int n) {
        const auto [lo, hi] = row_block(N, t, n);
        const float* const Wr = Wv;
        float* pw = gw;
        if (t > 0 && scratch.defined()) {
          pw = scratch.data() + (t - 1) * D;
          std::fill(pw, pw + D, 0.f);
        }
        for (int64_t r = lo; r < hi; ++r) {
          const float rstd = R[r];
          const float *xr = X + r * D, *gr = g + r * D;
          if (gx) {  // dx = rstd (dxhat - xhat mean(dxhat xhat)), dxhat = g w', xhat = x rstd
            float m = 0.f;
#pragma omp simd reduction(+ : m)
            for (int64_t j = 0; j < D; ++j) m += gr[j] * (Wr[j] + add_w) * xr[j] * rstd;
            m /= static_cast<float>(D);
            store_or_add_row(gx + r * D, D, fresh, [&](int64_t j) { return rstd * (gr[j] * (Wr[j] + add_w) - xr[j] * rstd * m); });
          }
          if (pw) {
#pragma omp simd
            for (int64_t j = 0; j < D; ++j) pw[j] += gr[j] * xr[j] * rstd;
          }
        }
        if (n == 1 || !scratch.defined()) return;
#pragma omp barrier
        if (t != 0) return;
        for (int p = 0; p < n - 1; ++p) {
          const float* part = scratch.data() + p * D;
          for (int64_t j = 0; j < D; ++j) gw[j] += part[j];
        }
      });
    });
  return y;
}

Tensor embedding(const Tensor& w, const Ids& ids) {
  HL_PROFILE(Embedding);
  HL_CHECK(w.ndim() == 2, "embedding: weight must be (vocab, dim), got ", w.shape().str());
  const int64_t V = w.size(0), D = w.size(1), n = ids.numel();
  for (int32_t id : ids.data)
    if (id < 0 || id >= V) fail("embedding: index ", id, " out of range for vocabulary of ", V);
  Shape so = ids.shape;
  so.push_back(D);
  Tensor y = Tensor::empty(so);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(y.data() + i * D, w.data() + int64_t(ids.data[i]) * D, sizeof(float) * D);
  if (needs_graph({&w}))
    attach(y, "embedding", {w}, [w, saved = save_ids(ids), n, D](TensorImpl& self) {
      HL_PROFILE(Embedding);
      const float* g = self.grad->data();
      const int32_t* I = saved_ids(saved);
      float* gw = grad_buffer(w);
      for (int64_t i = 0; i < n; ++i)  // sequential: repeated ids accumulate in a fixed order
        for (int64_t j = 0; j < D; ++j) gw[int64_t(I[i]) * D + j] += g[i * D + j];
    });
  return y;
}

// Rows of an activation are looked up as embedding rows are (one gather, one scatter-add
// backward); only the checks and their messages are gather_rows' own.
Tensor gather_rows(const Tensor& x, const Ids& rows) {
  HL_CHECK(x.ndim() >= 1, "gather_rows: x must have at least one axis");
  const int64_t D = x.size(x.ndim() - 1), R = D ? x.numel() / D : 0;
  if (rows.shape.ndim != 1) fail("gather_rows: rows must be one list, got ", rows.shape.str());
  for (int32_t r : rows.data)
    if (r < 0 || r >= R) fail("gather_rows: row ", r, " outside 0..", R - 1);
  return embedding(reshape(x, {R, D}), rows);  // (n, D)
}

Tensor dropout(const Tensor& x, float p, Rng& rng, bool training) {
  HL_PROFILE(Elementwise);
  HL_CHECK(p >= 0.f && p < 1.f, "dropout: probability must be in [0, 1), got ", p);
  if (!training || p == 0.f) return x;
  Tensor mask = Tensor::empty(x.shape());  // saved: 0 or 1/(1-p)
  const float keep_scale = 1.f / (1.f - p);
  float* M = mask.data();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) M[i] = rng.uniform() < p ? 0.f : keep_scale;
  Tensor y = Tensor::empty(x.shape());
  for (int64_t i = 0, n = x.numel(); i < n; ++i) y.data()[i] = x.data()[i] * M[i];
  if (needs_graph({&x}))
    attach(y, "dropout", {x}, [x, mask](TensorImpl& self) {
      HL_PROFILE(Elementwise);
      const float *g = self.grad->data(), *M = mask.data();
      float* gx = grad_buffer(x);
      for (int64_t i = 0, n = self.shape.numel(); i < n; ++i) gx[i] += g[i] * M[i];
    });
  return y;
}

}  // namespace hl
