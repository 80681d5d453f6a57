// The reference path of the fused attention op: one (batch, head) slice as a few strided sgemm
// calls on q, k and v where they lie, with the softmax between them. It takes every slice the
// small-head kernels do not and that is shorter than kLongSlice keys; its block loops (scores,
// masked softmax, weighted sum, and the backward) also run the long-slice path, on copies.
//
// Per slice, for query rows i and keys j (Tq x Tk), scale s and gate g:
//   S = s Q_h K_h^T + masks      P = softmax(S) by rows (masked keys weigh 0)
//   out_h = g P V_h
// and backward, from dO_h (the output's gradient) and U = dO_h V_h^T:
//   dV_h += g P^T dO_h     dL/dP = g U     dS = P (dL/dP - rowsum(dL/dP P))
//   dQ_h += s dS K_h       dK_h += s dS^T Q_h     dL/dg = sum(U P)
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "lib/fastmath.h"
#include "lib/ops.h"
#include "models/attention_kernels.h"

namespace hl::attn {

float* thread_scratch(size_t n, ScratchSlot slot) {
  thread_local std::vector<float> bufs[kScratchSlots];
  std::vector<float>& buf = bufs[slot];
  if (buf.size() < n + 16) buf.resize(n + 16);
  const uintptr_t at = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - at % 64) % 64) / sizeof(float);
}

// Score-shaped products (rows, ke) = X (rows, dh) Y^T with Y (Tk, dh) the slice's keys (or values,
// in backward): with Y^T made once per slice, each query block's product is an NN one that
// small_gemm computes without packing (OpenBLAS packs both operands per call). Null where
// OpenBLAS keeps the product (no AVX-512, or sizes small_gemm does not take).
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

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// In place: row = softmax(row + masks) over the first `ke` columns (computed by the caller);
// columns from ke on are set to 0. The loops run over all ke columns for every row of a block
// and mask causally by index, branch-free: rows of a block then have one trip count (row-
// dependent lengths cost a mispredicted loop exit per loop).
// pad: this sequence's (Tk) key padding or null.
void masked_softmax_row(float* row, int64_t ke, const AttnDims& d, int64_t b, int64_t h, int64_t i,
                        bool causal, const float* pad, const float* am, const MaskStrides& ms) {
  const int64_t last = causal ? i + (d.Tk - d.Tq) : d.Tk - 1;  // last visible key
  // a sliding window hides the keys before its first (their weights come out 0, as padded keys')
  for (int64_t j = 0, first = d.window > 0 ? std::min(ke, last - d.window + 1) : 0; j < first; ++j) row[j] = kNegInf;
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
  // scalar adds, see fastmath.h); on rows of a few vectors (T = 33) the compiler's loop is faster.
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

void attend_slice(const ForwardOperands& f, const ForwardOperands::Slice& s, const SliceScores& sc, Rows Vs) {
  const AttnDims& ds = s.ds;
  const int64_t bh = s.b * f.d.H + s.h, TT = f.d.Tq * f.d.Tk, BRs = block_rows(ds, f.causal);
  // a block's weights go into P, or (P not kept) into a per-thread (BRs, Tk) block
  float* block = s.S ? nullptr : thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchWeights);
  for (int64_t i0 = 0; i0 < ds.Tq; i0 += BRs) {
    const int64_t i1 = std::min(ds.Tq, i0 + BRs), rows = i1 - i0, ke = visible_keys(ds, f.causal, i1);
    float* Wk = s.S ? s.S + i0 * ds.Tk : block;  // (rows, Tk)
    block_weights(sc, i0, i1, ke, Wk);
    const float* W = Wk;
    if (f.drop_mask) {  // the weights after dropout, kept for backward
      float* SD = f.Pd + bh * TT + i0 * ds.Tk;
      for (int64_t e = 0; e < rows * ds.Tk; ++e) SD[e] = W[e] * f.drop_mask[bh * TT + i0 * ds.Tk + e];
      W = SD;
    }
    if (ke > 0)  // out_h[i0:i1] = g P[:, :ke] V_h[:ke]
      gemm(false, false, rows, ds.dh, ke, s.g, W, ds.Tk, Vs.p, Vs.ld, 0.f, s.Oh + i0 * ds.ldo(), ds.ldo());
    else
      for (int64_t i = i0; i < i1; ++i) std::fill(s.Oh + i * ds.ldo(), s.Oh + i * ds.ldo() + ds.dh, 0.f);
  }
}

double backward_head(const BackwardOperands& t, const HeadBackward& hb) {
  const SliceScores& sc = *hb.sc;
  const AttnDims& ds = *sc.ds;
  const int64_t bh = sc.b * t.d.H + sc.h, TT = t.d.Tq * t.d.Tk, BRs = block_rows(ds, t.causal), dh = ds.dh;
  const bool recompute = hb.w_block;
  const Rows Qs = sc.Qh, Ks = sc.Kh, Vs = hb.Vs, dOs = hb.dOs;
  const float g = t.gates ? t.gates[sc.h] : 1.f, scale = sc.scale;
  const float* M = t.drop_mask;
  double gate_sum = 0;
  for (int64_t i0 = 0; i0 < ds.Tq; i0 += BRs) {
    const int64_t i1 = std::min(ds.Tq, i0 + BRs), rows = i1 - i0, ke = visible_keys(ds, t.causal, i1);
    if (ke == 0) continue;  // fully masked rows: no gradient flows
    const float *Pb, *Wb;  // (rows, Tk) weights, and after dropout
    float* Ub;
    if (recompute) {
      block_weights(sc, i0, i1, ke, hb.w_block);
      Pb = Wb = hb.w_block;
      Ub = hb.u_block;
    } else {
      Pb = t.P + bh * TT + i0 * ds.Tk;
      Wb = t.Pd + bh * TT + i0 * ds.Tk;
      Ub = t.U + bh * TT + i0 * ds.Tk;
    }
    const float* dOb = dOs.p + i0 * dOs.ld;
    // Ub = dO_h V_h^T (rows, ke): dL/d(weights) before the gate
    if (hb.VT) gemm(false, false, rows, ke, dh, 1.f, dOb, dOs.ld, hb.VT, ds.Tk, 0.f, Ub, ds.Tk);
    else gemm(false, true, rows, ke, dh, 1.f, dOb, dOs.ld, Vs.p, Vs.ld, 0.f, Ub, ds.Tk);
    if (hb.dVs.p)  // dV_h[:ke] += g Pd^T dO_h
      gemm(true, false, ke, dh, rows, g, Wb, ds.Tk, dOb, dOs.ld, 1.f, hb.dVs.p, hb.dVs.ld);
    for (int64_t r = 0; r < rows; ++r) {
      float* u = Ub + r * ds.Tk;
      const float *p = Pb + r * ds.Tk, *w = Wb + r * ds.Tk;
      if (t.gate_part)
        for (int64_t j = 0; j < ke; ++j) gate_sum += static_cast<double>(u[j]) * w[j];
      // dL/dP = g U (times the dropout mask); reported as 0 where masked
      if (M) {
        const float* m = M + bh * TT + (i0 + r) * ds.Tk;
        for (int64_t j = 0; j < ke; ++j) u[j] *= g * m[j];
      } else if (g != 1.f) {
#pragma omp simd
        for (int64_t j = 0; j < ke; ++j) u[j] *= g;
      }
      if (t.dP) {
        float* dp = t.dP + bh * TT + (i0 + r) * ds.Tk;
        for (int64_t j = 0; j < ke; ++j) dp[j] += p[j] > 0.f ? u[j] : 0.f;
      }
      // softmax backward from the saved output: dS = P (dP - rowsum(dP P))
      const float dot = dot_lanes(u, p, ke);
#pragma omp simd
      for (int64_t j = 0; j < ke; ++j) u[j] = p[j] * (u[j] - dot);
    }
    if (hb.dQs.p)  // dQ_h[i0:i1] += scale dS K_h[:ke]
      gemm(false, false, rows, dh, ke, scale, Ub, ds.Tk, Ks.p, Ks.ld, 1.f, hb.dQs.p + i0 * hb.dQs.ld, hb.dQs.ld);
    if (hb.dKs.p)  // dK_h[:ke] += scale dS^T Q_h[i0:i1]
      gemm(true, false, ke, dh, rows, scale, Ub, ds.Tk, Qs.p + i0 * Qs.ld, Qs.ld, 1.f, hb.dKs.p, hb.dKs.ld);
  }
  return gate_sum;
}

void reference_forward(const ForwardOperands& f, const ForwardOperands::Slice& s) {
  const AttnDims& ds = s.ds;
  const Rows Qs{s.Qh, ds.ldq()}, Ks{s.Kh, ds.ldkv()}, Vs{s.Vh, ds.ldkv()};  // (Tq | Tk, dh) in place
  const float* KT = transposed(Ks, ds.Tk, ds.dh, kScratchKT);                // (dh, Tk) or null
  const SliceScores sc{&ds, s.b, s.h, Qs, Ks, KT, ds.dh, f.scale, f.causal, s.pad, f.am, &f.ms};
  attend_slice(f, s, sc, Vs);
}

void reference_backward(const BackwardOperands& t, const BackwardOperands::KvSlice& kv) {
  const AttnDims& ds = kv.ds;
  const int64_t b = kv.b, dh = ds.dh;
  const bool recompute = !t.P;  // P not kept: each block's weights are computed again
  const Rows Ks{kv.Kh, ds.ldkv()}, Vs{kv.Vh, ds.ldkv()};  // (Tk, dh) in place
  const float* VT = transposed(Vs, ds.Tk, dh, kScratchVT);  // (dh, Tk) or null
  const float* KT = recompute ? transposed(Ks, ds.Tk, dh, kScratchKT) : nullptr;
  const int64_t BRs = block_rows(ds, t.causal);
  // recomputed: a block's weights and dL/dP, then dL/dS, in per-thread (BRs, Tk) blocks
  float* w_block = recompute ? thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchWeights) : nullptr;
  float* u_block = recompute ? thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchGrads) : nullptr;
  // dK_h, dV_h and dQ_h add up where they are; a fresh gradient is zeroed first (all kv_rows
  // rows: those past Tk, a KV-cache buffer's unfilled ones, get gradient 0)
  auto in_place = [&](float* grad, int64_t ld, int64_t rows, bool fresh) {
    if (grad && fresh) zero_block(grad, rows, ld, dh);
    return Sums{grad, grad ? ld : 0};
  };
  const Sums dKs = in_place(kv.dKh, ds.ldkv(), ds.kv_rows, t.fresh_k);
  const Sums dVs = in_place(kv.dVh, ds.ldkv(), ds.kv_rows, t.fresh_v);
  for (int64_t h = kv.kvh * ds.group(); h < (kv.kvh + 1) * ds.group(); ++h) {
    const BackwardOperands::QHead qh = t.head(b, h);
    const Rows Qs{qh.Qh, ds.ldq()}, dOs{qh.dOh, ds.ldo()};  // (Tq, dh)
    const Sums dQs = in_place(qh.dQh, ds.ldq(), ds.Tq, t.fresh_q);
    const SliceScores sc{&ds, b, h, Qs, Ks, KT, dh, t.scale, t.causal, kv.pad, t.am, &t.ms};
    const double gate_sum = backward_head(t, {&sc, Vs, dOs, VT, dQs, dKs, dVs, w_block, u_block});
    if (t.gate_part) t.gate_part[b * ds.H + h] = static_cast<float>(gate_sum);
  }
}

}  // namespace hl::attn
