// The sparse training loss of TopK and BatchTopK SAEs: the selection, the forward over the
// active entries, then the backward beside it (models/sae_sparse.h has the formulas).
#include "sae_sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include <immintrin.h>
#include <limits>

#include "lib/autograd.h"
#include "lib/parallel.h"

namespace hl {

namespace {
constexpr int64_t kRankSelectMax = 96;  // candidates ranked pairwise up to this many, else nth_element
}  // namespace

void select_row_topk(const float* row, int64_t D, int64_t k, int32_t* out, const int32_t* at) {
  // Three passes over the row, no sort of it: (1) a floor, a value with at least k entries at or
  // above it, from the maxima of 4k groups; (2) the entries at or above the floor (about 1.3k of
  // them for any D: the floor sits near the k-th largest group maximum) collected in position
  // order; (3) the k-th best of those by nth_element on their values, then the candidates above
  // it and, of those equal to it, the first in position order (ties by the smaller index).
  // Passes (1) and (2) are branch-free loops the compiler vectorises.
  thread_local std::vector<float> gathered, maxima, values, cand_v;
  thread_local std::vector<int32_t> cand_p;
  const float* v = row;
  if (at) {  // AuxK's dead columns, gathered so the passes below read them contiguously
    gathered.resize(static_cast<size_t>(D));
    for (int64_t p = 0; p < D; ++p) gathered[p] = row[at[p]];
    v = gathered.data();
  }
  // (1) groups of positions {q, q + G, q + 2G, ...}: any partition bounds the k-th largest from
  // below, and strided groups make the maxima an elementwise max of contiguous slices
  const int64_t G = 4 * k;
  float floor = -std::numeric_limits<float>::infinity();
  if (D >= 2 * G) {
    maxima.assign(v, v + G);
    float* m = maxima.data();
    for (int64_t p = G; p < D; p += G) {
      const float* s = v + p;
      const int64_t n = std::min(G, D - p);
      for (int64_t q = 0; q < n; ++q) m[q] = s[q] > m[q] ? s[q] : m[q];
    }
    float lo = m[0], hi = m[0];
    int64_t q0 = 1;
#ifdef __AVX512F__
    // lane-wise min and max (a scalar min/max chain was a tenth of the selection at width 512);
    // a NaN maximum is skipped as std::min/max skip it, and lo only needs to be a floor: any
    // lane's NaN start still leaves a valid (or NaN: no bisection) bound
    if (G >= 16) {
      __m512 vlo = _mm512_loadu_ps(m), vhi = vlo;
      for (q0 = 16; q0 + 16 <= G; q0 += 16) {
        const __m512 x = _mm512_loadu_ps(m + q0);
        vlo = _mm512_min_ps(x, vlo), vhi = _mm512_max_ps(x, vhi);
      }
      lo = _mm512_reduce_min_ps(vlo), hi = _mm512_reduce_max_ps(vhi);
    }
#endif
    for (int64_t q = q0; q < G; ++q) lo = std::min(lo, m[q]), hi = std::max(hi, m[q]);
    // bisection on the value: at least k maxima (so k entries) stay at or above lo
    for (int it = 0; it < 20 && std::isfinite(lo) && std::isfinite(hi) && lo < hi; ++it) {
      const float mid = lo + 0.5f * (hi - lo);
      int64_t above = 0, q = 0;
#ifdef __AVX512F__
      const __m512 vmid = _mm512_set1_ps(mid);
      for (; q + 16 <= G; q += 16) above += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_loadu_ps(m + q), vmid, _CMP_GE_OQ));
#endif
      for (; q < G; ++q) above += m[q] >= mid;
      if (above < k) {
        hi = mid;
      } else {
        if (mid == lo) break;  // no float between them
        lo = mid;
        if (above <= k + k / 4) break;  // close enough: few candidates past k
      }
    }
    floor = lo;
  }
  // (2) candidates: positions with v >= floor (NaN never is), values and positions apart
  cand_v.resize(static_cast<size_t>(D + 16)), cand_p.resize(static_cast<size_t>(D + 16));  // + a vector's spill
  float* cv = cand_v.data();
  int32_t* cp = cand_p.data();
  int64_t n = 0, p = 0;
#ifdef __AVX512F__
  // compressed in registers, then stored whole (Zen 4's compress-to-memory is microcoded)
  const __m512 vf = _mm512_set1_ps(floor);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i pos = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; p + 16 <= D; p += 16, pos = _mm512_add_epi32(pos, step)) {
    const __m512 x = _mm512_loadu_ps(v + p);
    const __mmask16 m = _mm512_cmp_ps_mask(x, vf, _CMP_GE_OQ);  // stored even when empty: no branch to mispredict
    _mm512_storeu_ps(cv + n, _mm512_maskz_compress_ps(m, x));
    _mm512_storeu_si512(cp + n, _mm512_maskz_compress_epi32(m, pos));
    n += __builtin_popcount(m);
  }
#endif
  for (; p < D; ++p) {  // branch-free
    cv[n] = v[p], cp[n] = static_cast<int32_t>(p);
    n += v[p] >= floor;
  }
  if (n < k) {  // NaN entries: all positions, NaN ordered below -inf
    for (p = 0; p < D; ++p) cv[p] = std::isnan(v[p]) ? -std::numeric_limits<float>::infinity() : v[p], cp[p] = static_cast<int32_t>(p);
    n = D;
  }
  // (3) the k best candidates. Few of them (the usual case): each one's rank, the candidates
  // above it plus those equal to it earlier in position order (ties by the smaller index), kept
  // when below k; n^2 branch-free compares the compiler vectorises, no data-dependent branch.
  if (n <= kRankSelectMax) {
    int64_t w = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = cv[i];
      int64_t rank = 0;
#ifdef __AVX512F__
      const __m512 xv = _mm512_set1_ps(x);
      for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const __mmask16 valid = n - j0 >= 16 ? 0xFFFF : __mmask16((1u << (n - j0)) - 1);
        const __mmask16 before = i - j0 >= 16 ? 0xFFFF : i <= j0 ? 0 : __mmask16((1u << (i - j0)) - 1);
        const __m512 y = _mm512_maskz_loadu_ps(valid, cv + j0);
        rank += __builtin_popcount(_mm512_mask_cmp_ps_mask(valid, y, xv, _CMP_GT_OQ) |
                                   _mm512_mask_cmp_ps_mask(before, y, xv, _CMP_GE_OQ));
      }
#else
      for (int64_t j = 0; j < i; ++j) rank += cv[j] >= x;
      for (int64_t j = i + 1; j < n; ++j) rank += cv[j] > x;
#endif
      cp[w] = cp[i];  // compacted in place (w <= i): out holds only k
      w += rank < k;
    }
    for (int64_t i = 0; i < k; ++i) out[i] = at ? at[cp[i]] : cp[i];
    return;
  }
  // Else the k-th largest candidate value t: keep those above t, then ties at t in position order
  values.resize(static_cast<size_t>(D));  // not n: a capacity that does not grow with each new largest n
  std::copy_n(cv, n, values.data());
  std::nth_element(values.data(), values.data() + (k - 1), values.data() + n, std::greater<float>());
  const float t = values[k - 1];
  int64_t ties = k;
  for (int64_t i = 0; i < n; ++i) ties -= cv[i] > t;
  int64_t w = 0;
  for (int64_t i = 0; i < n && w < k; ++i)
    if (cv[i] > t || (cv[i] == t && ties-- > 0)) out[w++] = at ? at[cp[i]] : cp[i];
}

namespace {

// Entries of (N, d_sae) row by row (CSR), and the same entries by feature for the backward.
struct SparseEntries {
  std::vector<int64_t> start;         // (N + 1)
  std::vector<int32_t> index, row;    // per entry: its feature and its row
  std::vector<float> value, grad;     // per entry: the activation; dL/dpre / c (the forward pass's dot)
  std::vector<int64_t> feature_start; // (d_sae + 1)
  std::vector<int32_t> by_feature;    // entries of feature j at [feature_start[j], feature_start[j + 1]), rows ascending

  void resize(int64_t n) {
    index.resize(static_cast<size_t>(n)), row.resize(static_cast<size_t>(n));
    value.resize(static_cast<size_t>(n)), grad.resize(static_cast<size_t>(n));
  }
  int64_t size() const { return static_cast<int64_t>(index.size()); }
  // every row k entries: row_start r k
  void fixed_rows(int64_t N, int64_t k) {
    start.resize(static_cast<size_t>(N + 1));
    for (int64_t r = 0; r <= N; ++r) start[r] = r * k;
    resize(N * k);
    for (int64_t r = 0; r < N; ++r) std::fill_n(row.begin() + r * k, k, static_cast<int32_t>(r));
  }
  // a counting sort of the entries by feature; within a feature by row (the entries are row by row)
  void sort_by_feature(int64_t F) {
    feature_start.assign(static_cast<size_t>(F + 1), 0);
    for (int32_t j : index) ++feature_start[j + 1];
    for (int64_t j = 0; j < F; ++j) feature_start[j + 1] += feature_start[j];
    by_feature.resize(index.size());
    for (int64_t e = 0; e < size(); ++e) by_feature[feature_start[index[e]]++] = static_cast<int32_t>(e);
    for (int64_t j = F; j > 0; --j) feature_start[j] = feature_start[j - 1];  // the cursors moved each start to the next's
    feature_start[0] = 0;
  }
};

// BatchTopK's selection: relu(pre) with only the k_total largest entries of the whole batch
// kept (ties by flat index), as batch_topk_relu; the positive kept entries into `act`. The
// k_total-th largest value by a radix select on the bit patterns of the positive values (they
// order as unsigned integers): two histogram passes over pre instead of a sort of N d_sae indices.
void select_batch_topk(const float* pre, int64_t N, int64_t F, int64_t k_total, SparseEntries& act,
                       std::vector<uint32_t>& hist, std::vector<int64_t>& ties_kept) {
  constexpr int64_t B = 1 << 16;
  const int n_threads = threads_for(N * F);
  hist.assign(static_cast<size_t>(n_threads * B), 0);
  auto histogram = [&](int64_t high, int shift) {  // high < 0: every positive value by its top 16 bits
    std::fill(hist.begin(), hist.end(), 0u);
    run_on_threads(n_threads, [&](int t, int n) {
      uint32_t* h = hist.data() + t * B;
      const auto [lo, hi] = row_block(N, t, n);
      for (int64_t i = lo * F; i < hi * F; ++i) {
        uint32_t bits;
        std::memcpy(&bits, pre + i, 4);
        if (!(pre[i] > 0.f)) continue;
        if (high < 0 || (bits >> 16) == uint32_t(high)) ++h[(bits >> shift) & (B - 1)];
      }
    });
    for (int t = 1; t < n_threads; ++t)
      for (int64_t b = 0; b < B; ++b) hist[b] += hist[t * B + b];
  };
  // the bin holding the need-th largest counted value, walking down; need becomes its rank there
  auto walk = [&](int64_t& need) {
    for (int64_t b = B - 1; b >= 0; --b) {
      if (need <= int64_t(hist[b])) return b;
      need -= hist[b];
    }
    return int64_t(-1);
  };
  histogram(-1, 16);
  int64_t positives = 0;
  for (int64_t b = 0; b < B; ++b) positives += hist[b];
  float t = 0.f;  // keep pre > t, and ties at t in flat order while the count is short
  int64_t ties_left = 0;
  if (positives > k_total) {  // else every positive entry is kept
    int64_t need = k_total;
    const int64_t high = walk(need);
    histogram(high, 0);
    const int64_t low = walk(need);
    const uint32_t bits = uint32_t(high) << 16 | uint32_t(low);
    std::memcpy(&t, &bits, 4);
    ties_left = need;  // entries equal to t that are kept: the rank within the value's own count
  }
  // per row: entries above t and ties at t, then the ties shared out in flat order
  act.start.assign(static_cast<size_t>(N + 1), 0);
  ties_kept.resize(static_cast<size_t>(N));
  parallel_for(N, N * F, [&](int64_t r) {
    int64_t above = 0, ties = 0;
    const float* p = pre + r * F;
    for (int64_t j = 0; j < F; ++j) above += p[j] > t, ties += p[j] == t && t > 0.f;
    act.start[r + 1] = above;
    ties_kept[r] = ties;
  });
  for (int64_t r = 0; r < N; ++r) {
    ties_kept[r] = std::min(ties_kept[r], ties_left);
    ties_left -= ties_kept[r];
    act.start[r + 1] += act.start[r] + ties_kept[r];
  }
  HL_CHECK(act.start[N] < std::numeric_limits<int32_t>::max(), "BatchTopK: ", act.start[N], " active entries in one batch");
  act.resize(act.start[N]);
  parallel_for(N, N * F, [&](int64_t r) {
    const float* p = pre + r * F;
    int64_t e = act.start[r], ties = ties_kept[r];
    for (int64_t j = 0; j < F; ++j)
      if (p[j] > t || (p[j] == t && t > 0.f && ties-- > 0)) {
        act.index[e] = static_cast<int32_t>(j), act.value[e] = p[j], act.row[e] = static_cast<int32_t>(r);
        ++e;
      }
  });
}

}  // namespace

struct SaeSparseWork {
  uint64_t generation = 0;  // the loss whose backward may run next
  Tensor in;                // (N, d_in): the encoder's input, x - b_dec or x
  Tensor err, aux_err;      // (N, D): x_hat - target; AuxK's reconstruction - residual
  SparseEntries act, aux;   // the selected features; AuxK's dead-feature selection
  std::vector<int32_t> dead_list;
  std::vector<double> row_mse, row_aux, column_sums;
  std::vector<float> feature_grad_sum;  // (d_sae): sum over rows of dL/dpre
  std::vector<int64_t> packed_start;  // the backward by feature: (d_sae + 1) each feature's packed entries
  std::vector<int32_t> packed_row;    // per entry in feature order: its row (N + r: AuxK's row r)
  std::vector<float> packed_coef, packed_grad;  // its coefficient of the row of err (or aux_err), its dL/dpre
  std::vector<uint32_t> hist;   // BatchTopK's radix select: a histogram per thread
  std::vector<int64_t> ties_kept;  // BatchTopK: per row, the entries at the threshold kept
  // AuxK dense over the dead features (aux_dense): dead_pos (d_sae) a dead feature's column;
  // aux_act (N, n_dead) the selected pre-activations; aux_dec (n_dead, D) their W_dec rows; the
  // backward's dA (N, n_dead), dW_dec rows (n_dead, D) and dW_enc columns (d_in, n_dead)
  bool aux_dense = false;
  std::vector<int32_t> dead_pos;
  std::vector<char> aux_selected;
  // (vectors, not pooled tensors: n_dead changes from step to step, a vector keeps its capacity)
  int64_t n_dead = 0;
  std::vector<float> aux_act, aux_dec, aux_grad, aux_dec_grad, aux_enc_grad;
  std::vector<float> pre_blocks;  // the encoder in row blocks: a (block rows, d_sae) block per thread
  std::vector<float> tiles;       // the backward's column tiles: a (rows, kColumnTile) copy per thread
};

std::shared_ptr<SaeSparseWork> make_sae_sparse_work() { return std::make_shared<SaeSparseWork>(); }

namespace {
inline float dot(const float* a, const float* b, int64_t n) {
#ifdef __AVX512F__
  // two registers of partial sums, the tail masked, then a tree sum (the compiler's reduction
  // added the 16 lanes one after another: a sixth of the backward at width 64)
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : __mmask16((1u << (n - i)) - 1);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#else
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
#endif
}
inline void axpy(float a, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
// y (D) += sum over s < n of a[s] W[idx[s]] (rows of W, D wide), in s order; with skip_zero the
// entries with a[s] == 0 are left out. Per element the same FMAs in the same order as an axpy
// per entry, but the sums stay in registers across the entries, 64 columns at a time: an axpy
// per entry loaded and stored y each time, and at width 64 each entry waited on the last one's
// store (two fifths of the decoder pass at 64 x 8).
inline void add_rows(const float* W, int64_t D, const int32_t* idx, const float* a, int64_t n, bool skip_zero, float* y) {
#ifdef __AVX512F__
  for (int64_t c0 = 0; c0 < D; c0 += 64) {
    __m512 acc[4];
    __mmask16 m[4];
    for (int v = 0; v < 4; ++v) {
      const int64_t left = D - c0 - 16 * v;
      m[v] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : __mmask16((1u << left) - 1);
      acc[v] = _mm512_maskz_loadu_ps(m[v], y + c0 + 16 * v);
    }
    for (int64_t s = 0; s < n; ++s) {
      if (skip_zero && a[s] == 0.f) continue;
      const float* x = W + int64_t(idx[s]) * D + c0;
      const __m512 c = _mm512_set1_ps(a[s]);
      for (int v = 0; v < 4; ++v) acc[v] = _mm512_fmadd_ps(c, _mm512_maskz_loadu_ps(m[v], x + 16 * v), acc[v]);
    }
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(y + c0 + 16 * v, m[v], acc[v]);
  }
#else
  for (int64_t s = 0; s < n; ++s)
    if (!skip_zero || a[s] != 0.f) axpy(a[s], W + int64_t(idx[s]) * D, y, D);
#endif
}
constexpr int64_t kRowChunk = 256;  // column sums over fixed chunks of rows: the same sum for any thread count
constexpr int64_t kColumnTile = 32;  // the backward's columns per pass: N x 32 floats (512 KB at N 4096) in L2
// acc[0, width) = sum over q in [q0, q1) of coef[q] * row_of(rows[q])[c0, c0 + width), in q order
template <class RowOf>
inline void tile_sum(int64_t q0, int64_t q1, const int32_t* rows, const float* coef, int64_t c0, int64_t width,
                     float* acc, const RowOf& row_of) {
#ifdef __AVX512F__
  if (width == kColumnTile) {  // two registers of sums
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t q = q0; q < q1; ++q) {
      const float* x = row_of(rows[q]) + c0;
      const __m512 c = _mm512_set1_ps(coef[q]);
      a0 = _mm512_fmadd_ps(c, _mm512_loadu_ps(x), a0);
      a1 = _mm512_fmadd_ps(c, _mm512_loadu_ps(x + 16), a1);
    }
    _mm512_storeu_ps(acc, a0), _mm512_storeu_ps(acc + 16, a1);
    return;
  }
#endif
  std::fill_n(acc, width, 0.f);
  for (int64_t q = q0; q < q1; ++q) axpy(coef[q], row_of(rows[q]) + c0, acc, width);
}
constexpr int64_t kAuxDenseRatio = 8;  // AuxK runs dense over the dead features when n_dead <= 8 k_aux

// The encoder's product in blocks of this many rows (0: one product over all rows). TopK only
// (BatchTopK selects over the whole batch), and only while W_enc is small (at most 64K floats,
// 64 x 8 say): each block's sgemm packs W_enc again, cheap at that size, and the (rows, F)
// block, 512 KB, stays in L2 for the selection; at 64 x 8 the (N, F) pre-activations written
// out, zeroed first by OpenBLAS and read back cost more than the product's arithmetic.
constexpr int64_t kEncoderBlockMaxWeights = 1 << 16, kEncoderBlockFloats = 1 << 17;
int64_t encoder_block_rows(SaeArch arch, int64_t d, int64_t F) {
  if (arch != SaeArch::TopK || d * F > kEncoderBlockMaxWeights) return 0;
  return std::max<int64_t>(16, kEncoderBlockFloats / F);
}

// AuxK's gradients when its products run dense over the dead features (aux_dense), added to
// the gradients the per-feature pass wrote: dA = c_aux aux_err aux_dec^T at the selected
// entries, dW_dec[dead] += c_aux aux_act^T aux_err, dW_enc[:, dead] += in^T dA, and dA's
// column sums into b_enc's gradient and feature_grad_sum.
void add_dense_aux_grads(SaeSparseWork& w, float c_aux, int64_t N, int64_t d, int64_t F, int64_t D, float* gW_enc,
                         float* gW_dec, float* gb_enc) {
  const int64_t n_dead = w.n_dead;
  const float* A = w.aux_act.data();
  w.aux_grad.resize(static_cast<size_t>(N * n_dead));
  float* dA = w.aux_grad.data();
  gemm(false, true, N, n_dead, D, c_aux, w.aux_err.data(), D, w.aux_dec.data(), D, 0.f, dA, n_dead);
  w.aux_selected.assign(static_cast<size_t>(N * n_dead), 0);  // a selected entry passes its gradient whatever its value
  for (int64_t e = 0; e < w.aux.size(); ++e) w.aux_selected[w.aux.row[e] * n_dead + w.dead_pos[w.aux.index[e]]] = 1;
  for (int64_t i = 0; i < N * n_dead; ++i) dA[i] = w.aux_selected[i] ? dA[i] : 0.f;
  w.aux_dec_grad.resize(static_cast<size_t>(n_dead * D));
  gemm(true, false, n_dead, D, N, c_aux, A, n_dead, w.aux_err.data(), D, 0.f, w.aux_dec_grad.data(), D);
  w.aux_enc_grad.resize(static_cast<size_t>(d * n_dead));
  gemm(true, false, d, n_dead, N, 1.f, w.in.data(), d, dA, n_dead, 0.f, w.aux_enc_grad.data(), n_dead);
  const float *gdec = w.aux_dec_grad.data(), *genc = w.aux_enc_grad.data();
  parallel_for(n_dead, n_dead * (N + d + D), [&](int64_t c) {
    const int64_t j = w.dead_list[c];
    float s = 0.f;
    for (int64_t r = 0; r < N; ++r) s += dA[r * n_dead + c];
    if (gb_enc) gb_enc[j] += s;
    w.feature_grad_sum[j] += s;
    for (int64_t k = 0; k < D; ++k) gW_dec[j * D + k] += gdec[c * D + k];
    for (int64_t i = 0; i < d; ++i) gW_enc[i * F + j] += genc[i * n_dead + c];
  });
}

}  // namespace

SaeSparseLoss sae_sparse_loss(const Sae& sae, const Tensor& x, const Tensor& target, const SaeAuxK& auxk,
                              const std::shared_ptr<SaeSparseWork>& work) {
  const SaeConfig& cfg = sae.cfg;
  HL_CHECK(cfg.arch == SaeArch::TopK || cfg.arch == SaeArch::BatchTopK, "sae_sparse_loss: a ", sae_arch_name(cfg.arch),
           " SAE has no sparse step (TopK and BatchTopK have)");
  const int64_t d = cfg.d_in, F = cfg.d_sae, D = cfg.out_width();
  HL_CHECK(x.ndim() == 2 && x.size(1) == d, "sae_sparse_loss: x must be (N, ", d, "), got ", x.shape().str());
  const int64_t N = x.size(0);
  HL_CHECK(target.ndim() == 2 && target.size(0) == N && target.size(1) == D, "sae_sparse_loss: target must be (", N, ", ", D,
           "), got ", target.shape().str());
  HL_CHECK(work != nullptr, "sae_sparse_loss: no workspace");
  SaeSparseWork& w = *work;
  const uint64_t generation = ++w.generation;

  // the encoder's input: x - b_dec (apply_b_dec_to_input) or x
  const float* b_dec = sae.b_dec.data();
  if (cfg.apply_b_dec_to_input) {
    w.in = Tensor::empty({N, d});
    const float* xp = x.data();
    float* ip = w.in.data();
    parallel_for(N, N * d, [&](int64_t r) {
      for (int64_t c = 0; c < d; ++c) ip[r * d + c] = xp[r * d + c] - b_dec[c];
    });
  } else {
    w.in = x;
  }
  // AuxK's dead features (selected from below, negative pre-activations too)
  w.dead_list.clear();
  w.dead_list.reserve(static_cast<size_t>(F));  // grown once: the dead count changes from step to step
  if (auxk.dead && auxk.weight > 0.f) {
    HL_CHECK(int64_t(auxk.dead->size()) == F, "sae_sparse_loss: the dead mask has ", auxk.dead->size(), " features, the SAE ", F);
    for (int64_t j = 0; j < F; ++j)
      if ((*auxk.dead)[j]) w.dead_list.push_back(static_cast<int32_t>(j));
  }
  const int64_t n_dead = static_cast<int64_t>(w.dead_list.size());
  const int64_t k_aux = std::min(auxk.k_aux, n_dead);
  const bool with_aux = k_aux > 0;
  // With few dead features each is selected in many rows (all of them when n_dead <= k_aux):
  // AuxK's products are then sgemms over the dead features' columns, (N, n_dead) dense, rather
  // than row gathers bound by memory. The switch: a dead feature selected in at least 1 row of 8.
  const bool aux_dense = with_aux && k_aux * kAuxDenseRatio >= n_dead;
  w.aux_dense = aux_dense;
  w.aux.fixed_rows(with_aux ? N : 0, k_aux);

  const float* b_enc = sae.b_enc.data();
  const int64_t k = cfg.k;
  // Row r's pre-activations p (F): the bias added, then TopK's selection (relu'd: an entry kept
  // at <= 0 holds 0; BatchTopK selects over the batch instead) and AuxK's over the dead features
  auto select_row = [&](int64_t r, float* p) {
    if (cfg.arch == SaeArch::TopK) {
      for (int64_t j = 0; j < F; ++j) p[j] = p[j] + b_enc[j];
      int32_t* idx = w.act.index.data() + r * k;
      select_row_topk(p, F, k, idx);
      for (int64_t s = 0; s < k; ++s) w.act.value[r * k + s] = std::max(p[idx[s]], 0.f);
    }
    if (!with_aux) return;
    int32_t* idx = w.aux.index.data() + r * k_aux;
    if (k_aux == n_dead) std::copy_n(w.dead_list.data(), n_dead, idx);
    else select_row_topk(p, n_dead, k_aux, idx, w.dead_list.data());
    for (int64_t s = 0; s < k_aux; ++s) w.aux.value[r * k_aux + s] = p[idx[s]];
  };
  const int64_t block_rows = encoder_block_rows(cfg.arch, d, F);
  if (block_rows > 0) {
    // pre in blocks of rows that stay in cache, each selected from as soon as it is computed:
    // (N, F) is never written out and read back. The blocks are the same for any thread count.
    w.act.fixed_rows(N, k);
    const int64_t blocks = (N + block_rows - 1) / block_rows;
    const int n_threads = std::min<int>(threads_for(N * F * d), static_cast<int>(blocks));
    w.pre_blocks.resize(static_cast<size_t>(n_threads * block_rows * F));
    run_on_threads(n_threads, [&](int t, int n) {
      float* p = w.pre_blocks.data() + t * block_rows * F;
      const auto [b0, b1] = row_block(blocks, t, n);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * block_rows, rows = std::min(block_rows, N - r0);
        gemm(false, false, rows, F, d, 1.f, w.in.data() + r0 * d, d, sae.W_enc.data(), F, 0.f, p, F);  // one thread here
        for (int64_t i = 0; i < rows; ++i) select_row(r0 + i, p + i * F);
      }
    });
  } else {
    // pre (N, F) as Sae::pre_acts computes it (the same sgemm), so the selections are the dense step's
    Tensor pre_t = Tensor::empty({N, F});
    float* pre = pre_t.data();
    gemm(false, false, N, F, d, 1.f, w.in.data(), d, sae.W_enc.data(), F, 0.f, pre, F);
    if (cfg.arch == SaeArch::TopK) {
      w.act.fixed_rows(N, k);
      parallel_for(N, N * F, [&](int64_t r) { select_row(r, pre + r * F); });  // each row selected from while in cache
    } else {
      parallel_for(N, N * F, [&](int64_t r) {
        for (int64_t j = 0; j < F; ++j) pre[r * F + j] = pre[r * F + j] + b_enc[j];
      });
      select_batch_topk(pre, N, F, std::min(k * N, N * F), w.act, w.hist, w.ties_kept);
      if (with_aux) parallel_for(N, N * F, [&](int64_t r) { select_row(r, pre + r * F); });
    }
  }

  // the decoder over the active rows of W_dec, the errors, AuxK's reconstruction (row gathers when sparse)
  w.err = Tensor::empty({N, D});
  if (with_aux) w.aux_err = Tensor::empty({N, D});
  w.row_mse.resize(static_cast<size_t>(N));
  w.row_aux.assign(static_cast<size_t>(N), 0.0);
  const float* W_dec = sae.W_dec.data();
  const float* tg = target.data();
  // The backward's dL/dpre at an active entry is c * (err_r . W_dec[j]): the dot taken here, while
  // the row's k rows of W_dec are in cache (the backward read them all again: 400 MB at 768 x 8),
  // and scaled by c there (the same product, so the same float).
  const Tensor W_enc_t = sae.W_enc, b_enc_t = sae.b_enc, W_dec_t = sae.W_dec, b_dec_t = sae.b_dec;
  const bool backward_follows = needs_graph({&W_enc_t, &b_enc_t, &W_dec_t, &b_dec_t});
  auto aux_row_loss = [&](int64_t r) {
    double sa = 0;
    const float* a = w.aux_err.data() + r * D;
    for (int64_t c = 0; c < D; ++c) sa += double(a[c]) * a[c];
    w.row_aux[r] = sa;
  };
  parallel_for(N, N * (w.act.start[N] / std::max<int64_t>(N, 1) + k_aux) * D, [&](int64_t r) {
    float* e = w.err.data() + r * D;
    std::copy_n(b_dec, D, e);
    add_rows(W_dec, D, w.act.index.data() + w.act.start[r], w.act.value.data() + w.act.start[r],
             w.act.start[r + 1] - w.act.start[r], true, e);
    double sq = 0;
    for (int64_t c = 0; c < D; ++c) e[c] -= tg[r * D + c], sq += double(e[c]) * e[c];
    w.row_mse[r] = sq;
    if (backward_follows)
      for (int64_t s = w.act.start[r]; s < w.act.start[r + 1]; ++s)
        w.act.grad[s] = w.act.value[s] > 0.f ? dot(e, W_dec + int64_t(w.act.index[s]) * D, D) : 0.f;
    if (!with_aux || aux_dense) return;
    const int32_t* idx = w.aux.index.data() + r * k_aux;
    float* a = w.aux_err.data() + r * D;
    std::copy_n(e, D, a);  // the residual target - x_hat is -e (detached)
    add_rows(W_dec, D, idx, w.aux.value.data() + r * k_aux, k_aux, false, a);
    aux_row_loss(r);
    if (backward_follows)
      for (int64_t s = 0; s < k_aux; ++s) w.aux.grad[r * k_aux + s] = dot(a, W_dec + int64_t(idx[s]) * D, D);
  });
  if (aux_dense) {
    // aux_act (N, n_dead): the selected pre-activations, 0 elsewhere; aux_dec (n_dead, D) the dead rows of W_dec
    w.dead_pos.resize(static_cast<size_t>(F));
    for (int64_t c = 0; c < n_dead; ++c) w.dead_pos[w.dead_list[c]] = static_cast<int32_t>(c);
    w.n_dead = n_dead;
    w.aux_act.assign(static_cast<size_t>(N * n_dead), 0.f);
    w.aux_dec.resize(static_cast<size_t>(n_dead * D));
    float* A = w.aux_act.data();
    for (int64_t e = 0; e < w.aux.size(); ++e) A[w.aux.row[e] * n_dead + w.dead_pos[w.aux.index[e]]] = w.aux.value[e];
    for (int64_t c = 0; c < n_dead; ++c) std::copy_n(W_dec + int64_t(w.dead_list[c]) * D, D, w.aux_dec.data() + c * D);
    std::copy_n(w.err.data(), N * D, w.aux_err.data());  // the residual target - x_hat is -e (detached)
    gemm(false, false, N, D, n_dead, 1.f, A, n_dead, w.aux_dec.data(), D, 1.f, w.aux_err.data(), D);
    parallel_for(N, N * D, aux_row_loss);
  }
  double mse = 0, aux = 0;
  for (int64_t r = 0; r < N; ++r) mse += w.row_mse[r], aux += w.row_aux[r];
  mse /= double(N), aux /= double(N);

  SaeSparseLoss out;
  out.mse = static_cast<float>(mse);
  out.aux = static_cast<float>(aux);
  out.err = w.err;
  out.row_start = w.act.start;
  out.index = w.act.index;
  out.value = w.act.value;
  out.loss = Tensor::scalar(static_cast<float>(mse + (with_aux ? double(auxk.weight) * aux : 0.0)));
  if (!backward_follows) return out;
  const float aux_weight = with_aux ? auxk.weight : 0.f;
  const bool apply_b_dec = cfg.apply_b_dec_to_input;
  attach(out.loss, "sae_sparse_loss", {W_enc_t, b_enc_t, W_dec_t, b_dec_t},
         [work, generation, W_enc_t, b_enc_t, W_dec_t, b_dec_t, aux_weight, apply_b_dec, N, d, F, D](TensorImpl& self) {
    SaeSparseWork& w = *work;
    HL_CHECK(w.generation == generation, "sae_sparse_loss: its workspace served another loss before this one's backward");
    const float g0 = self.grad->data()[0];
    // dL/dx_hat_r = c_mse e_r; AuxK's dL/d(aux reconstruction)_r = c_aux a_r
    const float c_mse = 2.f * g0 / float(N), c_aux = 2.f * g0 * aux_weight / float(N);
    const float* err = w.err.data();
    const float* aux_err = w.aux_err.defined() ? w.aux_err.data() : nullptr;
    const bool with_aux = w.aux.size() > 0, aux_sparse = with_aux && !w.aux_dense;
    bool fresh_enc = false, fresh_dec = false;
    float* gW_enc = grad_buffer_for_overwrite(W_enc_t, fresh_enc);
    float* gW_dec = grad_buffer_for_overwrite(W_dec_t, fresh_dec);
    float* gb_enc = grad_buffer(b_enc_t);
    w.feature_grad_sum.resize(static_cast<size_t>(F));
    const float* in = w.in.data();
    const int64_t entries = w.act.size() + (aux_sparse ? w.aux.size() : 0);
    {
      // Per feature: its W_dec gradient row, its W_enc gradient column, its b_enc gradient, summed
      // over its entries in row order (act's, then AuxK's), each thread over the features it owns.
      // The entries packed in feature order (row, dL/dx_hat's coefficient, dL/dpre),
      // then each feature's sums a tile of kColumnTile columns at a time. A tile of err's (or
      // in's) rows, N x kColumnTile floats, stays in cache while every feature's entries gather
      // from it; whole rows (3 KB each at width 768, two per entry) did not (about 800 MB of row
      // reads a step at 768 x 8). A pass by rows into (d_sae, D + d) sums was slower at every size.
      // An entry's row: r in err, or N + r for AuxK's (aux_err's row r); `in` row r for both.
      w.act.sort_by_feature(F);
      if (aux_sparse) w.aux.sort_by_feature(F);
      w.packed_start.resize(static_cast<size_t>(F + 1));
      w.packed_start[0] = 0;
      for (int64_t j = 0; j < F; ++j)
        w.packed_start[j + 1] = w.packed_start[j] + (w.act.feature_start[j + 1] - w.act.feature_start[j]) +
                                (aux_sparse ? w.aux.feature_start[j + 1] - w.aux.feature_start[j] : 0);
      w.packed_row.resize(static_cast<size_t>(entries));
      w.packed_coef.resize(static_cast<size_t>(entries));
      w.packed_grad.resize(static_cast<size_t>(entries));
      const int64_t* start = w.packed_start.data();
      int32_t* rows = w.packed_row.data();
      float *coefs = w.packed_coef.data(), *grads = w.packed_grad.data();
      // each thread's copy of the tile being summed, rows contiguous: (N, or 2 N with AuxK's rows,
      // kColumnTile). In place, a tile's rows sit one row stride apart (3 KB at width 768), which
      // maps them onto a sixteenth of L2's sets: the tile did not stay in L2 and each entry's
      // gather went to L3.
      const int tile_threads = threads_for(entries * (d + D) + F * (d + D));
      const int64_t tile_rows = aux_sparse ? 2 * N : N;
      w.tiles.resize(static_cast<size_t>(tile_threads * tile_rows * kColumnTile));
      run_on_threads(tile_threads, [&](int t, int n) {
        const auto [j0, j1] = row_block(F, t, n);  // this thread's features
        float* tile = w.tiles.data() + t * tile_rows * kColumnTile;
        // rows [0, n_rows) of src (stride ld), columns [c0, c0 + width), into the tile
        auto copy_tile = [&](const float* src, int64_t ld, int64_t n_rows, int64_t c0, int64_t width, float* to) {
          for (int64_t r = 0; r < n_rows; ++r) std::copy_n(src + r * ld + c0, width, to + r * kColumnTile);
        };
        for (int64_t j = j0; j < j1; ++j) {
          int64_t q = start[j];
          float s = 0.f;
          auto pack = [&](const SparseEntries& en, int32_t offset, float c) {
            for (int64_t p = en.feature_start[j]; p < en.feature_start[j + 1]; ++p) {
              const int32_t e = en.by_feature[p];
              // a zero coefficient adds 0 (the same sum as skipping the entry, for finite rows);
              // dL/dpre is c times the forward's dot (0 at an entry kept at 0: relu passes nothing)
              rows[q] = offset + en.row[e], coefs[q] = en.value[e] != 0.f ? c * en.value[e] : 0.f, grads[q] = c * en.grad[e];
              s += grads[q];
              ++q;
            }
          };
          pack(w.act, 0, c_mse);
          if (aux_sparse) pack(w.aux, static_cast<int32_t>(N), c_aux);
          if (gb_enc) gb_enc[j] += s;
          w.feature_grad_sum[j] = s;
        }
        float acc[kColumnTile];
        for (int64_t c0 = 0; c0 < D; c0 += kColumnTile) {  // W_dec's gradient rows
          const int64_t width = std::min(kColumnTile, D - c0);
          copy_tile(err, D, N, c0, width, tile);  // err's rows, then AuxK's aux_err rows (N + r)
          if (aux_sparse) copy_tile(aux_err, D, N, c0, width, tile + N * kColumnTile);
          for (int64_t j = j0; j < j1; ++j) {
            tile_sum(start[j], start[j + 1], rows, coefs, 0, width, acc, [&](int32_t r) { return tile + r * kColumnTile; });
            float* g = gW_dec + j * D + c0;
            if (fresh_dec) std::copy_n(acc, width, g);
            else
              for (int64_t c = 0; c < width; ++c) g[c] += acc[c];
          }
        }
        for (int64_t c0 = 0; c0 < d; c0 += kColumnTile) {  // W_enc's gradient columns
          const int64_t width = std::min(kColumnTile, d - c0);
          copy_tile(in, d, N, c0, width, tile);  // AuxK's entries (N + r) read in's row r
          for (int64_t j = j0; j < j1; ++j) {
            tile_sum(start[j], start[j + 1], rows, grads, 0, width, acc,
                     [&](int32_t r) { return tile + (r < N ? r : r - N) * kColumnTile; });
            for (int64_t i = 0; i < width; ++i) {
              float& g = gW_enc[(c0 + i) * F + j];
              g = (fresh_enc ? 0.f : g) + acc[i];
            }
          }
        }
      });
    }
    if (with_aux && !aux_sparse) add_dense_aux_grads(w, c_aux, N, d, F, D, gW_enc, gW_dec, gb_enc);
    // b_dec: the decoder's bias sum_r dL/dx_hat_r, and through the input in = x - b_dec
    if (float* gb = grad_buffer(b_dec_t)) {
      const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
      w.column_sums.assign(static_cast<size_t>(chunks * D), 0.0);
      parallel_for(chunks, N * D, [&](int64_t c0) {
        double* sums = w.column_sums.data() + c0 * D;
        for (int64_t r = c0 * kRowChunk; r < std::min(N, (c0 + 1) * kRowChunk); ++r)
          for (int64_t c = 0; c < D; ++c) sums[c] += err[r * D + c];
      });
      for (int64_t c = 0; c < D; ++c) {
        double s = 0;
        for (int64_t c0 = 0; c0 < chunks; ++c0) s += w.column_sums[c0 * D + c];
        gb[c] += c_mse * static_cast<float>(s);
      }
      if (apply_b_dec) {
        const float* W_enc = W_enc_t.data();
        const float* fs = w.feature_grad_sum.data();
        parallel_for(d, d * F, [&](int64_t i) { gb[i] -= dot(W_enc + i * F, fs, F); });
      }
    }
  });
  return out;
}

}  // namespace hl
