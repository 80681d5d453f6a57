// Matrix products through cblas_sgemm. Transposed operands are passed as BLAS flags.
// Backward writes straight into gradient buffers with beta = 1 (accumulate, no temporaries).
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "autograd.h"
#include "ops.h"
#include "parallel.h"
#include "profile.h"

namespace hl {

namespace {
// One single-threaded sgemm (OpenBLAS's OpenMP build runs single-threaded inside a parallel region).
void sgemm_call(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}
}  // namespace

// Threads split C into blocks of rows (or of columns when C is wide), each computed by one
// single-threaded sgemm: for the skinny shapes of small transformers this is up to 2x faster
// than OpenBLAS's own threading (measured: bench/README.md), and each element of C is still
// computed by one call with a fixed K order, so results do not depend on timing.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  if (M == 0 || N == 0) return;
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Tiny products: one call. (OpenBLAS's own threading is within 3% on the largest shapes
  // here, but it mallocs a job array per call; the split allocates nothing.)
  if (nt == 1 || static_cast<double>(M) * N * K < 32768.0 * 16) {
    sgemm_call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool by_rows = M >= N;
  const int64_t total = by_rows ? M : N;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    // block boundaries on multiples of 16 rows/columns (the kernels' register tiles)
    const int64_t lo = std::min(total, (total * t / n + 15) / 16 * 16);
    const int64_t hi = t + 1 == n ? total : std::min(total, (total * (t + 1) / n + 15) / 16 * 16);
    if (hi > lo) {
      if (by_rows)
        sgemm_call(trans_a, trans_b, hi - lo, N, K, alpha, trans_a ? A + lo : A + lo * lda, lda, B, ldb, beta,
                   C + lo * ldc, ldc);
      else
        sgemm_call(trans_a, trans_b, M, hi - lo, K, alpha, A, lda, trans_b ? B + lo * ldb : B + lo, ldb, beta,
                   C + lo, ldc);
    }
  }
}

namespace {

// How a (possibly batched) product maps onto sgemm calls.
struct MatmulPlan {
  int64_t batch = 1, M = 0, K = 0, N = 0;
  int64_t a_step = 0, b_step = 0;  // floats between consecutive batch matrices (0 = shared)
  Shape out;
};

MatmulPlan plan_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const Shape &sa = a.shape(), &sb = b.shape();
  auto where = [&] {
    return std::string(sa.str()) + (ta ? "^T" : "") + " x " + sb.str() + (tb ? "^T" : "");
  };
  if (sa.ndim < 2 || sb.ndim < 2) fail("matmul: ", where(), ": both operands need at least 2 dimensions");
  MatmulPlan p;
  const int64_t ar = sa[sa.ndim - 2], ac = sa.back(), br = sb[sb.ndim - 2], bc = sb.back();
  p.M = ta ? ac : ar;
  p.K = ta ? ar : ac;
  const int64_t kb = tb ? bc : br;
  p.N = tb ? br : bc;
  if (p.K != kb) fail("matmul: ", where(), ": inner dimensions differ");
  if (sb.ndim == 2 && !ta) {  // fold a's leading dims into M: one sgemm
    p.M = sa.numel() / ac;
    p.out = sa;
    p.out[p.out.ndim - 1] = p.N;
    return p;
  }
  const Shape& batched = sa.ndim >= sb.ndim ? sa : sb;
  if (sa.ndim > 2 && sb.ndim > 2) {
    bool ok = sa.ndim == sb.ndim;
    for (int d = 0; ok && d < sa.ndim - 2; ++d) ok = sa[d] == sb[d];
    if (!ok) fail("matmul: ", where(), ": batch dimensions differ");
  }
  p.batch = 1;
  for (int d = 0; d < batched.ndim - 2; ++d) p.batch *= batched[d];
  p.a_step = sa.ndim > 2 ? ar * ac : 0;
  p.b_step = sb.ndim > 2 ? br * bc : 0;
  p.out = batched;
  p.out[p.out.ndim - 2] = p.M;
  p.out[p.out.ndim - 1] = p.N;
  return p;
}

}  // namespace

// out (M,N) = op(a) (M,K) x op(b) (K,N), batched over leading dims.
Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  HL_PROFILE(Matmul);
  const MatmulPlan p = plan_matmul(a, b, ta, tb);
  Tensor out = Tensor::empty(p.out);
  const int64_t lda = a.shape().back(), ldb = b.shape().back();
  for (int64_t i = 0; i < p.batch; ++i)
    gemm(ta, tb, p.M, p.N, p.K, 1.f, a.data() + i * p.a_step, lda, b.data() + i * p.b_step, ldb,
         0.f, out.data() + i * p.M * p.N, p.N);
  if (needs_graph({&a, &b}))
    attach(out, "matmul", {a, b}, [a, b, ta, tb](TensorImpl& self) {
      HL_PROFILE(Matmul);
      const MatmulPlan p = plan_matmul(a, b, ta, tb);
      const int64_t lda = a.shape().back(), ldb = b.shape().back();
      bool fresh_a, fresh_b;  // fresh buffers are written with beta = 0 (no zero fill)
      float* ga = grad_buffer_for_overwrite(a, fresh_a);
      float* gb = grad_buffer_for_overwrite(b, fresh_b);
      for (int64_t i = 0; i < p.batch; ++i) {
        const float* g = self.grad->data() + i * p.M * p.N;  // dC (M,N)
        const float* A = a.data() + i * p.a_step;
        const float* B = b.data() + i * p.b_step;
        // a shared operand (step 0) accumulates over the batch: only its first block overwrites
        const float beta_a = fresh_a && (p.a_step != 0 || i == 0) ? 0.f : 1.f;
        const float beta_b = fresh_b && (p.b_step != 0 || i == 0) ? 0.f : 1.f;
        if (ga) {
          float* dA = ga + i * p.a_step;
          if (!ta)  // dA (M,K) += dC op(B)^T
            gemm(false, !tb, p.M, p.K, p.N, 1.f, g, p.N, B, ldb, beta_a, dA, lda);
          else      // dA (K,M) += op(B) dC^T
            gemm(tb, true, p.K, p.M, p.N, 1.f, B, ldb, g, p.N, beta_a, dA, lda);
        }
        if (gb) {
          float* dB = gb + i * p.b_step;
          if (!tb)  // dB (K,N) += op(A)^T dC
            gemm(!ta, false, p.K, p.N, p.M, 1.f, A, lda, g, p.N, beta_b, dB, ldb);
          else      // dB (N,K) += dC^T op(A)
            gemm(true, ta, p.N, p.K, p.M, 1.f, g, p.N, A, lda, beta_b, dB, ldb);
        }
      }
    });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor ws[1] = {w}, bs[1] = {b};
  return linear_stacked(x, ws, bs);
}

// y (R, N) = x (R, in) [W_0; W_1; ...]^T + [b_0, b_1, ...], N = sum of out_i. When the
// weights lie back to back in one storage (a parameter slab), the product is one sgemm
// (NoTrans, Trans) over all of them and so is each product of backward; otherwise one call
// per weight on its column block. Biases are preloaded into y (beta = 1).
Tensor linear_stacked(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> bs) {
  HL_PROFILE(Matmul);
  const int64_t n = static_cast<int64_t>(ws.size());
  if (n < 1 || n > kMaxStacked || bs.size() != ws.size())
    fail("linear: ", n, " weights and ", bs.size(), " biases (need 1..", kMaxStacked, " of each)");
  const Shape& sx = x.shape();
  const int64_t in = ws[0].ndim() == 2 ? ws[0].size(1) : -1;
  int64_t N = 0;
  bool any_bias = false;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor &w = ws[i], &b = bs[i];
    if (w.ndim() != 2 || sx.ndim < 1 || sx.back() != w.size(1))
      fail("linear: input ", sx.str(), " and weight ", w.shape().str(),
           ": input features must equal weight columns (weight is (out, in))");
    if (b.defined() && (b.ndim() != 1 || b.size(0) != w.size(0)))
      fail("linear: bias ", b.shape().str(), " does not match weight ", w.shape().str());
    N += w.size(0);
    any_bias = any_bias || b.defined();
  }
  const int64_t R = sx.numel() / std::max<int64_t>(in, 1);
  Shape so = sx;
  so[so.ndim - 1] = N;
  Tensor y = Tensor::empty(so);
  float* Y = y.data();
  if (any_bias) {
    parallel_for(R, R * N, [&](int64_t r) {
      float* row = Y + r * N;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t out = ws[i].size(0);
        if (bs[i].defined()) std::copy(bs[i].data(), bs[i].data() + out, row);
        else std::fill(row, row + out, 0.f);
        row += out;
      }
    });
  }
  const float beta = any_bias ? 1.f : 0.f;
  if (back_to_back(ws)) {
    gemm(false, true, R, N, in, 1.f, x.data(), in, ws[0].data(), in, beta, Y, N);
  } else {
    for (int64_t i = 0, col = 0; i < n; col += ws[i].size(0), ++i)
      gemm(false, true, R, ws[i].size(0), in, 1.f, x.data(), in, ws[i].data(), in, beta, Y + col, N);
  }
  bool record = needs_graph({&x});
  for (int64_t i = 0; i < n; ++i) record = record || needs_graph({&ws[i], &bs[i]});
  if (record) {
    // Closure captures: x and up to kMaxStacked weights and biases (unused slots undefined).
    Tensor w[kMaxStacked], b[kMaxStacked];
    for (int64_t i = 0; i < n; ++i) w[i] = ws[i], b[i] = bs[i];
    attach(y, "linear", {x, w[0], w[1], w[2], b[0], b[1], b[2]},
           [x, w0 = w[0], w1 = w[1], w2 = w[2], b0 = b[0], b1 = b[1], b2 = b[2], n, R, in, N](TensorImpl& self) {
             HL_PROFILE(Matmul);
             const Tensor w[kMaxStacked] = {w0, w1, w2}, b[kMaxStacked] = {b0, b1, b2};
             const std::span<const Tensor> ws(w, n);
             const float* g = self.grad->data();  // dY (R, N)
             const bool one_block = back_to_back(ws);
             bool fresh;  // fresh buffers are written with beta = 0 (no zero fill)
             if (float* gx = grad_buffer_for_overwrite(x, fresh)) {  // dX (R,in) += dY W
               if (one_block) {
                 gemm(false, false, R, in, N, 1.f, g, N, w0.data(), in, fresh ? 0.f : 1.f, gx, in);
               } else {
                 for (int64_t i = 0, col = 0; i < n; col += w[i].size(0), ++i)
                   gemm(false, false, R, in, w[i].size(0), 1.f, g + col, N, w[i].data(), in,
                        fresh && i == 0 ? 0.f : 1.f, gx, in);
               }
             }
             if (float* gw = one_block ? grad_slab_for_overwrite(ws, fresh) : nullptr) {
               gemm(true, false, N, in, R, 1.f, g, N, x.data(), in, fresh ? 0.f : 1.f, gw, in);  // dW += dY^T X
             } else {
               for (int64_t i = 0, col = 0; i < n; col += w[i].size(0), ++i)
                 if (float* gwi = grad_buffer_for_overwrite(w[i], fresh))
                   gemm(true, false, w[i].size(0), in, R, 1.f, g + col, N, x.data(), in, fresh ? 0.f : 1.f, gwi, in);
             }
             for (int64_t i = 0, col = 0; i < n; col += w[i].size(0), ++i) {
               float* gb = grad_buffer(b[i]);
               if (!gb) continue;
               // db (out) += column sums of dY's block; threads own columns and rows run in
               // order: a fixed summation order
               const int64_t out = w[i].size(0), chunk = 64;
               const float* gc = g + col;
               parallel_for((out + chunk - 1) / chunk, R * out, [&](int64_t c) {
                 const int64_t o0 = c * chunk, o1 = std::min(out, o0 + chunk);
                 for (int64_t r = 0; r < R; ++r)
                   for (int64_t o = o0; o < o1; ++o) gb[o] += gc[r * N + o];
               });
             }
           });
  }
  return y;
}

}  // namespace hl
