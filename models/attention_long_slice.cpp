// The long-slice path of the fused attention op: (batch, head) slices of kLongSlice keys or
// more. They run the reference path's block loops (attention_reference.cpp) on staged operands:
//  - a slice's Q, K, V and dO are copied contiguous once, and its dQ, dK and dV are summed in
//    contiguous per-thread blocks written back once. A head is a block of columns whose rows
//    are a whole row of q (or qkv) apart, 3 KB at M's shapes: read in place, a long slice's
//    rows fall into a few sets of L1 and evict each other while a product walks them again for
//    every block of output rows. Copied once per slice, they stay in L1;
//  - training keeps no P (long_slices_recompute): backward computes each block's weights again
//    from Q and K, as FlashAttention does, with the same calls on the same inputs, so the same
//    bits.
// Causal row blocks (block_rows) and the softmax's one-pass AVX-512 sum start at the same
// length; they stay with the code they change.
#include <algorithm>
#include <cstdint>

#include "models/attention_kernels.h"

namespace hl::attn {

namespace {

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

// A slice's (n, dh) rows at stride ld copied contiguous into a per-thread buffer.
Rows copied_rows(const float* X, int64_t ld, int64_t n, int64_t dh, ScratchSlot slot) {
  float* C = thread_scratch(static_cast<size_t>(n * dh), slot);
  load_rows(C, X, ld, n, dh);
  return {C, dh};
}

}  // namespace

bool long_slices_recompute(const AttnDims& d) {
  // Recomputing the weights saves P (B, H, Tq, Tk): 17 MB a layer at M's shapes, and computing
  // the scores twice costs about what writing P out and reading it back did. Recomputed weights
  // repeat the forward's bits only where backward makes the same product calls in the same
  // threading context: the forward runs (batch, head) pairs and backward (batch, kv head) pairs,
  // each in one parallel region when there are two or more, else on the caller, where gemm (and
  // OpenBLAS) may split a product differently. (B = 1 with one kv head and several query heads
  // keeps P.)
  const bool same_context = (d.B * d.H >= 2) == (d.B * d.Hkv >= 2);
  return d.Tk >= kLongSlice && same_context;
}

void long_slice_forward(const ForwardOperands& f, const ForwardOperands::Slice& s) {
  const AttnDims& ds = s.ds;
  const Rows Qs = copied_rows(s.Qh, ds.ldq(), ds.Tq, ds.dh, kScratchQ);   // (Tq, dh)
  const Rows Ks = copied_rows(s.Kh, ds.ldkv(), ds.Tk, ds.dh, kScratchK);  // (Tk, dh)
  const Rows Vs = copied_rows(s.Vh, ds.ldkv(), ds.Tk, ds.dh, kScratchV);  // (Tk, dh)
  const float* KT = transposed(Ks, ds.Tk, ds.dh, kScratchKT);             // (dh, Tk) or null
  const SliceScores sc{&ds, s.b, s.h, Qs, Ks, KT, ds.dh, f.scale, f.causal, s.pad, f.am, &f.ms};
  attend_slice(f, s, sc, Vs);
}

void long_slice_backward(const BackwardOperands& t, const BackwardOperands::KvSlice& kv) {
  const AttnDims& ds = kv.ds;
  const int64_t b = kv.b, dh = ds.dh;
  const bool recompute = !t.P;  // P not kept: each block's weights are computed again
  const Rows Ks = copied_rows(kv.Kh, ds.ldkv(), ds.Tk, dh, kScratchK);  // (Tk, dh)
  const Rows Vs = copied_rows(kv.Vh, ds.ldkv(), ds.Tk, dh, kScratchV);  // (Tk, dh)
  const float* VT = transposed(Vs, ds.Tk, dh, kScratchVT);              // (dh, Tk) or null
  const float* KT = recompute ? transposed(Ks, ds.Tk, dh, kScratchKT) : nullptr;
  const int64_t BRs = block_rows(ds, t.causal);
  // recomputed: a block's weights and dL/dP, then dL/dS, in per-thread (BRs, Tk) blocks
  float* w_block = recompute ? thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchWeights) : nullptr;
  float* u_block = recompute ? thread_scratch(static_cast<size_t>(BRs * ds.Tk), kScratchGrads) : nullptr;
  // dK_h, dV_h and dQ_h (rows, dh) are summed in contiguous per-thread blocks read from the
  // gradient and written back once. Into a fresh gradient nothing is read: the sums start at 0
  // (rows past Tk, a KV-cache buffer's unfilled ones, get gradient 0). Where two of q, k, v are
  // one tensor (attention(x, x, x)) their gradients are one block, summed in place.
  const bool sum_in_blocks = !t.grads_alias;
  float* blocks = sum_in_blocks ? thread_scratch(static_cast<size_t>((2 * ds.Tk + ds.Tq) * dh), kScratchSums) : nullptr;
  // grad: (rows, dh) at stride ld, of which the first n are summed; at: its block in `blocks`
  auto start_sums = [&](float* grad, int64_t ld, int64_t n, int64_t rows, bool fresh, int64_t at) {
    if (!grad) return Sums{nullptr, 0};
    if (fresh) zero_block(grad + (sum_in_blocks ? n : 0) * ld, sum_in_blocks ? rows - n : rows, ld, dh);
    if (!sum_in_blocks) return Sums{grad, ld};
    float* sum = blocks + at;
    if (fresh) std::fill(sum, sum + n * dh, 0.f);
    else load_rows(sum, grad, ld, n, dh);
    return Sums{sum, dh};
  };
  auto finish_sums = [&](float* grad, int64_t ld, int64_t n, Sums sums) {
    if (grad && sum_in_blocks) store_rows(grad, ld, sums.p, n, dh);
  };
  const Sums dKs = start_sums(kv.dKh, ds.ldkv(), ds.Tk, ds.kv_rows, t.fresh_k, 0);
  const Sums dVs = start_sums(kv.dVh, ds.ldkv(), ds.Tk, ds.kv_rows, t.fresh_v, ds.Tk * dh);
  for (int64_t h = kv.kvh * ds.group(); h < (kv.kvh + 1) * ds.group(); ++h) {
    const BackwardOperands::QHead qh = t.head(b, h);
    const Rows Qs = copied_rows(qh.Qh, ds.ldq(), ds.Tq, dh, kScratchQ);    // (Tq, dh)
    const Rows dOs = copied_rows(qh.dOh, ds.ldo(), ds.Tq, dh, kScratchDO);  // (Tq, dh)
    const Sums dQs = start_sums(qh.dQh, ds.ldq(), ds.Tq, ds.Tq, t.fresh_q, 2 * ds.Tk * dh);
    const SliceScores sc{&ds, b, h, Qs, Ks, KT, dh, t.scale, t.causal, kv.pad, t.am, &t.ms};
    const double gate_sum = backward_head(t, {&sc, Vs, dOs, VT, dQs, dKs, dVs, w_block, u_block});
    finish_sums(qh.dQh, ds.ldq(), ds.Tq, dQs);
    if (t.gate_part) t.gate_part[b * ds.H + h] = static_cast<float>(gate_sum);
  }
  finish_sums(kv.dKh, ds.ldkv(), ds.Tk, dKs);
  finish_sums(kv.dVh, ds.ldkv(), ds.Tk, dVs);
}

}  // namespace hl::attn
