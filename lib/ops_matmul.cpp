// Matrix products through cblas_sgemm or, for small shapes, our own kernel. Transposed operands
// are passed as BLAS flags.
// Backward writes straight into gradient buffers with beta = 1 (accumulate, no temporaries).
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "autograd.h"
#include "bf16.h"
#include "ops.h"
#include "parallel.h"
#include "profile.h"

namespace hl {

namespace {
// C[:, :n] = alpha A B + beta C for a product with at most 8 columns, nothing transposed: A (M, K),
// B (K, n), all row-major. Eight rows at a time (one load of B's row for eight FMAs), each element
// summed over k in order with FMA.
void gemm_nn_narrow(int64_t M, int n, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                    int64_t ldb, float beta, float* C, int64_t ldc) {
#ifdef __AVX2__
  alignas(32) int32_t bits[8];
  for (int j = 0; j < 8; ++j) bits[j] = j < n ? -1 : 0;
  const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(bits));
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  auto store = [&](float* c, __m256 acc) {
    // beta = 0 never reads C (BLAS: it may hold anything, NaN included)
    const __m256 r = beta == 0.f ? _mm256_mul_ps(va, acc) : _mm256_fmadd_ps(vb, _mm256_maskload_ps(c, mask), _mm256_mul_ps(va, acc));
    _mm256_maskstore_ps(c, mask, r);
  };
  int64_t i = 0;
  for (; i + 8 <= M; i += 8) {
    __m256 c[8];
    for (int r = 0; r < 8; ++r) c[r] = _mm256_setzero_ps();
    const float* a = A + i * lda;
    for (int64_t k = 0; k < K; ++k) {
      const __m256 b = _mm256_maskload_ps(B + k * ldb, mask);
      for (int r = 0; r < 8; ++r) c[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * lda + k), b, c[r]);
    }
    for (int r = 0; r < 8; ++r) store(C + (i + r) * ldc, c[r]);
  }
  for (; i < M; ++i) {
    const float* a = A + i * lda;
    __m256 c = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) c = _mm256_fmadd_ps(_mm256_set1_ps(a[k]), _mm256_maskload_ps(B + k * ldb, mask), c);
    store(C + i * ldc, c);
  }
#else
  for (int64_t i = 0; i < M; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += A[i * lda + k] * B[k * ldb + j];
      float& c = C[i * ldc + j];
      c = beta == 0.f ? alpha * acc : alpha * acc + beta * c;
    }
#endif
}

#ifdef __AVX512F__
// Products of the small models' shapes: C (M, N) = alpha op(A) B + beta C with B (K, N) row-major
// and A (M, K) or, transposed, (K, M). Six rows of C by 32 columns live in twelve registers while k
// runs; each step is six broadcasts of A and two loads of B's row: no packing of A, which is most
// of OpenBLAS's time when K is 32 (one thread, 1056 x 96 x 32: 46 vs 55 us; 1056 x 32 x 96: 41 vs 57).
// Each element is summed over k in order with FMA.
inline __mmask16 lanes_below(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }

template <int R, bool TA, bool TWO>  // TWO: 32 columns (two registers a row), else up to 16
void small_gemm_block(int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      float* C, int64_t ldc, int64_t ncols) {
  const __mmask16 m0 = lanes_below(ncols), m1 = lanes_below(ncols - 16);
  __m512 c0[R], c1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, B + k * ldb);
    const __m512 b1 = TWO ? _mm512_maskz_loadu_ps(m1, B + k * ldb + 16) : b0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(TA ? A[k * lda + r] : A[r * lda + k]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      if (TWO) c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* c = C + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, c0[r]);
    if (beta != 0.f) x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), x0);  // beta = 0 never reads C
    _mm512_mask_storeu_ps(c, m0, x0);
    if (TWO) {
      __m512 x1 = _mm512_mul_ps(va, c1[r]);
      if (beta != 0.f) x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), x1);
      _mm512_mask_storeu_ps(c + 16, m1, x1);
    }
  }
}

template <bool TA, bool TWO>
void small_gemm_cols(int64_t M, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                     float beta, float* C, int64_t ldc, int64_t nc) {
  auto at = [&](int64_t i) { return TA ? A + i : A + i * lda; };
  int64_t i = 0;
  for (; i + 6 <= M; i += 6) small_gemm_block<6, TA, TWO>(K, alpha, at(i), lda, B, ldb, beta, C + i * ldc, ldc, nc);
  float* Ci = C + i * ldc;
  switch (M - i) {
    case 1: small_gemm_block<1, TA, TWO>(K, alpha, at(i), lda, B, ldb, beta, Ci, ldc, nc); break;
    case 2: small_gemm_block<2, TA, TWO>(K, alpha, at(i), lda, B, ldb, beta, Ci, ldc, nc); break;
    case 3: small_gemm_block<3, TA, TWO>(K, alpha, at(i), lda, B, ldb, beta, Ci, ldc, nc); break;
    case 4: small_gemm_block<4, TA, TWO>(K, alpha, at(i), lda, B, ldb, beta, Ci, ldc, nc); break;
    case 5: small_gemm_block<5, TA, TWO>(K, alpha, at(i), lda, B, ldb, beta, Ci, ldc, nc); break;
    default: break;
  }
}

template <bool TA>
void small_gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                float beta, float* C, int64_t ldc) {
  for (int64_t j0 = 0; j0 < N; j0 += 32) {
    const int64_t nc = std::min<int64_t>(32, N - j0);
    if (nc > 16) small_gemm_cols<TA, true>(M, K, alpha, A, lda, B + j0, ldb, beta, C + j0, ldc, nc);
    else small_gemm_cols<TA, false>(M, K, alpha, A, lda, B + j0, ldb, beta, C + j0, ldc, nc);
  }
}

// Where small_gemm beats OpenBLAS's kernels (one thread, measured on the study and S shapes):
// short K (<= 128) and at most 128 columns, or A transposed (long K, dW = dU^T X) with at most
// 32 columns and 128 rows. Larger products stay with OpenBLAS (S's 1056 x 64 x 256: 0.85x).
bool small_gemm_wins(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
  if (trans_a) return N <= 32 && M <= 128 && !trans_b;
  return K <= 128 && N <= 128 && (!trans_b || M >= 4 * K);  // B^T is copied first: worth it for many rows
}

// B^T (N, K) at stride ldb as B (K, N) in a per-thread buffer (it grows once; later steps
// allocate nothing). At most 128 x 128 floats.
const float* transposed_b(const float* B, int64_t ldb, int64_t N, int64_t K) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < K * N) buf.resize(static_cast<size_t>(K * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) buf[static_cast<size_t>(k * N + n)] = B[n * ldb + k];
  return buf.data();
}
#endif

// One single-threaded product (OpenBLAS's OpenMP build runs single-threaded inside a parallel
// region): small_gemm where it wins (the study models' linear layers and attention products),
// otherwise OpenBLAS.
// Debian 12's OpenBLAS 0.3.21 with its SkylakeX kernels calls malloc in every row-major NN product
// whose N leaves 1..8 columns past a multiple of 16 (K >= 32): attention's P V and dS K with a
// small d_head, once per (batch, head). Of the NN products small_gemm does not take (K or N
// above 128), leftovers of 3..8 columns go to gemm_nn_narrow instead,
// which is also faster there (33 x 33 x n, one thread: n = 4 193 vs 215 ns, n = 8 207 vs 407 ns).
// At 1..2 columns (d_head <= 2) OpenBLAS's kernel stays: it is 25% faster per call than any kernel
// of ours we measured (157 vs 181-210 ns), which outweighs its malloc.
void sgemm_call(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#ifdef __AVX512F__
  if (small_gemm_wins(trans_a, trans_b, M, N, K) && !(N <= 2 && !trans_a)) {
    const float* b = trans_b ? transposed_b(B, ldb, N, K) : B;
    const int64_t ld = trans_b ? N : ldb;
    if (trans_a) small_gemm<true>(M, N, K, alpha, A, lda, b, ld, beta, C, ldc);
    else small_gemm<false>(M, N, K, alpha, A, lda, b, ld, beta, C, ldc);
    return;
  }
#endif
  const int64_t narrow = !trans_a && !trans_b ? N % 16 : 0;
  if (narrow >= 3 && narrow <= 8) {
    const int64_t wide = N - narrow;
    gemm_nn_narrow(M, static_cast<int>(narrow), K, alpha, A, lda, B + wide, ldb, beta, C + wide, ldc);
    if (wide == 0) return;
    N = wide;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}
// Threads for an (M,N) x K product: tiny products run on one thread (one call), as do
// products inside a parallel region. (OpenBLAS's own threading is within 3% on the largest
// shapes here, but it mallocs a job array per call; our splits allocate nothing.) The limit is
// OpenBLAS's own (M N K <= 65536 x 4 runs single-threaded in it): a product we leave on one
// thread outside a parallel region must not be one that OpenBLAS would thread itself.
int product_threads(int64_t M, int64_t N, int64_t K) {
  return static_cast<double>(M) * N * K <= 65536.0 * 4 || omp_in_parallel() ? 1 : omp_get_max_threads();
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
  const int nt = product_threads(M, N, K);
  if (nt == 1) {
    sgemm_call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool by_rows = M >= N;
  const int64_t total = by_rows ? M : N;
#pragma omp parallel num_threads(nt)
  {
    const auto [lo, hi] = row_block(total, omp_get_thread_num(), omp_get_num_threads());
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

// ---- linear layers -------------------------------------------------------------------------
//
// y = act(x W^T + b) for one or several weights (linear, linear_stacked, linear_act). Rows of
// x are split into one block per thread and each thread does everything for its rows in one
// parallel region, while they are in cache:
//   forward:  bias fill, sgemm (NoTrans, Trans), activation;
//   backward: dU = dY * act'(U), dX rows = dU W, a partial dW = dU^T X over its rows and partial
//             column sums for db; then the partials are added in thread order (a fixed order,
//             so results depend on the thread count but not on timing).
// When the weight is large next to the rows (e.g. L: 1024 rows, 3072 x 768 weight) the partial
// dW would cost more than it saves; dW is then one gemm split over dW's rows.

namespace {

struct LinearArgs {
  const float* X;
  int64_t R, in, N;  // x (R, in), y (R, N)
  std::span<const Tensor> ws, bs;
  bool one_block;  // weights back to back: one sgemm for all
  bool bf16;       // products with bf16 operands (float32 accumulation) through oneDNN
  const uint16_t* Xh = nullptr;  // when bf16: x (R, in) and the weights side by side (N, in), rounded
  const uint16_t* Wh = nullptr;  // (the backward has only Wh, and only when x needs a gradient)
};

int linear_threads(const LinearArgs& a) { return product_threads(a.R, a.N, a.in); }

bool any_bias(const LinearArgs& a) {
  bool any = false;
  for (const Tensor& b : a.bs) any = any || b.defined();
  return any;
}

// Rows [lo, hi) of U = the biases side by side.
void fill_bias_rows(const LinearArgs& a, float* U, int64_t lo, int64_t hi) {
  float* first = U + lo * a.N;  // row lo = the biases side by side; later rows copy it
  for (size_t i = 0, col = 0; i < a.ws.size(); col += a.ws[i].size(0), ++i) {
    const int64_t out = a.ws[i].size(0);
    if (a.bs[i].defined()) std::copy(a.bs[i].data(), a.bs[i].data() + out, first + col);
    else std::fill(first + col, first + col + out, 0.f);
  }
  for (int64_t r = lo + 1; r < hi; ++r) {
    float* row = U + r * a.N;
#pragma omp simd
    for (int64_t o = 0; o < a.N; ++o) row[o] = first[o];
  }
}

// ---- bf16 products: the operands are rounded to bf16 into buffers of the tensor pool (two values
// to a float32 slot), so a step's copies come and go like its other buffers and its steady state
// allocates nothing of its own. The weights are rounded once per step, in the forward, and the
// backward keeps them for dX; x is rounded again in the backward for dW, because keeping its bf16
// copy would add to the step's peak memory (autograd keeps the float32 x until then anyway).
// One oneDNN product over all rows (oneDNN threads it), float32 results. The weights are rounded
// side by side, so stacked weights are always one block.
// Activations saved for the backward in bf16: the pre-activation U = x W^T + b of a bf16
// linear_act (GELU, ReLU, SiLU: GPT-2's fc1, llama's gate), whose backward reads it only for the
// activation's derivative, and dU = act'(U) dY is rounded to bf16 for dX and dW anyway; its bf16
// copy is written in the activation's pass and the float32 U is not kept. (Not the products'
// inputs x: above.)
Tensor bf16_buffer(int64_t n) { return Tensor::empty({(n + 1) / 2}); }
// Rows of U or dU an activation pass makes and rounds at a time: about 128 KiB, in L2.
int64_t rows_in_cache(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1)); }
uint16_t* bf16_data(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data()); }

struct Bf16Operands {
  Tensor x, w;  // x (R, in) and the weights (N, in) in bf16
};

// Rounds a's operands and points a at them.
Bf16Operands round_operands(LinearArgs& a) {
  Bf16Operands h{bf16_buffer(a.R * a.in), bf16_buffer(a.N * a.in)};
  uint16_t* w = bf16_data(h.w);
  for (size_t i = 0, col = 0; i < a.ws.size(); col += a.ws[i].size(0), ++i)
    convert_to_bf16(a.ws[i].data(), w + col * a.in, a.ws[i].size(0) * a.in);
  convert_to_bf16(a.X, bf16_data(h.x), a.R * a.in);
  a.Xh = bf16_data(h.x);
  a.Wh = w;
  return h;
}

// What the backward keeps of them: the weights, for dX = dU W, if x needs a gradient.
Tensor saved_weights(const Bf16Operands& h, const Tensor& x) { return needs_graph({&x}) ? h.w : Tensor(); }

// The biases go to oneDNN as its bias argument, added as it writes U: no pass filling U with them
// and no read of U before writing it. Stacked biases are copied side by side (N floats).
template <class Post>
void linear_forward_bf16(const LinearArgs& a, float* U, Post post) {
  Tensor side_by_side;
  const float* bias = nullptr;  // (N)
  if (a.bs.size() == 1 && a.bs[0].defined()) {
    bias = a.bs[0].data();
  } else if (any_bias(a)) {
    side_by_side = Tensor::empty({a.N});
    fill_bias_rows(a, side_by_side.data(), 0, 1);
    bias = side_by_side.data();
  }
  gemm_bf16(false, true, a.R, a.N, a.in, a.Xh, a.in, a.Wh, a.in, 0.f, U, a.N, bias);
  run_on_threads(linear_threads(a), [&](int t, int n) {
    const auto [lo, hi] = row_block(a.R, t, n);
    if (hi > lo) post(lo, hi);
  });
}

// U (R, N) = X W^T + b, then post(lo, hi) on each thread's rows.
template <class Post>
void linear_forward(const LinearArgs& a, float* U, Post post) {
  if (a.bf16) return linear_forward_bf16(a, U, post);
  const bool bias = any_bias(a);
  run_on_threads(linear_threads(a), [&](int t, int n) {
    const auto [lo, hi] = row_block(a.R, t, n);
    if (hi == lo) return;
    if (bias) fill_bias_rows(a, U, lo, hi);
    const float beta = bias ? 1.f : 0.f;
    const float* X = a.X + lo * a.in;
    if (a.one_block) {
      sgemm_call(false, true, hi - lo, a.N, a.in, 1.f, X, a.in, a.ws[0].data(), a.in, beta, U + lo * a.N, a.N);
    } else {
      for (size_t i = 0, col = 0; i < a.ws.size(); col += a.ws[i].size(0), ++i)
        sgemm_call(false, true, hi - lo, a.ws[i].size(0), a.in, 1.f, X, a.in, a.ws[i].data(), a.in, beta,
                   U + lo * a.N + col, a.N);
    }
    post(lo, hi);
  });
}

// Where dW goes: one block for all weights (slab) or one buffer per weight; beta 0 = overwrite.
struct WeightGrads {
  float* slab = nullptr;
  float slab_beta = 0.f;
  float* each[kMaxStacked] = {};
  float each_beta[kMaxStacked] = {};
  bool any() const { return slab || each[0] || each[1] || each[2]; }
};

WeightGrads weight_grads(std::span<const Tensor> ws, bool one_block) {
  WeightGrads g;
  bool fresh;
  if (one_block && (g.slab = grad_slab_for_overwrite(ws, fresh))) {
    g.slab_beta = fresh ? 0.f : 1.f;
    return g;
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    g.each[i] = grad_buffer_for_overwrite(ws[i], fresh);
    g.each_beta[i] = fresh ? 0.f : 1.f;
  }
  return g;
}

// The bf16 backward: dU rounded to bf16 as each thread makes its rows (a few at a time, in
// cache), which it also sums into its partial db; then dX = dU W and dW = dU^T X as two oneDNN
// products. db (float32) adds the partials in thread order: a fixed order for a thread count.
template <class Pre>
void linear_backward_bf16(const LinearArgs& a, const float* dU, Pre pre, float* gx, bool gx_fresh) {
  const WeightGrads gw = weight_grads(a.ws, a.one_block);
  float* gb[kMaxStacked] = {};
  bool any_gb = false;
  for (size_t i = 0; i < a.bs.size(); ++i) any_gb = (gb[i] = grad_buffer(a.bs[i])) || any_gb;
  const Tensor dUbuf = bf16_buffer(a.R * a.N);
  uint16_t* dUh = bf16_data(dUbuf);  // (R, N)
  const int nt = linear_threads(a);
  const Tensor sums = any_gb ? Tensor::zeros({nt, a.N}) : Tensor();  // (threads, N): column sums of each one's rows
  run_on_threads(nt, [&](int t, int n) {
    const auto [lo, hi] = row_block(a.R, t, n);
    float* part = any_gb ? sums.data() + t * a.N : nullptr;
    for (int64_t r = lo, step = rows_in_cache(a.N); r < hi; r += step) {
      const int64_t r1 = std::min(hi, r + step);
      pre(r, r1);
      convert_to_bf16(dU + r * a.N, dUh + r * a.N, (r1 - r) * a.N);
      for (int64_t q = r; part && q < r1; ++q) {
        const float* row = dU + q * a.N;
#pragma omp simd
        for (int64_t o = 0; o < a.N; ++o) part[o] += row[o];
      }
    }
  });
  for (int t = 0; any_gb && t < nt; ++t)
    for (size_t i = 0, col = 0; i < a.bs.size(); col += a.ws[i].size(0), ++i)
      if (gb[i])
        for (int64_t o = 0; o < a.ws[i].size(0); ++o) gb[i][o] += sums.data()[t * a.N + col + o];
  if (gx)  // dX (R, in) (+)= dU W
    gemm_bf16(false, false, a.R, a.in, a.N, dUh, a.N, a.Wh, a.in, gx_fresh ? 0.f : 1.f, gx, a.in);
  if (gw.any()) {  // dW (N, in) (+)= dU^T X, X rounded again (above)
    const Tensor xh = bf16_buffer(a.R * a.in);
    const uint16_t* Xh = bf16_data(xh);
    convert_to_bf16(a.X, bf16_data(xh), a.R * a.in);
    if (gw.slab) {
      gemm_bf16(true, false, a.N, a.in, a.R, dUh, a.N, Xh, a.in, gw.slab_beta, gw.slab, a.in);
    } else {
      for (size_t i = 0, col = 0; i < a.ws.size(); col += a.ws[i].size(0), ++i)
        if (gw.each[i])
          gemm_bf16(true, false, a.ws[i].size(0), a.in, a.R, dUh + col, a.N, Xh, a.in, gw.each_beta[i], gw.each[i], a.in);
    }
  }
}

// Backward of U = X W^T + b given dU: pre(lo, hi) first makes rows [lo, hi) of dU (for an
// activation; a no-op when dU is dY itself). gx may be null (x needs no gradient).
template <class Pre>
void linear_backward(const LinearArgs& a, const float* dU, Pre pre, float* gx, bool gx_fresh) {
  if (a.bf16) return linear_backward_bf16(a, dU, pre, gx, gx_fresh);
  const WeightGrads gw = weight_grads(a.ws, a.one_block);
  float* gb[kMaxStacked] = {};
  bool any_gb = false;
  for (size_t i = 0; i < a.bs.size(); ++i) any_gb = (gb[i] = grad_buffer(a.bs[i])) || any_gb;
  const int nt = linear_threads(a);
  // partial dW over row blocks only when the weight is small next to the rows
  const bool partial_dw = nt > 1 && gw.any() && a.R >= 2 * std::max(a.N, a.in);
  const int64_t wsize = a.N * a.in;
  // threads 1.. : a partial dW (N, in) (if partial_dw) and partial db (N) each
  const int64_t part_size = (partial_dw ? wsize : 0) + a.N, sums_at = partial_dw ? wsize : 0;
  Tensor scratch;
  if (nt > 1 && (partial_dw || any_gb)) scratch = Tensor::empty({nt - 1, part_size});

  run_on_threads(nt, [&](int t, int n) {
    const auto [lo, hi] = row_block(a.R, t, n);
    const int64_t rows = hi - lo;
    if (rows > 0) {
      pre(lo, hi);
      const float* dUb = dU + lo * a.N;
      if (gx) {  // dX rows (R,in) (+)= dU W
        if (a.one_block) {
          sgemm_call(false, false, rows, a.in, a.N, 1.f, dUb, a.N, a.ws[0].data(), a.in, gx_fresh ? 0.f : 1.f,
                     gx + lo * a.in, a.in);
        } else {
          for (size_t i = 0, col = 0; i < a.ws.size(); col += a.ws[i].size(0), ++i)
            sgemm_call(false, false, rows, a.in, a.ws[i].size(0), 1.f, dUb + col, a.N, a.ws[i].data(), a.in,
                       gx_fresh && i == 0 ? 0.f : 1.f, gx + lo * a.in, a.in);
        }
      }
    }
    float* part = t > 0 && scratch.defined() ? scratch.data() + (t - 1) * part_size : nullptr;
    const float* X = a.X + lo * a.in;
    if (partial_dw && rows > 0) {  // dW (N, in) over this block's rows: thread 0 into dW
      if (t > 0) {
        sgemm_call(true, false, a.N, a.in, rows, 1.f, dU + lo * a.N, a.N, X, a.in, 0.f, part, a.in);
      } else if (gw.slab) {  // (thread 0's rows start at 0)
        sgemm_call(true, false, a.N, a.in, rows, 1.f, dU, a.N, X, a.in, gw.slab_beta, gw.slab, a.in);
      } else {
        for (size_t i = 0, col = 0; i < a.ws.size(); col += a.ws[i].size(0), ++i)
          if (gw.each[i])
            sgemm_call(true, false, a.ws[i].size(0), a.in, rows, 1.f, dU + col, a.N, X, a.in, gw.each_beta[i],
                       gw.each[i], a.in);
      }
    } else if (partial_dw && t > 0) {
      std::fill(part, part + wsize, 0.f);
    }
    if (any_gb) {  // column sums of this block's dU rows: thread 0 into db, others to scratch
      float* sums = part ? part + sums_at : nullptr;
      if (sums) std::fill(sums, sums + a.N, 0.f);
      for (int64_t r = lo; r < hi; ++r) {
        const float* row = dU + r * a.N;
        if (sums) {
#pragma omp simd
          for (int64_t o = 0; o < a.N; ++o) sums[o] += row[o];
        } else {
          for (size_t i = 0, col = 0; i < a.bs.size(); col += a.ws[i].size(0), ++i)
            if (gb[i]) {
              const int64_t out = a.ws[i].size(0);
#pragma omp simd
              for (int64_t o = 0; o < out; ++o) gb[i][o] += row[col + o];
            }
        }
      }
    }
    if (n == 1) return;
#pragma omp barrier
    // add the partials of threads 1.. in order; rows of dW split over the threads
    const int64_t parts = n - 1;
    if (partial_dw) {
      const auto [w0, w1] = row_block(a.N, t, n);
      for (int64_t row = w0; row < w1; ++row) {
        float* dst = nullptr;
        if (gw.slab) {
          dst = gw.slab + row * a.in;
        } else {
          int64_t i = 0, col = 0;
          while (row >= col + a.ws[i].size(0)) col += a.ws[i++].size(0);
          if (gw.each[i]) dst = gw.each[i] + (row - col) * a.in;
        }
        if (!dst) continue;
        for (int64_t p = 0; p < parts; ++p) {
          const float* src = scratch.data() + p * part_size + row * a.in;
#pragma omp simd
          for (int64_t k = 0; k < a.in; ++k) dst[k] += src[k];
        }
      }
    }
    if (any_gb && t == 0)
      for (int64_t p = 0; p < parts; ++p) {
        const float* src = scratch.data() + p * part_size + sums_at;
        for (size_t i = 0, col = 0; i < a.bs.size(); col += a.ws[i].size(0), ++i)
          if (gb[i])
            for (int64_t o = 0; o < a.ws[i].size(0); ++o) gb[i][o] += src[col + o];
      }
  });
  if (gw.any() && !partial_dw) {  // dW (N, in) (+)= dU^T X as one product split over dW's rows
    if (gw.slab) {
      gemm(true, false, a.N, a.in, a.R, 1.f, dU, a.N, a.X, a.in, gw.slab_beta, gw.slab, a.in);
    } else {
      for (size_t i = 0, col = 0; i < a.ws.size(); col += a.ws[i].size(0), ++i)
        if (gw.each[i])
          gemm(true, false, a.ws[i].size(0), a.in, a.R, 1.f, dU + col, a.N, a.X, a.in, gw.each_beta[i], gw.each[i], a.in);
    }
  }
}

// Checks shapes; returns (R, in, N).
LinearArgs plan_linear(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> bs) {
  const int64_t n = static_cast<int64_t>(ws.size());
  if (n < 1 || n > kMaxStacked || bs.size() != ws.size())
    fail("linear: ", n, " weights and ", bs.size(), " biases (need 1..", kMaxStacked, " of each)");
  const Shape& sx = x.shape();
  LinearArgs a;
  a.in = ws[0].ndim() == 2 ? ws[0].size(1) : -1;
  a.N = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor &w = ws[i], &b = bs[i];
    if (w.ndim() != 2 || sx.ndim < 1 || sx.back() != w.size(1))
      fail("linear: input ", sx.str(), " and weight ", w.shape().str(),
           ": input features must equal weight columns (weight is (out, in))");
    if (b.defined() && (b.ndim() != 1 || b.size(0) != w.size(0)))
      fail("linear: bias ", b.shape().str(), " does not match weight ", w.shape().str());
    a.N += w.size(0);
  }
  a.X = x.data();
  a.R = sx.numel() / std::max<int64_t>(a.in, 1);
  a.ws = ws;
  a.bs = bs;
  a.one_block = back_to_back(ws);
  a.bf16 = bf16_product(a.R, a.N, a.in);  // the precision and the measured rule (lib/bf16.h)
  return a;
}

Shape with_last(Shape s, int64_t last) {
  s[s.ndim - 1] = last;
  return s;
}

bool linear_needs_graph(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> bs) {
  bool record = needs_graph({&x});
  for (size_t i = 0; i < ws.size(); ++i) record = record || needs_graph({&ws[i], &bs[i]});
  return record;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor ws[1] = {w}, bs[1] = {b};
  return linear_stacked(x, ws, bs);
}

Tensor linear_stacked(const Tensor& x, std::span<const Tensor> ws, std::span<const Tensor> bs) {
  HL_PROFILE(Matmul);
  LinearArgs a = plan_linear(x, ws, bs);
  const Bf16Operands h = a.bf16 ? round_operands(a) : Bf16Operands{};
  Tensor y = Tensor::empty(with_last(x.shape(), a.N));
  linear_forward(a, y.data(), [](int64_t, int64_t) {});
  if (linear_needs_graph(x, ws, bs)) {
    // The closure keeps x and up to kMaxStacked weights and biases (unused slots undefined).
    Tensor w[kMaxStacked], b[kMaxStacked];
    for (size_t i = 0; i < ws.size(); ++i) w[i] = ws[i], b[i] = bs[i];
    const int n = static_cast<int>(ws.size());
    attach(y, "linear", {x, w[0], w[1], w[2], b[0], b[1], b[2]},
           [x, w0 = w[0], w1 = w[1], w2 = w[2], b0 = b[0], b1 = b[1], b2 = b[2], n, bf16 = a.bf16,
            wh = saved_weights(h, x)](TensorImpl& self) {
             HL_PROFILE(Matmul);
             const Tensor w[kMaxStacked] = {w0, w1, w2}, b[kMaxStacked] = {b0, b1, b2};
             LinearArgs a = plan_linear(x, std::span<const Tensor>(w, n), std::span<const Tensor>(b, n));
             a.bf16 = bf16;  // the forward's precision and rounded weights
             if (wh.defined()) a.Wh = bf16_data(wh);
             bool fresh;  // a fresh dX buffer is written with beta = 0 (no zero fill)
             float* gx = grad_buffer_for_overwrite(x, fresh);
             linear_backward(a, self.grad->data(), [](int64_t, int64_t) {}, gx, fresh);
           });
  }
  return y;
}

Tensor linear_act(const Tensor& x, const Tensor& w, const Tensor& b, Activation activation) {
  HL_PROFILE(Matmul);
  const Tensor ws[1] = {w}, bs[1] = {b};
  LinearArgs a = plan_linear(x, ws, bs);
  const Bf16Operands h = a.bf16 ? round_operands(a) : Bf16Operands{};
  const bool record = linear_needs_graph(x, ws, bs);
  Tensor y = Tensor::empty(with_last(x.shape(), a.N));
  // The pre-activation U = x W^T + b, kept for the backward: float32, or under bf16 only its bf16
  // copy uh, written in the activation's pass (below); U itself is then a temporary.
  const bool u_in_bf16 = record && a.bf16;
  Tensor u = record ? Tensor::empty(y.shape()) : y;
  const Tensor uh = u_in_bf16 ? bf16_buffer(y.numel()) : Tensor();
  float *U = u.data(), *Y = y.data();
  const int64_t N = a.N;
  auto apply = [&](auto f) {
    linear_forward(a, U, [&](int64_t lo, int64_t hi) {
      if (!u_in_bf16) {
        for (int64_t e = lo * N; e < hi * N; ++e) Y[e] = f(U[e]);
        return;
      }
      for (int64_t r = lo, step = rows_in_cache(N); r < hi; r += step) {  // U's rows rounded while in cache
        const int64_t e0 = r * N, e1 = std::min(hi, r + step) * N;
        for (int64_t e = e0; e < e1; ++e) Y[e] = f(U[e]);
        convert_to_bf16(U + e0, bf16_data(uh) + e0, e1 - e0);
      }
    });
  };
  switch (activation) {
    case Activation::GeluTanh: apply([](float v) { return act::gelu_tanh(v); }); break;
    case Activation::GeluErf: apply([](float v) { return act::gelu_erf(v); }); break;
    case Activation::Relu: apply([](float v) { return act::relu(v); }); break;
    case Activation::Relu2: apply([](float v) { return act::relu2(v); }); break;
    case Activation::Silu: apply([](float v) { return act::silu(v); }); break;
  }
  if (u_in_bf16) u = Tensor();  // the backward keeps uh alone
  if (record)
    attach(y, "linear_act", {x, w, b}, [x, w, b, u, uh, activation, bf16 = a.bf16, wh = saved_weights(h, x)](TensorImpl& self) {
      HL_PROFILE(Matmul);
      const Tensor ws[1] = {w}, bs[1] = {b};
      LinearArgs a = plan_linear(x, ws, bs);
      a.bf16 = bf16;  // the forward's precision and rounded weights
      if (wh.defined()) a.Wh = bf16_data(wh);
      const int64_t N = a.N;
      Tensor du = Tensor::empty(self.shape);  // dL/dU
      const float* G = self.grad->data();
      const float* U = u.defined() ? u.data() : nullptr;
      const uint16_t* Uh = uh.defined() ? bf16_data(uh) : nullptr;
      float* dU = du.data();
      bool fresh;
      float* gx = grad_buffer_for_overwrite(x, fresh);
      auto run = [&](auto backward) {
        linear_backward(a, dU, [&](int64_t lo, int64_t hi) {
          if (U)
            for (int64_t e = lo * N; e < hi * N; ++e) dU[e] = backward(U[e], G[e]);
          else  // the derivative at the bf16 pre-activation (above: which activations are bf16)
            for (int64_t e = lo * N; e < hi * N; ++e) dU[e] = backward(from_bf16(Uh[e]), G[e]);
        }, gx, fresh);
      };
      switch (activation) {
        case Activation::GeluTanh: run([](float v, float g) { return act::gelu_tanh_backward(v, g); }); break;
        case Activation::GeluErf: run([](float v, float g) { return act::gelu_erf_backward(v, g); }); break;
        case Activation::Relu: run([](float v, float g) { return act::relu_backward(v, g); }); break;
        case Activation::Relu2: run([](float v, float g) { return act::relu2_backward(v, g); }); break;
        case Activation::Silu: run([](float v, float g) { return act::silu_backward(v, g); }); break;
      }
    });
  return y;
}

}  // namespace hl
