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

// y (R, out) = x (R, in) W^T (in, out) + b: one sgemm(NoTrans, Trans), bias preloaded.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  HL_PROFILE(Matmul);
  const Shape& sx = x.shape();
  if (w.ndim() != 2 || sx.ndim < 1 || sx.back() != w.size(1))
    fail("linear: input ", sx.str(), " and weight ", w.shape().str(),
         ": input features must equal weight columns (weight is (out, in))");
  const int64_t in = w.size(1), outf = w.size(0), R = sx.numel() / std::max<int64_t>(in, 1);
  if (b.defined() && (b.ndim() != 1 || b.size(0) != outf))
    fail("linear: bias ", b.shape().str(), " does not match weight ", w.shape().str());
  Shape so = sx;
  so[so.ndim - 1] = outf;
  Tensor y = Tensor::empty(so);
  float* Y = y.data();
  if (b.defined()) {
    const float* B = b.data();
    parallel_for(R, R * outf, [&](int64_t r) {
      for (int64_t o = 0; o < outf; ++o) Y[r * outf + o] = B[o];
    });
  }
  gemm(false, true, R, outf, in, 1.f, x.data(), in, w.data(), in, b.defined() ? 1.f : 0.f, Y, outf);
  if (needs_graph({&x, &w, &b}))
    attach(y, "linear", {x, w, b}, [x, w, b, R, in, outf](TensorImpl& self) {
      HL_PROFILE(Matmul);
      const float* g = self.grad->data();  // (R, out)
      bool fresh;                           // fresh buffers: beta = 0, no zero fill
      if (float* gx = grad_buffer_for_overwrite(x, fresh))  // dX (R,in) += dY W
        gemm(false, false, R, in, outf, 1.f, g, outf, w.data(), in, fresh ? 0.f : 1.f, gx, in);
      if (float* gw = grad_buffer_for_overwrite(w, fresh))  // dW (out,in) += dY^T X
        gemm(true, false, outf, in, R, 1.f, g, outf, x.data(), in, fresh ? 0.f : 1.f, gw, in);
      if (float* gb = grad_buffer(b)) {  // db (out) += column sums of dY; threads own columns,
        const int64_t chunk = 64;         // rows run in order: a fixed summation order
        parallel_for((outf + chunk - 1) / chunk, R * outf, [&](int64_t c) {
          const int64_t o0 = c * chunk, o1 = std::min(outf, o0 + chunk);
          for (int64_t r = 0; r < R; ++r)
            for (int64_t o = o0; o < o1; ++o) gb[o] += g[r * outf + o];
        });
      }
    });
  return y;
}

}  // namespace hl
