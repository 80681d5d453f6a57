#include "models/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "lib/autograd.h"
#include "lib/broadcast.h"
#include "lib/fastmath.h"
#include "lib/parallel.h"
#include "lib/profile.h"

namespace hl {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Sizes of one attention call, derived once from the operands.
struct AttnDims {
  int64_t B, Tq, Tk, H, Hkv, dh;
  int64_t kv_rows;  // rows per batch entry in the k/v buffers (>= Tk)
  // Where q, k and v live: row strides and column offsets into their tensors' rows. Separate
  // tensors: q (B,Tq,H*dh), k and v (B,Tk,Hkv*dh), offsets 0. Packed: one (B,T,(H+2Hkv)dh).
  int64_t q_ld = 0, kv_ld = 0, q_off = 0, k_off = 0, v_off = 0;
  // Sequences of their own lengths packed back to back (attention_varlen): sequence b is rows
  // [starts[b], starts[b + 1]) of q, k, v and the output; Tq = Tk = kv_rows = the longest.
  // Undefined: sequence b starts at row b * Tq of q and the output, b * kv_rows of k and v.
  // (B + 1); the buffer is kept alive by attention_impl's caller and its backward
  const int32_t* starts = nullptr;
  int64_t q_row(int64_t b) const { return starts ? starts[b] : b * Tq; }
  int64_t kv_row(int64_t b) const { return starts ? starts[b] : b * kv_rows; }
  // Sequence b's dims (its length as Tq, Tk and kv_rows when varlen)
  AttnDims seq(int64_t b) const {
    if (!starts) return *this;
    AttnDims s = *this;
    s.Tq = s.Tk = s.kv_rows = starts[b + 1] - starts[b];
    s.starts = nullptr;
    return s;
  }
  int64_t ldq() const { return q_ld; }       // row stride of q
  int64_t ldkv() const { return kv_ld; }     // row stride of k and v
  int64_t ldo() const { return H * dh; }     // row stride of the output
  int64_t group() const { return H / Hkv; }  // query heads per kv head
};

// The checks every layout shares (heads, masks, gates); d.B, Tq, Tk and kv_rows are set.
void check_attention_args(AttnDims& d, const AttentionArgs& a) {
  if (a.gates.defined() && (a.gates.ndim() != 1 || a.gates.size(0) != d.H))
    fail("attention: gates ", a.gates.shape().str(), " must be (", d.H, ")");
  if (a.key_padding.defined() && a.key_padding.shape() != Shape({d.B, d.Tk}))
    fail("attention: key_padding ", a.key_padding.shape().str(), " must be (", d.B, ",", d.Tk, ")");
  if (a.pattern_grad.defined() && a.pattern_grad.shape() != Shape({d.B, d.H, d.Tq, d.Tk}))
    fail("attention: pattern_grad ", a.pattern_grad.shape().str(), " must be (B,H,Tq,Tk)");
  if (a.dropout > 0.f && !a.rng) fail("attention: dropout needs a random generator");
}

void check_heads(int64_t H, int64_t Hkv) {
  if (H < 1 || Hkv < 1 || H % Hkv) fail("attention: n_kv_heads ", Hkv, " must divide n_heads ", H);
}

AttnDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a) {
  auto shapes = [&] { return q.shape().str() + ", k " + k.shape().str() + ", v " + v.shape().str(); };
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3)
    fail("attention: q ", shapes(), ": expected (B, T, heads*d_head) for each");
  AttnDims d;
  d.B = q.size(0);
  d.Tq = q.size(1);
  d.kv_rows = k.size(1);
  d.Tk = a.kv_len ? a.kv_len : k.size(1);
  if (d.Tk < 1 || d.Tk > d.kv_rows) fail("attention: kv_len ", a.kv_len, " outside 1..", d.kv_rows);
  d.H = a.n_heads;
  d.Hkv = a.n_kv_heads ? a.n_kv_heads : a.n_heads;
  check_heads(d.H, d.Hkv);
  d.dh = a.d_head ? a.d_head : q.size(2) / d.H;
  if (d.dh < 1 || q.size(2) != d.H * d.dh)
    fail("attention: q ", q.shape().str(), " is not ", d.H, " heads of d_head ", d.dh);
  if (k.size(2) != d.Hkv * d.dh || v.shape() != k.shape() || k.size(0) != d.B)
    fail("attention: q ", shapes(), ": k and v must be (", d.B, ", Tk, ", d.Hkv * d.dh, ")");
  d.q_ld = d.H * d.dh;
  d.kv_ld = d.Hkv * d.dh;
  check_attention_args(d, a);
  return d;
}

// The column layout of one packed qkv tensor (..., (H + 2 Hkv) dh) of `ndim` axes: q's heads,
// then k's, then v's. `what` and `expected` name it in messages.
AttnDims packed_columns(const Tensor& qkv, const AttentionArgs& a, int ndim, const char* what, const char* expected) {
  AttnDims d;
  d.H = a.n_heads;
  d.Hkv = a.n_kv_heads ? a.n_kv_heads : a.n_heads;
  check_heads(d.H, d.Hkv);
  if (qkv.ndim() != ndim) fail("attention: ", what, " ", qkv.shape().str(), ": expected ", expected);
  const int64_t W = qkv.size(ndim - 1);
  d.dh = a.d_head ? a.d_head : W / (d.H + 2 * d.Hkv);
  if (d.dh < 1 || W != (d.H + 2 * d.Hkv) * d.dh)
    fail("attention: ", what, " ", qkv.shape().str(), " ", ndim == 3 ? "is" : "are", " not ", d.H, " + 2 x ", d.Hkv,
         " heads of d_head ", d.dh);
  d.q_ld = d.kv_ld = W;
  d.k_off = d.H * d.dh;
  d.v_off = (d.H + d.Hkv) * d.dh;
  return d;
}

AttnDims check_attention_packed(const Tensor& qkv, const AttentionArgs& a) {
  AttnDims d = packed_columns(qkv, a, 3, "packed qkv", "(B, T, (heads + 2 kv_heads) d_head)");
  if (a.kv_len) fail("attention: packed qkv takes no kv_len (self-attention over its own rows)");
  d.B = qkv.size(0);
  d.Tq = d.Tk = d.kv_rows = qkv.size(1);
  check_attention_args(d, a);
  return d;
}

// Element strides of an additive mask over (B, H, Tq, Tk), 0 on broadcast dims.
struct MaskStrides {
  int64_t s[4] = {0, 0, 0, 0};
};
MaskStrides mask_strides(const Tensor& mask, const AttnDims& d) {
  const Shape scores{d.B, d.H, d.Tq, d.Tk};
  if (mask.ndim() > 4)
    fail("attention: mask ", mask.shape().str(), " has more than 4 dimensions");
  BroadcastPlan p;
  bool ok = true;
  try {
    p = plan_broadcast("attention", scores, mask.shape());
  } catch (const Error&) {
    ok = false;
  }
  if (!ok || p.out != scores)
    fail("attention: mask ", mask.shape().str(), " does not broadcast to scores (B,H,Tq,Tk) = ",
         scores.str());
  MaskStrides m;
  for (int i = 0; i < 4; ++i) m.s[i] = p.stride_b[i];
  return m;
}

// Slices of at least this many keys (the sgemm path) take causal row blocks, are copied
// contiguous and keep no weights for backward. Shorter ones (the study models' T = 33) fit in
// L1 as they are, and their P is small: copies and recomputed scores cost more than they save
// there (V1's attention backward 0.086 -> 0.142 ms with them).
constexpr int64_t kLongSlice = 64;

// Queries are processed in row blocks. Under a causal mask a block of queries sees only the
// keys up to its last query, so scores, weights and their gradients to the right of that are
// never computed (about 40% less work at T = 128); they are exact zeros in P.
int64_t block_rows(const AttnDims& d, bool causal) { return causal && d.Tq >= kLongSlice ? 32 : d.Tq; }
int64_t visible_keys(const AttnDims& d, bool causal, int64_t i1) {
  return causal ? std::max<int64_t>(0, std::min(d.Tk, i1 + (d.Tk - d.Tq))) : d.Tk;
}

// In place: row = softmax(row + masks) over the first `ke` columns (computed by the caller);
// columns from ke on are set to 0. The loops run over all ke columns for every row of a block
// and mask causally by index, branch-free: rows of a block then have one trip count (row-
// dependent lengths cost a mispredicted loop exit per loop and were 1.8x slower at T = 33).
// pad: this sequence's (Tk) key padding or null.
void masked_softmax_row(float* row, int64_t ke, const AttnDims& d, int64_t b, int64_t h, int64_t i,
                        bool causal, const float* pad, const float* am, const MaskStrides& ms) {
  const int64_t last = causal ? i + (d.Tk - d.Tq) : d.Tk - 1;  // last visible key
  if (pad || am)
    for (int64_t j = 0; j < ke; ++j) {
      if (pad && pad[j] != 0.f) row[j] = kNegInf;
      else if (am) row[j] += am[b * ms.s[0] + h * ms.s[1] + i * ms.s[2] + j * ms.s[3]];
    }
  const float m = max_lanes(row, std::min(ke, last + 1));  // over the visible keys
  std::fill(row + ke, row + d.Tk, 0.f);
  if (m == kNegInf) {  // nothing visible: zero weights, not NaN
    std::fill(row, row + ke, 0.f);
    return;
  }
  // The exponentials are summed as they are made, in one pass. On long rows sixteen lanes at a
  // time with the sum in a register (GCC's `omp simd reduction` ends each row in sixteen dependent
  // scalar adds, see fastmath.h: M's attention 6.9 -> 6.4 ms a layer); on rows of a few vectors
  // (T = 33) the compiler's loop is faster (V1's forward 0.069 -> 0.060 ms).
  float sum = 0.f;
#ifdef __AVX512F__
  if (ke >= kLongSlice) {
    const int64_t seen = std::min(ke, last + 1);  // keys the row sees; columns [seen, ke) get 0
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < ke; j += 16) {
      alignas(64) float e[16];  // lanes past `seen` read -inf, whose exponential is 0
      _mm512_store_ps(e, _mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), first_lanes(seen - j), row + j), vm));
      for (int l = 0; l < 16; ++l) e[l] = exp_fast(e[l]);
      const __m512 ev = _mm512_load_ps(e);
      _mm512_mask_storeu_ps(row + j, first_lanes(ke - j), ev);
      acc = _mm512_add_ps(acc, ev);
    }
    sum = _mm512_reduce_add_ps(acc);
  } else
#endif
  {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < ke; ++j) {
      const float e = j <= last ? exp_fast(row[j] - m) : 0.f;
      row[j] = e;
      sum += e;
    }
  }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t j = 0; j < ke; ++j) row[j] *= inv;
}

// ---- Small heads -----------------------------------------------------------------------------
// At d_head <= 8 a (batch, head) slice is a 33 x 33 product of rank 2-8. Along a row of keys
// that is too little work for the row's softmax reductions (max, sum, dot: horizontal, with
// long latency chains) and far too little for six sgemm calls per slice. These kernels put 16
// query rows in the 16 lanes of a register and walk the keys one at a time: every reduction of
// the softmax and its backward is then a plain vertical add or max. The slice's weights are kept
// transposed, (Tk, Tq), in P's storage; `pattern` gets them in the usual layout. Used with the
// causal mask and key padding, not with an additive mask or attention dropout.
#ifdef __AVX512F__
// Up to d_head 8 forward and backward; the forward also at d_head 16 (the S model's heads: its
// forward 2.75 -> 2.41 ms), whose backward with these kernels was slower than the sgemm path's
// (the per-lane dK, dV sums grow with d_head), so it keeps that one.
constexpr int64_t kSmallHeadMax = 8, kSmallKeysMax = 128;

// Query rows go 16 to a block, the odd rows in the first block: under the causal mask the first
// rows see the fewest keys, so the partial block is the cheapest one (T = 33: 1 + 16 + 16 rows
// walk 1 + 17 + 33 keys, not 16 + 32 + 33).
int64_t first_block_rows(int64_t Tq) { return Tq % 16 ? Tq % 16 : 16; }

// One (batch, head) slice of DH = d_head, forward. q, k, v: (T, dh) at their row strides; pad
// (Tk): keys to hide where nonzero, or null; PT (Tk, Tq) receives the weights transposed (null:
// not kept), o (Tq, dh) at stride ldo the output g P V.
template <int DH>
void small_head_forward(const AttnDims& d, bool causal, const float* pad, float scale, float g, const float* q,
                        const float* k, const float* v, float* PT, float* o) {
  alignas(64) float st[kSmallKeysMax * 16];  // scores, then exponentials: (key, lane)
  alignas(64) float ot[DH * 16];
  for (int64_t i0 = 0, n = first_block_rows(d.Tq); i0 < d.Tq; i0 += n, n = 16) {
    const __mmask16 rows = first_lanes(n);
    __m512 qt[DH];  // scale q^T for these rows: (dh, lanes)
    _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c)
      qt[c] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows,
                                       _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                          _mm512_set1_epi32(static_cast<int>(d.ldq()))),
                                       q + i0 * d.ldq() + c, 4);
    _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) qt[c] = _mm512_mul_ps(qt[c], _mm512_set1_ps(scale));
    // lane l (query i0 + l) sees keys j <= i0 + l + (Tk - Tq) under the causal mask
    const __m512i lane_last = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(static_cast<int>(i0 + d.Tk - d.Tq)));
    // keys no row of this block sees (causal) are skipped; their weights are not stored (read
    // back as zeros by transpose_slices, never read by the backward)
    const int64_t kend = causal ? std::max<int64_t>(0, std::min(d.Tk, i0 + n + (d.Tk - d.Tq))) : d.Tk;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < kend; ++j) {
      __m512 sj = _mm512_setzero_ps();
      _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) sj = _mm512_fmadd_ps(qt[c], _mm512_set1_ps(k[j * d.ldkv() + c]), sj);
      __mmask16 vis = pad && pad[j] != 0.f ? __mmask16(0) : rows;
      if (causal) vis &= _mm512_cmp_epi32_mask(_mm512_set1_epi32(static_cast<int>(j)), lane_last, _MM_CMPINT_LE);
      sj = _mm512_mask_blend_ps(vis, _mm512_set1_ps(-INFINITY), sj);
      _mm512_store_ps(st + 16 * j, sj);
      mx = _mm512_max_ps(mx, sj);
    }
    // rows that see nothing get zero weights, not NaN
    const __mmask16 any = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    mx = _mm512_maskz_mov_ps(any, mx);
    alignas(64) float m[16];
    _mm512_store_ps(m, mx);
    for (int64_t j = 0; j < kend; ++j) {
      float* e = st + 16 * j;
#pragma omp simd aligned(e, m : 64)
      for (int64_t l = 0; l < 16; ++l) e[l] = exp_fast(e[l] - m[l]);  // exp(-inf) = 0: hidden keys
    }
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < kend; ++j) sum = _mm512_add_ps(sum, _mm512_load_ps(st + 16 * j));
    const __m512 inv = _mm512_maskz_div_ps(any, _mm512_set1_ps(1.f), sum);
    __m512 acc[DH];
    _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < kend; ++j) {
      const __m512 pj = _mm512_mul_ps(_mm512_load_ps(st + 16 * j), inv);
      if (PT) _mm512_mask_storeu_ps(PT + j * d.Tq + i0, rows, pj);
      _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) acc[c] = _mm512_fmadd_ps(pj, _mm512_set1_ps(v[j * d.ldkv() + c]), acc[c]);
    }
    _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) _mm512_store_ps(ot + 16 * c, _mm512_mul_ps(acc[c], _mm512_set1_ps(g)));
    for (int64_t l = 0; l < n; ++l)
      _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) o[(i0 + l) * d.ldo() + c] = ot[16 * c + l];
  }
}

// One (batch, head) slice, backward, from the transposed weights PT (Tk, Tq) and the output
// gradient do (Tq, dh). dq (+)= scale dS K; dk_lanes, dv_lanes (Tk, dh, 16 lanes) += per-lane
// terms of scale dS^T q and g P^T dO (the caller sums the lanes once per slice group);
// gate_acc += lanes of sum (dO V^T) * P; dp (Tq, Tk), if asked, += dL/dP where P > 0.
// dS = P (g U - rowsum(g U P)) with U = dO V^T.
template <int DH>
void small_head_backward(const AttnDims& d, bool causal, float scale, float g, const float* PT, const float* q, const float* k,
                         const float* v, const float* dout, float* dq, float* dk_lanes, float* dv_lanes,
                         __m512& gate_acc, float* dp) {
  alignas(64) float ub[kSmallKeysMax * 16];
  alignas(64) float dqt[DH * 16];
  const __m512i lane_idx = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t i0 = 0, n = first_block_rows(d.Tq); i0 < d.Tq; i0 += n, n = 16) {
    const __mmask16 rows = first_lanes(n);
    __m512 qt[DH], dot_[DH];
    _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) {
      qt[c] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows,
                                       _mm512_mullo_epi32(lane_idx, _mm512_set1_epi32(static_cast<int>(d.ldq()))),
                                       q + i0 * d.ldq() + c, 4);
      dot_[c] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows,
                                         _mm512_mullo_epi32(lane_idx, _mm512_set1_epi32(static_cast<int>(d.ldo()))),
                                         dout + i0 * d.ldo() + c, 4);
    }
    // keys past kend have zero weight for every row of the block (causal): nothing flows
    const int64_t kend = causal ? std::max<int64_t>(0, std::min(d.Tk, i0 + n + (d.Tk - d.Tq))) : d.Tk;
    __m512 dot = _mm512_setzero_ps();
    for (int64_t j = 0; j < kend; ++j) {
      const __m512 pj = _mm512_maskz_loadu_ps(rows, PT + j * d.Tq + i0);
      __m512 u = _mm512_setzero_ps();
      _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) u = _mm512_fmadd_ps(dot_[c], _mm512_set1_ps(v[j * d.ldkv() + c]), u);
      gate_acc = _mm512_fmadd_ps(u, pj, gate_acc);
      u = _mm512_mul_ps(u, _mm512_set1_ps(g));  // dL/dP
      dot = _mm512_fmadd_ps(u, pj, dot);
      _mm512_store_ps(ub + 16 * j, u);
      if (dp) {  // analyses only: scattered into the (Tq, Tk) layout
        const __mmask16 seen = _mm512_mask_cmp_ps_mask(rows, pj, _mm512_setzero_ps(), _CMP_GT_OQ);
        const __m512i at = _mm512_mullo_epi32(lane_idx, _mm512_set1_epi32(static_cast<int>(d.Tk)));
        float* base = dp + i0 * d.Tk + j;
        const __m512 old = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), seen, at, base, 4);
        _mm512_mask_i32scatter_ps(base, seen, at, _mm512_add_ps(old, u), 4);
      }
    }
    __m512 dqacc[DH];
    _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) dqacc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < kend; ++j) {
      const __m512 pj = _mm512_maskz_loadu_ps(rows, PT + j * d.Tq + i0);
      const __m512 ds = _mm512_mul_ps(pj, _mm512_sub_ps(_mm512_load_ps(ub + 16 * j), dot));
      const __m512 gp = _mm512_mul_ps(pj, _mm512_set1_ps(g));
      _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) {
        dqacc[c] = _mm512_fmadd_ps(ds, _mm512_set1_ps(k[j * d.ldkv() + c]), dqacc[c]);
        float* dkl = dk_lanes + (j * DH + c) * 16;
        float* dvl = dv_lanes + (j * DH + c) * 16;
        _mm512_store_ps(dkl, _mm512_fmadd_ps(ds, qt[c], _mm512_load_ps(dkl)));
        _mm512_store_ps(dvl, _mm512_fmadd_ps(gp, dot_[c], _mm512_load_ps(dvl)));
      }
    }
    if (dq) {
      _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) _mm512_store_ps(dqt + 16 * c, _mm512_mul_ps(dqacc[c], _mm512_set1_ps(scale)));
      for (int64_t l = 0; l < n; ++l)
        _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) dq[(i0 + l) * d.ldq() + c] += dqt[16 * c + l];
    }
  }
}

bool small_head_kernels(const AttnDims& d) { return (d.dh <= kSmallHeadMax || d.dh == 16) && d.Tk <= kSmallKeysMax; }
#endif

// Per-thread buffers a task of the sgemm path holds at once: a slice's Q, K, V and dO copied
// contiguous, K and V transposed, a block of weights and its gradient, the slice's dK, dV and dQ.
// (The small-head kernels use kScratchWeights.)
enum ScratchSlot {
  kScratchQ, kScratchK, kScratchV, kScratchDO, kScratchKT, kScratchVT, kScratchWeights, kScratchGrads, kScratchSums,
  kScratchSlots
};

// A per-thread buffer of at least n floats, 64-byte aligned, one per slot: it grows once, later
// steps allocate nothing.
float* thread_scratch(size_t n, ScratchSlot slot) {
  thread_local std::vector<float> bufs[kScratchSlots];
  std::vector<float>& buf = bufs[slot];
  if (buf.size() < n + 16) buf.resize(n + 16);
  const uintptr_t at = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - at % 64) % 64) / sizeof(float);
}

// A slice's (n, dh) rows: where they are (at stride ld), or a contiguous copy. A head is a block
// of columns whose rows are a whole row of q (or qkv) apart, 3 KB at M's shapes: read in place,
// a long slice's rows fall into a few sets of L1 and evict each other while a product walks
// them again for every block of output rows. Copied once per slice, they stay in L1.
struct Rows {
  const float* p;
  int64_t ld;
};
// Rows at stride ld to a contiguous (n, dh) block, and back.
void load_rows(float* to, const float* X, int64_t ld, int64_t n, int64_t dh) {
  for (int64_t r = 0; r < n; ++r)
#pragma omp simd
    for (int64_t c = 0; c < dh; ++c) to[r * dh + c] = X[r * ld + c];
}
void store_rows(float* to, int64_t ld, const float* X, int64_t n, int64_t dh) {
  for (int64_t r = 0; r < n; ++r)
#pragma omp simd
    for (int64_t c = 0; c < dh; ++c) to[r * ld + c] = X[r * dh + c];
}
Rows slice_rows(const float* X, int64_t ld, int64_t n, int64_t dh, bool copy, ScratchSlot slot) {
  if (!copy) return {X, ld};
  float* C = thread_scratch(static_cast<size_t>(n * dh), slot);
  load_rows(C, X, ld, n, dh);
  return {C, dh};
}

// Score-shaped products (rows, ke) = X (rows, dh) Y^T with Y (Tk, dh) the slice's keys (or values,
// in backward): with Y^T made once per slice, each query block's product is an NN one that
// small_gemm computes without packing (OpenBLAS packs both operands per call: at d_head 32,
// T = 128 about a third of attention's time). Null where OpenBLAS keeps the product (no AVX-512,
// or sizes small_gemm does not take).
const float* transposed(Rows Y, int64_t Tk, int64_t dh, ScratchSlot slot) {
#ifdef __AVX512F__
  if (Tk > 128 || dh > 128) return nullptr;
  float* YT = thread_scratch(static_cast<size_t>(dh * Tk), slot);  // (dh, Tk)
  for (int64_t c = 0; c < dh; ++c)
    for (int64_t j = 0; j < Tk; ++j) YT[c * Tk + j] = Y.p[j * Y.ld + c];
  return YT;
#else
  (void)Y, (void)Tk, (void)dh, (void)slot;
  return nullptr;
#endif
}

// What the sgemm path needs to make one slice's weights: the forward computes them and, when
// P is not kept, backward computes them again with the same calls on the same inputs (so the
// same bits).
struct SliceScores {
  const AttnDims* ds;  // the sequence's dims
  int64_t b, h;
  Rows Qh, Kh;      // Q_h (Tq, dh), K_h (Tk, dh)
  const float* KT;  // K_h^T (dh, Tk) or null
  int64_t dh;
  float scale;
  bool causal;
  const float *pad, *am;  // this sequence's key padding (Tk) and the additive mask, or null
  const MaskStrides* ms;
};

// W (i1 - i0, Tk) at stride Tk = the weights of query rows [i0, i1), which see keys [0, ke):
// softmax(scale Q_h[i0:i1] K_h[:ke]^T + masks), zeros from column ke on.
void block_weights(const SliceScores& s, int64_t i0, int64_t i1, int64_t ke, float* W) {
  const int64_t Tk = s.ds->Tk, rows = i1 - i0;
  const float* Qb = s.Qh.p + i0 * s.Qh.ld;
  if (s.KT) gemm(false, false, rows, ke, s.dh, s.scale, Qb, s.Qh.ld, s.KT, Tk, 0.f, W, Tk);
  else gemm(false, true, rows, ke, s.dh, s.scale, Qb, s.Qh.ld, s.Kh.p, s.Kh.ld, 0.f, W, Tk);
  for (int64_t i = i0; i < i1; ++i) masked_softmax_row(W + (i - i0) * Tk, ke, *s.ds, s.b, s.h, i, s.causal, s.pad, s.am, *s.ms);
}

}  // namespace

namespace {

// P as the small-head kernels keep it, each (batch, head) slice transposed to (Tk, Tq) and
// nothing stored for keys a causal row does not see, in the usual layout: (B, H, Tq, Tk).
Tensor transpose_slices(const Tensor& PT, bool causal) {
  const int64_t slices = PT.size(0) * PT.size(1), Tq = PT.size(2), Tk = PT.size(3);
  Tensor out = Tensor::empty(PT.shape());
  const float* in = PT.data();
  float* o = out.data();
  for (int64_t s = 0; s < slices; ++s)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j)
        o[s * Tq * Tk + i * Tk + j] = causal && j > i + (Tk - Tq) ? 0.f : in[s * Tq * Tk + j * Tq + i];
  return out;
}

// What backward needs of the less common arguments: where it reports dL/dP (the tensor and the
// callback) and the masks it applies again when it recomputes the weights. Held together so the
// backward closure stays small (one pointer); allocated only when backward reads them (a dL/dP
// sink, or recomputed weights under a mask), so a plain training step allocates nothing here.
struct BackwardExtras {
  Tensor pattern_grad;
  std::function<void(const Tensor&)> on_pattern_grad;
  Tensor key_padding, additive_mask;
  MaskStrides ms;
};
std::shared_ptr<BackwardExtras> backward_extras(const AttentionArgs& a, const MaskStrides& ms, bool recompute) {
  const bool masks = recompute && (a.key_padding.defined() || a.additive_mask.defined());
  if (!a.pattern_grad.defined() && !masks) return nullptr;
  return std::make_shared<BackwardExtras>(
      BackwardExtras{a.pattern_grad, a.on_pattern_grad, a.key_padding, a.additive_mask, ms});
}

// The op for both layouts: q, k, v are three tensors, or one packed tensor passed three times
// (then it is the only tensor parent and its gradient block receives dQ, dK and dV).
// starts_buffer: what d.starts points into (varlen), kept alive for backward.
Tensor attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, const AttnDims& d,
                      const AttentionArgs& a, Tensor* pattern, const Tensor& starts_buffer = Tensor()) {
  const bool packed = q.same(k);
  const float scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(d.dh));
  MaskStrides ms;
  if (a.additive_mask.defined()) ms = mask_strides(a.additive_mask, d);
  const float* am = a.additive_mask.defined() ? a.additive_mask.data() : nullptr;
  const float* pad = a.key_padding.defined() ? a.key_padding.data() : nullptr;
  const float* gates = a.gates.defined() ? a.gates.data() : nullptr;
  const bool causal = a.causal;
  const bool drop = a.dropout > 0.f;

#ifdef __AVX512F__
  const bool small_fwd = small_head_kernels(d) && !am && !drop;
  // the small-head backward up to d_head 8 (at 16 the sgemm path's is faster): then P holds
  // each slice transposed; else the forward transposes its weights into P's usual layout
  const bool small = small_fwd && d.dh <= kSmallHeadMax;
#else
  const bool small_fwd = false, small = false;
#endif
  const bool grad = needs_graph({&q, &k, &v, &a.gates});
  // P is kept only where something reads it after the forward. The small-head kernels' backward
  // does (evaluation does not). The sgemm path's backward computes each block's weights again
  // from Q and K (block_weights: the same calls, the same bits), unless `pattern`, a dL/dP sink
  // or dropout needs all of P: at M's shapes P is 17 MB a layer (M's peak 489 -> 426 MiB), and
  // computing the scores twice costs about what writing P out and reading it back did.
  // Recomputed weights repeat the forward's bits only where backward makes the same product calls
  // in the same threading context: the forward runs (batch, head) pairs and backward (batch, kv
  // head) pairs, each in one parallel region when there are two or more, else on the caller, where
  // gemm (and OpenBLAS) may split a product differently. (B = 1 with one kv head and several query
  // heads keeps P.)
  const bool same_context = (d.B * d.H >= 2) == (d.B * d.Hkv >= 2);
  const bool keep_weights = small_fwd ? grad || pattern
                                      : pattern || drop || a.pattern_grad.defined() ||
                                            (grad && (d.Tk < kLongSlice || !same_context));
  Tensor P = keep_weights ? Tensor::empty({d.B, d.H, d.Tq, d.Tk}) : Tensor();  // softmax output, saved for backward
  Tensor drop_mask, Pd = P;                                                     // Pd: weights after dropout
  if (drop) {  // drawn sequentially before the parallel loop: deterministic
    drop_mask = Tensor::empty(P.shape());
    Pd = Tensor::empty(P.shape());
    const float keep = 1.f / (1.f - a.dropout);
    float* M = drop_mask.data();
    for (int64_t i = 0, n = P.numel(); i < n; ++i) M[i] = a.rng->uniform() < a.dropout ? 0.f : keep;
  }
  Tensor out = d.starts ? Tensor::empty({d.starts[d.B], d.ldo()})  // (n, H*dh)
                                  : Tensor::empty({d.B, d.Tq, d.ldo()});
  const float *Q = q.data() + d.q_off, *K = k.data() + d.k_off, *V = v.data() + d.v_off;
  float *Pp = P.defined() ? P.data() : nullptr, *Pdp = Pd.defined() ? Pd.data() : nullptr, *O = out.data();
  const float* M = drop ? drop_mask.data() : nullptr;
  const int64_t TT = d.Tq * d.Tk, BR = block_rows(d, causal);

  parallel_for(d.B * d.H, d.B * d.H * TT * d.dh, [&](int64_t bh) {
    const int64_t b = bh / d.H, h = bh % d.H, kvh = h / d.group();
    const AttnDims ds = d.seq(b);  // this sequence's Tq, Tk (varlen) or d's
    if (ds.Tq == 0) return;
    const float* Qh = Q + d.q_row(b) * d.ldq() + h * d.dh;    // (Tq, dh), ld ldq
    const float* Kh = K + d.kv_row(b) * d.ldkv() + kvh * d.dh;  // (Tk, dh), ld ldkv
    const float* Vh = V + d.kv_row(b) * d.ldkv() + kvh * d.dh;
    float* S = Pp ? Pp + bh * TT : nullptr;                      // (Tq, Tk); null: weights not kept
    float* Oh = O + d.q_row(b) * d.ldo() + h * d.dh;             // (Tq, dh), ld H*dh
    const float g = gates ? gates[h] : 1.f;
    const float* pb = pad ? pad + b * d.Tk : nullptr;            // (Tk) this sequence's padding
#ifdef __AVX512F__
    if (small_fwd) {
      // d_head 16: the weights go through a transposed scratch (zeros where not stored) into S
      float* PT = !keep_weights ? nullptr : small ? S : thread_scratch(static_cast<size_t>(ds.Tq * ds.Tk), kScratchWeights);
      if (PT && !small) std::fill(PT, PT + ds.Tq * ds.Tk, 0.f);
      switch (d.dh) {
        case 1: small_head_forward<1>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        case 2: small_head_forward<2>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        case 3: small_head_forward<3>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        case 4: small_head_forward<4>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        case 5: small_head_forward<5>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        case 6: small_head_forward<6>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        case 7: small_head_forward<7>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        case 8: small_head_forward<8>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
        default: small_head_forward<16>(ds, causal, pb, scale, g, Qh, Kh, Vh, PT, Oh); break;
      }
      if (PT && !small)  // S (Tq, Tk) = PT^T
        for (int64_t i = 0; i < ds.Tq; ++i)
          for (int64_t j = 0; j < ds.Tk; ++j) S[i * ds.Tk + j] = PT[j * ds.Tq + i];
      return;
    }
#endif
    const int64_t BRs = d.starts ? block_rows(ds, causal) : BR;
    const bool copy = ds.Tk >= kLongSlice;
    const Rows Qs = slice_rows(Qh, d.ldq(), ds.Tq, d.dh, copy, kScratchQ);   // (Tq, dh)
    const Rows Ks = slice_rows(Kh, d.ldkv(), ds.Tk, d.dh, copy, kScratchK);  // (Tk, dh)
    const Rows Vs = slice_rows(Vh, d.ldkv(), ds.Tk, d.dh, copy, kScratchV);  // (Tk, dh)
    const float* KT = transposed(Ks, ds.Tk, d.dh, kScratchKT);               // (dh, Tk) or null
    const SliceScores sc{&ds, b, h, Qs, Ks, KT, d.dh, scale, causal, pb, am, &ms};
    // a block's weights go into P, or (P not kept) into a per-thread (BRs, Tk) block
    float* block = S ? nullptr : thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchWeights);
    for (int64_t i0 = 0; i0 < ds.Tq; i0 += BRs) {
      const int64_t i1 = std::min(ds.Tq, i0 + BRs), rows = i1 - i0, ke = visible_keys(ds, causal, i1);
      float* Wk = S ? S + i0 * ds.Tk : block;  // (rows, Tk)
      block_weights(sc, i0, i1, ke, Wk);
      const float* W = Wk;
      if (M) {
        float* SD = Pdp + bh * TT + i0 * ds.Tk;
        for (int64_t e = 0; e < rows * ds.Tk; ++e) SD[e] = W[e] * M[bh * TT + i0 * ds.Tk + e];
        W = SD;
      }
      if (ke > 0)  // out_h[i0:i1] = g P[:, :ke] V_h[:ke]
        gemm(false, false, rows, d.dh, ke, g, W, ds.Tk, Vs.p, Vs.ld, 0.f, Oh + i0 * d.ldo(), d.ldo());
      else
        for (int64_t i = i0; i < i1; ++i) std::fill(Oh + i * d.ldo(), Oh + i * d.ldo() + d.dh, 0.f);
    }
  });
  if (pattern) *pattern = small ? transpose_slices(P, causal) : P.detach();

  if (grad)
    attach(out, "attention", {q, packed ? Tensor() : k, packed ? Tensor() : v, a.gates},
           [q, k, v, gates = a.gates, P, Pd, drop_mask, extras = backward_extras(a, ms, !keep_weights), d, starts_buffer, scale, causal,
            small](TensorImpl& self) {
             HL_PROFILE(Attention);
             const float *dO = self.grad->data(), *Q = q.data() + d.q_off, *K = k.data() + d.k_off,
                         *V = v.data() + d.v_off;
             // P not kept (the sgemm path in training): each block's weights are computed again
             const bool recompute = !P.defined();
             const float *Pp = recompute ? nullptr : P.data(), *Pdp = recompute ? nullptr : Pd.data();
             const float* pad = extras && extras->key_padding.defined() ? extras->key_padding.data() : nullptr;
             const float* am = extras && extras->additive_mask.defined() ? extras->additive_mask.data() : nullptr;
             const MaskStrides ms = extras ? extras->ms : MaskStrides();
             const float* M = drop_mask.defined() ? drop_mask.data() : nullptr;
             const float* G = gates.defined() ? gates.data() : nullptr;
             // Fresh gradient buffers are not zeroed here: each parallel task zeroes the blocks it
             // accumulates into (in cache, on its own thread). Packed: one buffer, fresh or not.
             bool fresh_q, fresh_k, fresh_v;
             float* dQ = grad_buffer_for_overwrite(q, fresh_q);
             float* dK = grad_buffer_for_overwrite(k, fresh_k);
             float* dV = grad_buffer_for_overwrite(v, fresh_v);
             if (q.same(k)) fresh_k = fresh_v = fresh_q;
             if (dQ) dQ += d.q_off;
             if (dK) dK += d.k_off;
             if (dV) dV += d.v_off;
             const bool grads_alias = (dQ && (dQ == dK || dQ == dV)) || (dK && dK == dV);
             float* dG = grad_buffer(gates);
             float* dPout = extras && extras->pattern_grad.defined() ? extras->pattern_grad.data() : nullptr;
             const int64_t TT = d.Tq * d.Tk, BR = block_rows(d, causal);
             Tensor work = small || recompute ? Tensor() : Tensor::empty({d.B, d.H, d.Tq, d.Tk});  // dL/dP, then dL/dS
             Tensor gate_part = Tensor::zeros({d.B, d.H});                           // per (b,h) dL/dg
             float *U = work.defined() ? work.data() : nullptr, *GP = gate_part.data();
             // Parallel over (batch, kv head): query heads sharing a kv head run in order,
             // so dK and dV rows are never written by two threads.
             parallel_for(d.B * d.Hkv, d.B * d.H * TT * d.dh, [&](int64_t bk) {
               const int64_t b = bk / d.Hkv, kvh = bk % d.Hkv;
               const AttnDims ds = d.seq(b);  // this sequence's Tq, Tk, kv_rows (varlen) or d's
               if (ds.Tq == 0) return;
               const float* Kh = K + d.kv_row(b) * d.ldkv() + kvh * d.dh;
               const float* Vh = V + d.kv_row(b) * d.ldkv() + kvh * d.dh;
               float* dKh = dK ? dK + d.kv_row(b) * d.ldkv() + kvh * d.dh : nullptr;
               float* dVh = dV ? dV + d.kv_row(b) * d.ldkv() + kvh * d.dh : nullptr;
               auto zero_block = [&](float* base, int64_t rows, int64_t ld) {  // (rows, dh) at ld
                 for (int64_t r = 0; r < rows; ++r) std::fill(base + r * ld, base + r * ld + d.dh, 0.f);
               };
#ifdef __AVX512F__
               if (small) {
                 if (dKh && fresh_k) zero_block(dKh, ds.kv_rows, d.ldkv());
                 if (dVh && fresh_v) zero_block(dVh, ds.kv_rows, d.ldkv());
                 for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h)
                   if (dQ && fresh_q) zero_block(dQ + d.q_row(b) * d.ldq() + h * d.dh, ds.Tq, d.ldq());
                 const int64_t KS = ds.Tk * d.dh * 16;
                 float* dk_lanes = thread_scratch(static_cast<size_t>(2 * KS), kScratchWeights);  // (Tk, dh, 16) each
                 float* dv_lanes = dk_lanes + KS;
                 std::fill(dk_lanes, dk_lanes + 2 * KS, 0.f);
                 for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
                   const int64_t bh = b * d.H + h;
                   const float g = G ? G[h] : 1.f;
                   __m512 gate_acc = _mm512_setzero_ps();
                   const float *PT = Pp + bh * TT, *Qh = Q + d.q_row(b) * d.ldq() + h * d.dh,
                               *dOh = dO + d.q_row(b) * d.ldo() + h * d.dh;
                   float* dQh = dQ ? dQ + d.q_row(b) * d.ldq() + h * d.dh : nullptr;
                   float* dPh = dPout ? dPout + bh * TT : nullptr;
                   switch (d.dh) {
                     case 1: small_head_backward<1>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                     case 2: small_head_backward<2>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                     case 3: small_head_backward<3>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                     case 4: small_head_backward<4>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                     case 5: small_head_backward<5>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                     case 6: small_head_backward<6>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                     case 7: small_head_backward<7>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                     default: small_head_backward<8>(ds, causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
                   }
                   if (dG) GP[bh] = _mm512_reduce_add_ps(gate_acc);
                 }
                 for (int64_t j = 0; j < ds.Tk; ++j)  // dK_h, dV_h += the lanes' sums
                   for (int64_t c = 0; c < d.dh; ++c) {
                     const int64_t at = (j * d.dh + c) * 16;
                     if (dKh) dKh[j * d.ldkv() + c] += scale * _mm512_reduce_add_ps(_mm512_load_ps(dk_lanes + at));
                     if (dVh) dVh[j * d.ldkv() + c] += _mm512_reduce_add_ps(_mm512_load_ps(dv_lanes + at));
                   }
                 return;
               }
#endif
               const bool copy = ds.Tk >= kLongSlice;
               const Rows Ks = slice_rows(Kh, d.ldkv(), ds.Tk, d.dh, copy, kScratchK);  // (Tk, dh)
               const Rows Vs = slice_rows(Vh, d.ldkv(), ds.Tk, d.dh, copy, kScratchV);  // (Tk, dh)
               const float* VT = transposed(Vs, ds.Tk, d.dh, kScratchVT);               // (dh, Tk) or null
               const float* KT = recompute ? transposed(Ks, ds.Tk, d.dh, kScratchKT) : nullptr;
               const int64_t BRs = d.starts ? block_rows(ds, causal) : BR;
               // recomputed: a block's weights and dL/dP, then dL/dS, in per-thread (BRs, Tk) blocks
               float* w_block = recompute ? thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchWeights) : nullptr;
               float* u_block = recompute ? thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchGrads) : nullptr;
               const float* pb = pad ? pad + b * d.Tk : nullptr;
               // dK_h, dV_h and dQ_h (rows, dh) are summed where they are or, for a long slice, in
               // contiguous per-thread blocks read from the gradient and written back once (their rows
               // are a row of qkv apart, as Q's). Into a fresh gradient nothing is read: the sums start
               // at 0 (rows past Tk, a KV-cache buffer's unfilled ones, get gradient 0). Where two of
               // q, k, v are one tensor (attention(x, x, x)) their gradients are one block, summed in
               // place.
               struct Sums {
                 float* p;  // where the products add
                 int64_t ld;
               };
               const bool sum_in_blocks = copy && !grads_alias;
               float* blocks = sum_in_blocks ? thread_scratch(static_cast<size_t>((2 * ds.Tk + ds.Tq) * d.dh), kScratchSums) : nullptr;
               auto start_sums = [&](float* grad, int64_t ld, int64_t n, int64_t rows, bool fresh, int64_t at) {
                 if (!grad) return Sums{nullptr, 0};
                 if (fresh) zero_block(grad + (sum_in_blocks ? n : 0) * ld, sum_in_blocks ? rows - n : rows, ld);
                 if (!sum_in_blocks) return Sums{grad, ld};
                 float* sum = blocks + at;
                 if (fresh) std::fill(sum, sum + n * d.dh, 0.f);
                 else load_rows(sum, grad, ld, n, d.dh);
                 return Sums{sum, d.dh};
               };
               auto finish_sums = [&](float* grad, int64_t ld, int64_t n, Sums sums) {
                 if (grad && sum_in_blocks) store_rows(grad, ld, sums.p, n, d.dh);
               };
               const Sums dKs = start_sums(dKh, d.ldkv(), ds.Tk, ds.kv_rows, fresh_k, 0);
               const Sums dVs = start_sums(dVh, d.ldkv(), ds.Tk, ds.kv_rows, fresh_v, ds.Tk * d.dh);
               for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
                 const int64_t bh = b * d.H + h;
                 const Rows Qs = slice_rows(Q + d.q_row(b) * d.ldq() + h * d.dh, d.ldq(), ds.Tq, d.dh, copy, kScratchQ);
                 const Rows dOs = slice_rows(dO + d.q_row(b) * d.ldo() + h * d.dh, d.ldo(), ds.Tq, d.dh, copy, kScratchDO);
                 float* dQh = dQ ? dQ + d.q_row(b) * d.ldq() + h * d.dh : nullptr;
                 const Sums dQs = start_sums(dQh, d.ldq(), ds.Tq, ds.Tq, fresh_q, 2 * ds.Tk * d.dh);
                 const float g = G ? G[h] : 1.f;
                 double gate_sum = 0;
                 const SliceScores sc{&ds, b, h, Qs, Ks, KT, d.dh, scale, causal, pb, am, &ms};
                 for (int64_t i0 = 0; i0 < ds.Tq; i0 += BRs) {
                   const int64_t i1 = std::min(ds.Tq, i0 + BRs), rows = i1 - i0, ke = visible_keys(ds, causal, i1);
                   if (ke == 0) continue;  // fully masked rows: no gradient flows
                   const float *Pb, *Wb;  // (rows, Tk) weights, and after dropout
                   float* Ub;
                   if (recompute) {
                     block_weights(sc, i0, i1, ke, w_block);
                     Pb = Wb = w_block;
                     Ub = u_block;
                   } else {
                     Pb = Pp + bh * TT + i0 * ds.Tk;
                     Wb = Pdp + bh * TT + i0 * ds.Tk;
                     Ub = U + bh * TT + i0 * ds.Tk;
                   }
                   const float* dOb = dOs.p + i0 * dOs.ld;
                   // Ub = dO_h V_h^T (rows, ke): dL/d(weights) before the gate
                   if (VT) gemm(false, false, rows, ke, d.dh, 1.f, dOb, dOs.ld, VT, ds.Tk, 0.f, Ub, ds.Tk);
                   else gemm(false, true, rows, ke, d.dh, 1.f, dOb, dOs.ld, Vs.p, Vs.ld, 0.f, Ub, ds.Tk);
                   if (dVs.p)  // dV_h[:ke] += g Pd^T dO_h
                     gemm(true, false, ke, d.dh, rows, g, Wb, ds.Tk, dOb, dOs.ld, 1.f, dVs.p, dVs.ld);
                   for (int64_t r = 0; r < rows; ++r) {
                     float* u = Ub + r * ds.Tk;
                     const float *p = Pb + r * ds.Tk, *w = Wb + r * ds.Tk;
                     if (dG)
                       for (int64_t j = 0; j < ke; ++j) gate_sum += static_cast<double>(u[j]) * w[j];
                     // dL/dP = g U (times the dropout mask); reported as 0 where masked
                     if (M) {
                       const float* m = M + bh * TT + (i0 + r) * ds.Tk;
                       for (int64_t j = 0; j < ke; ++j) u[j] *= g * m[j];
                     } else if (g != 1.f) {
#pragma omp simd
                       for (int64_t j = 0; j < ke; ++j) u[j] *= g;
                     }
                     if (dPout) {
                       float* dp = dPout + bh * TT + (i0 + r) * ds.Tk;
                       for (int64_t j = 0; j < ke; ++j) dp[j] += p[j] > 0.f ? u[j] : 0.f;
                     }
                     // softmax backward from the saved output: dS = P (dP - rowsum(dP P))
                     const float dot = dot_lanes(u, p, ke);
#pragma omp simd
                     for (int64_t j = 0; j < ke; ++j) u[j] = p[j] * (u[j] - dot);
                   }
                   if (dQs.p)  // dQ_h[i0:i1] += scale dS K_h[:ke]
                     gemm(false, false, rows, d.dh, ke, scale, Ub, ds.Tk, Ks.p, Ks.ld, 1.f, dQs.p + i0 * dQs.ld, dQs.ld);
                   if (dKs.p)  // dK_h[:ke] += scale dS^T Q_h[i0:i1]
                     gemm(true, false, ke, d.dh, rows, scale, Ub, ds.Tk, Qs.p + i0 * Qs.ld, Qs.ld, 1.f, dKs.p, dKs.ld);
                 }
                 finish_sums(dQh, d.ldq(), ds.Tq, dQs);
                 if (dG) GP[bh] = static_cast<float>(gate_sum);
               }
               finish_sums(dKh, d.ldkv(), ds.Tk, dKs);
               finish_sums(dVh, d.ldkv(), ds.Tk, dVs);
             });
             if (dG)  // fixed-order reduction over the batch
               for (int64_t h = 0; h < d.H; ++h)
                 for (int64_t b = 0; b < d.B; ++b) dG[h] += GP[b * d.H + h];
             if (dPout && extras->on_pattern_grad) extras->on_pattern_grad(extras->pattern_grad);
           });
  return out;
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a,
                 Tensor* pattern) {
  HL_PROFILE(Attention);
  return attention_impl(q, k, v, check_attention(q, k, v, a), a, pattern);
}

Tensor attention_varlen(const Tensor& qkv, std::span<const int32_t> len, const AttentionArgs& a) {
  HL_PROFILE(Attention);
  AttnDims d = packed_columns(qkv, a, 2, "packed sequences", "(rows, (heads + 2 kv_heads) d_head)");
  if (a.kv_len || a.pattern_grad.defined() || a.on_pattern_grad || a.additive_mask.defined())
    fail("attention: packed sequences take no kv_len or additive mask and give no pattern gradient");
  d.B = static_cast<int64_t>(len.size());
  const Tensor starts_buffer = Tensor::empty({d.B + 1});
  int32_t* starts = reinterpret_cast<int32_t*>(starts_buffer.data());
  d.starts = starts;
  int64_t rows = 0, longest = 0;
  for (int64_t b = 0; b < d.B; ++b) {
    if (len[static_cast<size_t>(b)] < 0) fail("attention: sequence length ", len[static_cast<size_t>(b)], " < 0");
    starts[b] = static_cast<int32_t>(rows);
    rows += len[static_cast<size_t>(b)];
    longest = std::max<int64_t>(longest, len[static_cast<size_t>(b)]);
  }
  starts[d.B] = static_cast<int32_t>(rows);
  if (rows != qkv.size(0)) fail("attention: sequence lengths add up to ", rows, ", qkv has ", qkv.size(0), " rows");
  d.Tq = d.Tk = d.kv_rows = longest;
  check_attention_args(d, a);
  return attention_impl(qkv, qkv, qkv, d, a, nullptr, starts_buffer);
}

Tensor attention_packed(const Tensor& qkv, const AttentionArgs& a, Tensor* pattern) {
  HL_PROFILE(Attention);
  return attention_impl(qkv, qkv, qkv, check_attention_packed(qkv, a), a, pattern);
}

std::pair<Tensor, Tensor> scaled_dot_product_attention(const Tensor& q, const Tensor& k,
                                                       const Tensor& v, int n_heads, bool causal,
                                                       const Tensor& additive_mask) {
  const bool unbatched = q.ndim() == 2;
  auto batched = [&](const Tensor& t) { return unbatched ? reshape(t, {1, t.size(0), t.size(1)}) : t; };
  AttentionArgs a;
  a.n_heads = n_heads;
  a.causal = causal;
  a.additive_mask = additive_mask;
  if (n_heads < 1 || q.size(-1) % n_heads)
    fail("scaled_dot_product_attention: width ", q.size(-1), " of q ", q.shape().str(),
         " is not divisible by ", n_heads, " heads");
  Tensor pattern;
  Tensor out = attention(batched(q), batched(k), batched(v), a, &pattern);
  if (unbatched) out = reshape(out, {out.size(1), out.size(2)});
  return {out, pattern};
}

void AttentionConfig::validate() const {
  if (d_model < 1) fail("attention: d_model must be positive, got ", d_model);
  if (n_heads < 1) fail("attention: n_heads must be positive, got ", n_heads);
  if (n_kv_heads < 0) fail("attention: n_kv_heads must be positive, got ", n_kv_heads);
  if (kv_heads() > n_heads || n_heads % kv_heads())
    fail("attention: n_kv_heads ", kv_heads(), " must divide n_heads ", n_heads);
  if (d_head < 0) fail("attention: d_head must be positive, got ", d_head);
  if (!d_head && d_model % n_heads)
    fail("attention: n_heads ", n_heads, " does not divide d_model ", d_model,
         " (give d_head explicitly to use any head size)");
  if (!(dropout >= 0.f && dropout < 1.f)) fail("attention: dropout must be in [0, 1), got ", dropout);
}

MultiHeadAttention::MultiHeadAttention(const AttentionConfig& c, Rng& rng, Rng* dropout_rng)
    : cfg((c.validate(), c)),
      W_Q(c.d_model, c.n_heads * c.head_dim(), c.bias, rng),
      W_K(c.d_model, c.kv_heads() * c.head_dim(), c.bias, rng),
      W_V(c.d_model, c.kv_heads() * c.head_dim(), c.bias, rng),
      W_O(c.n_heads * c.head_dim(), c.d_model, c.bias, rng),
      gates(Tensor::ones({c.n_heads})),
      dropout_rng_(dropout_rng) {
  register_module("W_Q", &W_Q);
  register_module("W_K", &W_K);
  register_module("W_V", &W_V);
  register_module("W_O", &W_O);
  // Move the initialised W_Q, W_K, W_V (and biases) into one slab each, as views.
  auto into_slab = [](std::initializer_list<Tensor*> parts) {
    int64_t total = 0;
    for (Tensor* t : parts) total += t->numel();
    Tensor slab = Tensor::empty({total});
    int64_t at = 0;
    for (Tensor* t : parts) {
      Tensor view = storage_view(slab, at, t->shape());
      view.copy_from(*t);
      view.requires_grad_(true);
      *t = view;
      at += view.numel();
    }
  };
  into_slab({&W_Q.weight, &W_K.weight, &W_V.weight});
  if (c.bias) into_slab({&W_Q.bias, &W_K.bias, &W_V.bias});
}

namespace {

// Unfused pieces of attention, from differentiable primitive ops, for hooks that replace the
// scores or the pattern (the fused op computes them in place and cannot take a replacement).
// Heads of k/v (B, Tk, Hkv*dh) as (B, H, Tk, dh), each query head reading its kv head.
Tensor kv_heads_for_queries(const Tensor& t, int64_t Tk, int H, int Hkv, int64_t dh) {
  const int64_t B = t.size(0);
  const Tensor rows = t.size(1) == Tk ? t : slice(t, 1, 0, Tk);  // a KV-cache buffer has spare rows
  Tensor th = permute(reshape(rows, {B, Tk, Hkv, dh}), {0, 2, 1, 3});  // (B, Hkv, Tk, dh)
  if (Hkv == H) return th;
  std::vector<Tensor> per_head;
  for (int h = 0; h < H; ++h) per_head.push_back(slice(th, 1, h / (H / Hkv), h / (H / Hkv) + 1));
  return concat(per_head, 1);  // (B, H, Tk, dh)
}

// Scaled, masked scores (B, H, Tq, Tk): masked keys are -inf (weight 0 after softmax).
Tensor attention_scores(const Tensor& q, const Tensor& k, const AttentionArgs& a, int64_t Tk) {
  const int64_t B = q.size(0), Tq = q.size(1), H = a.n_heads, dh = a.d_head;
  const Tensor qh = permute(reshape(q, {B, Tq, H, dh}), {0, 2, 1, 3});  // (B, H, Tq, dh)
  const float scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(dh));
  Tensor s = mul_scalar(matmul(qh, kv_heads_for_queries(k, Tk, a.n_heads, a.n_kv_heads, dh), false, true), scale);
  if (a.additive_mask.defined()) s = add(s, a.additive_mask);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (a.causal) {
    Tensor m = Tensor::zeros({Tq, Tk});
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = i + (Tk - Tq) + 1; j < Tk; ++j) m.at({i, j}) = 1.f;
    s = masked_fill(s, m, neg_inf);
  }
  if (a.key_padding.defined()) s = masked_fill(s, reshape(a.key_padding, {B, 1, 1, Tk}), neg_inf);
  return s;
}

// dL/dS (B, H, Tq, Tk) of S -> softmax(S) = P from dL/dP: P (dP - rowsum(dP P)), rows in double.
Tensor softmax_backward(const Tensor& P, const Tensor& dP) {
  Tensor dS = Tensor::empty(P.shape());
  const int64_t n = P.size(-1), rows = P.numel() / n;
  const float *p = P.data(), *g = dP.data();
  float* o = dS.data();
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(g[r * n + j]) * p[r * n + j];
    for (int64_t j = 0; j < n; ++j) o[r * n + j] = static_cast<float>(p[r * n + j] * (g[r * n + j] - dot));
  }
  return dS;
}

// Head outputs z (B, Tq, H*dh) = g_h P_h V_h from a pattern P (B, H, Tq, Tk).
Tensor attention_from_pattern(const Tensor& P, const Tensor& v, const AttentionArgs& a) {
  const int64_t B = P.size(0), H = P.size(1), Tq = P.size(2), Tk = P.size(3), dh = a.d_head;
  Tensor zh = matmul(P, kv_heads_for_queries(v, Tk, a.n_heads, a.n_kv_heads, dh));  // (B, H, Tq, dh)
  if (a.gates.defined()) zh = mul(zh, reshape(a.gates, {1, H, 1, 1}));
  return reshape(permute(zh, {0, 2, 1, 3}), {B, Tq, H * dh});
}

}  // namespace

AttentionArgs MultiHeadAttention::args_for(const Call& call, int64_t kv_len) const {
  AttentionArgs a;
  a.n_heads = cfg.n_heads;
  a.n_kv_heads = cfg.kv_heads();
  a.d_head = static_cast<int>(cfg.head_dim());
  a.causal = call.causal;
  a.additive_mask = call.additive_mask;
  a.key_padding = call.key_padding;
  a.gates = gates;
  a.dropout = training() ? cfg.dropout : 0.f;
  a.rng = dropout_rng_;
  a.kv_len = kv_len;
  return a;
}

Tensor MultiHeadAttention::forward(const Tensor& x_q, const Tensor& x_kv_in, const Call& call) {
  const Hooks* hk = call.hooks;
  const std::string& pre = call.hook_prefix;
  auto hooked = [&](const char* n) { return hk && hk->any(pre + n); };
  const int H = cfg.n_heads, Hkv = cfg.kv_heads();
  const int64_t dh = cfg.head_dim();
  // A hook sees (B, T, heads, d_head); a replacement goes back to (B, T, heads*d_head).
  auto hook_heads = [&](const char* n, const Tensor& t, int heads) {
    if (!hooked(n)) return t;
    const Tensor view = reshape(t, {t.size(0), t.size(1), heads, dh});
    const Tensor r = hk->apply(pre + n, view);
    return r.same(view) ? t : reshape(r, t.shape());
  };
  if (!call.live_len.empty()) {  // x_q (n, d_model): sequences packed back to back
    if (x_kv_in.defined() || call.kv_cache || hk) fail("attention: packed sequences are for self-attention without hooks or cache");
    const Tensor ws[3] = {W_Q.weight, W_K.weight, W_V.weight}, bs[3] = {W_Q.bias, W_K.bias, W_V.bias};
    const Tensor qkv = linear_stacked(x_q, ws, bs);  // (n, (H + 2 Hkv) dh)
    const Tensor z = attention_varlen(qkv, call.live_len, args_for(call, 0));  // (n, H*dh)
    return W_O.forward(call.output_rows ? gather_rows(z, *call.output_rows) : z);  // (n or output rows, d_model)
  }
  // Self-attention: one projection and one packed attention, no copies (the fast path). Only a
  // hook that replaces (or needs the gradient of) q, k or v splits them.
  const bool packed = !x_kv_in.defined() && !call.kv_cache;
  const Tensor& x_kv = x_kv_in.defined() ? x_kv_in : x_q;
  Tensor q, k, v, qkv;
  auto split_packed = [&] {  // q, k, v as tensors of their own (copies), e.g. for the scores
    if (q.defined()) return;
    std::vector<Tensor> parts = split(qkv, {H * dh, Hkv * dh, Hkv * dh}, 2);
    q = parts[0], k = parts[1], v = parts[2];
  };
  if (packed) {
    const Tensor ws[3] = {W_Q.weight, W_K.weight, W_V.weight}, bs[3] = {W_Q.bias, W_K.bias, W_V.bias};
    qkv = linear_stacked(x_q, ws, bs);  // (B, T, (H + 2 Hkv) dh)
    if (hooked("hook_q") || hooked("hook_k") || hooked("hook_v")) {
      split_packed();
      const Tensor q2 = hook_heads("hook_q", q, H), k2 = hook_heads("hook_k", k, Hkv), v2 = hook_heads("hook_v", v, Hkv);
      if (!q2.same(q) || !k2.same(k) || !v2.same(v)) qkv = concat({q2, k2, v2}, 2);
      q = q2, k = k2, v = v2;
    }
  } else {
    q = hook_heads("hook_q", W_Q.forward(x_q), H);    // (B, Tq, H*dh)
    k = hook_heads("hook_k", W_K.forward(x_kv), Hkv);  // (B, Tk, Hkv*dh)
    v = hook_heads("hook_v", W_V.forward(x_kv), Hkv);
  }
  int64_t kv_len = 0;
  if (call.kv_cache) {  // append this call's rows to the cache buffers, attend to all of them
    KVCacheLayer& c = *call.kv_cache;
    const int64_t B = k.size(0), T = k.size(1), W = k.size(2), need = c.len + T;
    if (!c.k.defined() || c.k.size(0) != B || c.k.size(1) < need) {
      const int64_t cap = std::max(need, c.capacity);
      Tensor nk = Tensor::zeros({B, cap, W}), nv = Tensor::zeros({B, cap, W});
      for (int64_t b = 0; b < B && c.len > 0; ++b) {
        std::memcpy(nk.data() + b * cap * W, c.k.data() + b * c.k.size(1) * W, sizeof(float) * c.len * W);
        std::memcpy(nv.data() + b * cap * W, c.v.data() + b * c.v.size(1) * W, sizeof(float) * c.len * W);
      }
      c.k = nk;
      c.v = nv;
    }
    const int64_t cap = c.k.size(1);
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(c.k.data() + (b * cap + c.len) * W, k.data() + b * T * W, sizeof(float) * T * W);
      std::memcpy(c.v.data() + (b * cap + c.len) * W, v.data() + b * T * W, sizeof(float) * T * W);
    }
    c.len = need;
    kv_len = need;
    k = c.k;
    v = c.v;
  }
  AttentionArgs a = args_for(call, kv_len);
  const int64_t B = x_q.size(0), Tq = x_q.size(1), Tk = kv_len ? kv_len : (packed ? Tq : k.size(1));

  // Scores and pattern. The fused op hands out the pattern for reading and, in backward, dL/dP
  // (from which dL/dS follows) for backward hooks; only a hook that replaces the scores or the
  // pattern takes the unfused path from there on.
  const std::string scores_name = hk ? pre + "hook_attn_scores" : std::string(),  // no strings
                    pattern_name = hk ? pre + "hook_pattern" : std::string();      // without hooks
  Tensor z, P;
  if (hk && hk->has_forward(scores_name)) {  // recomputed beside the fused kernel for the hook
    split_packed();
    const Tensor S = attention_scores(q, k, a, Tk);
    const Tensor S2 = hk->apply(scores_name, S, /*tap_for_backward=*/false);
    if (!S2.same(S)) P = softmax(hk->tapped(scores_name, S2), -1);  // masked keys: -inf, weight 0
  }
  if (P.defined()) {  // unfused from the scores on
    if (hooked("hook_pattern")) P = hk->apply(pattern_name, P);
    if (a.dropout > 0.f) P = dropout(P, a.dropout, *a.rng, true);
    z = attention_from_pattern(P, v, a);
  } else {
    const bool pattern_hooked = hooked("hook_pattern");
    const bool grads_wanted = hk && grad_enabled() && (hk->has_backward(pattern_name) || hk->has_backward(scores_name));
    // the fused op's P, shared with the backward hook of the scores (allocated only for hooks)
    auto pattern = pattern_hooked || grads_wanted ? std::make_shared<Tensor>() : nullptr;
    if (grads_wanted) {
      a.pattern_grad = Tensor::zeros({B, H, Tq, Tk});
      a.on_pattern_grad = [hooks = *hk, pattern_name, scores_name, pattern](const Tensor& dP) {
        if (hooks.has_backward(pattern_name)) hooks.backward_at(pattern_name, dP);
        if (hooks.has_backward(scores_name)) hooks.backward_at(scores_name, softmax_backward(*pattern, dP));
      };
    }
    const bool want_pattern = pattern_hooked || grads_wanted;
    z = packed ? attention_packed(qkv, a, want_pattern ? pattern.get() : nullptr)  // qkv holds any replacement
               : attention(q, k, v, a, want_pattern ? pattern.get() : nullptr);
    if (pattern_hooked) {
      const Tensor P2 = hk->apply(pattern_name, *pattern, /*tap_for_backward=*/false);  // detached
      if (!P2.same(*pattern)) {
        split_packed();
        z = attention_from_pattern(hk->tapped(pattern_name, P2), v, a);  // the replacement decides the output
      }
    }
  }
  z = hook_heads("hook_z", z, H);  // (B, Tq, H*dh)
  if (hooked("hook_result")) {
    const std::string result_name = pre + "hook_result";
    Tensor result;  // (B, Tq, H, d_model): each head's z_h W_O[:, h]^T; their sum (+ bias) is the output
    if (hk->has_forward(result_name)) {
      std::vector<Tensor> per_head;
      for (int h = 0; h < H; ++h) {
        const Tensor zh = slice(z, 2, h * dh, (h + 1) * dh), wh = slice(W_O.weight, 1, h * dh, (h + 1) * dh);
        per_head.push_back(reshape(matmul(zh, wh, false, true), {B, Tq, 1, cfg.d_model}));
      }
      result = concat(per_head, 2);
      const Tensor r2 = hk->apply(result_name, result, /*tap_for_backward=*/false);
      if (!r2.same(result)) {
        const Tensor out = sum(hk->tapped(result_name, r2), {2});
        return W_O.bias.defined() ? add(out, W_O.bias) : out;
      }
    }
    // Not replaced: the output keeps the fused path. dL/d(result_h) is dL/d(output) for every h.
    if (hk->has_backward(result_name) && grad_enabled()) {
      const Hooks hooks = *hk;
      const int heads = H;
      return tap(W_O.forward(z), [hooks, result_name, heads](const Tensor& g) {  // g (B, Tq, d_model)
        const int64_t rows = g.numel() / g.size(-1), D = g.size(-1);
        Tensor per_head = Tensor::empty({g.size(0), g.size(1), heads, D});
        for (int64_t r = 0; r < rows; ++r)
          for (int h = 0; h < heads; ++h) std::copy(g.data() + r * D, g.data() + (r + 1) * D, per_head.data() + (r * heads + h) * D);
        hooks.backward_at(result_name, per_head);
      });
    }
  }
  return W_O.forward(z);
}

}  // namespace hl
