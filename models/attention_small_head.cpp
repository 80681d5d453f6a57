// The small-head path of the fused attention op: AVX-512 kernels for d_head <= 8.
//
// At d_head <= 8 a (batch, head) slice is a 33 x 33 product of rank 2-8. Along a row of keys
// that is too little work for the row's softmax reductions (max, sum, dot: horizontal, with
// long latency chains) and far too little for six sgemm calls per slice. These kernels put 16
// query rows in the 16 lanes of a register and walk the keys one at a time: every reduction of
// the softmax and its backward is then a plain vertical add or max. The slice's weights are kept
// transposed, (Tk, Tq), in P's storage; `pattern` gets them in the usual layout. Used with the
// causal mask and key padding, not with an additive mask or attention dropout.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lib/fastmath.h"
#include "models/attention_kernels.h"

namespace hl::attn {

#ifdef __AVX512F__
namespace {

// Up to d_head 8 forward and backward; the forward also at d_head 16 (the S model's heads),
// whose backward with these kernels was slower than the sgemm path's (the per-lane dK, dV sums
// grow with d_head), so it keeps that one.
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
    // back as zeros by small_head_pattern, never read by the backward)
    const int64_t kend = causal ? std::max<int64_t>(0, std::min(d.Tk, i0 + n + (d.Tk - d.Tq))) : d.Tk;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < kend; ++j) {
      __m512 sj = _mm512_setzero_ps();
      _Pragma("GCC unroll 16") for (int64_t c = 0; c < DH; ++c) sj = _mm512_fmadd_ps(qt[c], _mm512_set1_ps(k[j * d.ldkv() + c]), sj);
      __mmask16 vis = pad && pad[j] != 0.f ? __mmask16(0) : rows;
      if (causal) vis &= _mm512_cmp_epi32_mask(_mm512_set1_epi32(static_cast<int>(j)), lane_last, _MM_CMPINT_LE);
      if (d.window > 0)  // a sliding window: lane l sees keys j > its last - window
        vis &= _mm512_cmp_epi32_mask(_mm512_set1_epi32(static_cast<int>(j)),
                                     _mm512_sub_epi32(lane_last, _mm512_set1_epi32(static_cast<int>(d.window))), _MM_CMPINT_NLE);
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

}  // namespace

bool small_head_takes_forward(const AttnDims& d) { return (d.dh <= kSmallHeadMax || d.dh == 16) && d.Tk <= kSmallKeysMax; }
bool small_head_takes_backward(const AttnDims& d) { return small_head_takes_forward(d) && d.dh <= kSmallHeadMax; }

void small_head_forward(const ForwardOperands& f, const ForwardOperands::Slice& s, bool transposed_P) {
  const AttnDims& ds = s.ds;
  const bool causal = f.causal;
  const float scale = f.scale, g = s.g, *pb = s.pad, *Qh = s.Qh, *Kh = s.Kh, *Vh = s.Vh;
  float *S = s.S, *Oh = s.Oh;
  // d_head 16: the weights go through a transposed scratch (zeros where not stored) into S
  float* PT = !S ? nullptr : transposed_P ? S : thread_scratch(static_cast<size_t>(ds.Tq * ds.Tk), kScratchWeights);
  if (PT && !transposed_P) std::fill(PT, PT + ds.Tq * ds.Tk, 0.f);
  switch (ds.dh) {
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
  if (PT && !transposed_P)  // S (Tq, Tk) = PT^T
    for (int64_t i = 0; i < ds.Tq; ++i)
      for (int64_t j = 0; j < ds.Tk; ++j) S[i * ds.Tk + j] = PT[j * ds.Tq + i];
}

void small_head_backward(const BackwardOperands& t, const BackwardOperands::KvSlice& kv) {
  const AttnDims& d = t.d;
  const AttnDims& ds = kv.ds;
  const int64_t b = kv.b, kvh = kv.kvh, TT = d.Tq * d.Tk;
  const float scale = t.scale;
  const float *Kh = kv.Kh, *Vh = kv.Vh;
  float *dKh = kv.dKh, *dVh = kv.dVh;
  if (dKh && t.fresh_k) zero_block(dKh, ds.kv_rows, d.ldkv(), d.dh);
  if (dVh && t.fresh_v) zero_block(dVh, ds.kv_rows, d.ldkv(), d.dh);
  for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h)
    if (t.dQ && t.fresh_q) zero_block(t.dQ + d.q_row(b) * d.ldq() + h * d.dh, ds.Tq, d.ldq(), d.dh);
  const int64_t KS = ds.Tk * d.dh * 16;
  float* dk_lanes = thread_scratch(static_cast<size_t>(2 * KS), kScratchWeights);  // (Tk, dh, 16) each
  float* dv_lanes = dk_lanes + KS;
  std::fill(dk_lanes, dk_lanes + 2 * KS, 0.f);
  for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
    const int64_t bh = b * d.H + h;
    const BackwardOperands::QHead qh = t.head(b, h);
    const float g = t.gates ? t.gates[h] : 1.f;
    __m512 gate_acc = _mm512_setzero_ps();
    const float* PT = t.P + bh * TT;  // (Tk, Tq)
    const float *Qh = qh.Qh, *dOh = qh.dOh;
    float* dQh = qh.dQh;
    float* dPh = t.dP ? t.dP + bh * TT : nullptr;
    switch (d.dh) {
      case 1: small_head_backward<1>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
      case 2: small_head_backward<2>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
      case 3: small_head_backward<3>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
      case 4: small_head_backward<4>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
      case 5: small_head_backward<5>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
      case 6: small_head_backward<6>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
      case 7: small_head_backward<7>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
      default: small_head_backward<8>(ds, t.causal, scale, g, PT, Qh, Kh, Vh, dOh, dQh, dk_lanes, dv_lanes, gate_acc, dPh); break;
    }
    if (t.gate_part) t.gate_part[bh] = _mm512_reduce_add_ps(gate_acc);
  }
  for (int64_t j = 0; j < ds.Tk; ++j)  // dK_h, dV_h += the lanes' sums
    for (int64_t c = 0; c < d.dh; ++c) {
      const int64_t at = (j * d.dh + c) * 16;
      if (dKh) dKh[j * d.ldkv() + c] += scale * _mm512_reduce_add_ps(_mm512_load_ps(dk_lanes + at));
      if (dVh) dVh[j * d.ldkv() + c] += _mm512_reduce_add_ps(_mm512_load_ps(dv_lanes + at));
    }
}

#else  // no AVX-512: the kernels take nothing

bool small_head_takes_forward(const AttnDims&) { return false; }
bool small_head_takes_backward(const AttnDims&) { return false; }
void small_head_forward(const ForwardOperands&, const ForwardOperands::Slice&, bool) {}
void small_head_backward(const BackwardOperands&, const BackwardOperands::KvSlice&) {}

#endif

Tensor small_head_pattern(const Tensor& PT, bool causal) {
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

}  // namespace hl::attn
