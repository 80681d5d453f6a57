// Internal to models/: what the fused attention op and its kernels share. Not included
// outside models/ (the public API is models/attention.h).
//
// The op (attention_op.cpp) runs one task per (batch, query head) slice in forward and one per
// (batch, kv head) in backward, and hands each to one of three paths:
//   attention_small_head.cpp  AVX-512 kernels for d_head <= 8 (and the forward at 16), up to 128
//                             keys, without an additive mask or dropout;
//   attention_long_slice.cpp  slices of kLongSlice keys or more: operands copied contiguous,
//                             gradients summed in contiguous blocks, weights recomputed in backward;
//   attention_reference.cpp   everything else, and the block loops (scores, masked softmax,
//                             weighted sum, backward) that the long-slice path runs too.
#pragma once
#include <algorithm>
#include <cstdint>

#include "lib/tensor.h"
#include "models/attention.h"

namespace hl::attn {

// Sizes of one attention call, derived once from the operands.
struct AttnDims {
  int64_t B, Tq, Tk, H, Hkv, dh;
  int64_t kv_rows;  // rows per batch entry in the k/v buffers (>= Tk)
  // > 0 (causal only): query i sees only the last `window` keys up to its own, j > i + (Tk - Tq)
  // - window (sliding-window attention); every path masks them like padded keys
  int32_t window = 0;
  // Where q, k and v live: row strides and column offsets into their tensors' rows. Separate
  // tensors: q (B,Tq,H*dh), k and v (B,Tk,Hkv*dh), offsets 0. Packed: one (B,T,(H+2Hkv)dh).
  // (column offsets and the window are 32-bit: the backward closure holding these dims stays
  // within its inline size)
  int64_t q_ld = 0, kv_ld = 0;
  int32_t q_off = 0, k_off = 0, v_off = 0;
  // Sequences of their own lengths packed back to back (attention_varlen): sequence b is rows
  // [starts[b], starts[b + 1]) of q, k, v and the output; Tq = Tk = kv_rows = the longest.
  // Undefined: sequence b starts at row b * Tq of q and the output, b * kv_rows of k and v.
  // (B + 1); the buffer is kept alive by fused_attention's caller and its backward
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

// Element strides of an additive mask over (B, H, Tq, Tk), 0 on broadcast dims.
struct MaskStrides {
  int64_t s[4] = {0, 0, 0, 0};
};

// The op for both layouts (attention_op.cpp): q, k, v are three tensors, or one packed tensor
// passed three times (then it is the only tensor parent and its gradient block receives dQ, dK
// and dV). d has been checked against them and a. starts_buffer: what d.starts points into
// (varlen), kept alive for backward.
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttnDims& d, const AttentionArgs& a,
                       Tensor* pattern, const Tensor& starts_buffer = Tensor());

// Slices of at least this many keys take the long-slice path (attention_long_slice.cpp), and
// causal row blocks when they have as many queries. Shorter ones (the study models' T = 33) fit
// in L1 as they are, and their P is small: copies and recomputed scores cost more than they save.
constexpr int64_t kLongSlice = 64;

// Queries are processed in row blocks. Under a causal mask a block of queries sees only the
// keys up to its last query, so scores, weights and their gradients to the right of that are
// never computed (about 40% less work at T = 128); they are exact zeros in P.
inline int64_t block_rows(const AttnDims& d, bool causal) { return causal && d.Tq >= kLongSlice ? 32 : d.Tq; }
// The keys [0, ke) that query rows before i1 see: all Tk without a causal mask.
inline int64_t visible_keys(const AttnDims& d, bool causal, int64_t i1) {
  return causal ? std::max<int64_t>(0, std::min(d.Tk, i1 + (d.Tk - d.Tq))) : d.Tk;
}

// Zeroes a (rows, dh) block at row stride ld.
inline void zero_block(float* base, int64_t rows, int64_t ld, int64_t dh) {
  for (int64_t r = 0; r < rows; ++r) std::fill(base + r * ld, base + r * ld + dh, 0.f);
}

// Per-thread buffers a task holds at once: a slice's Q, K, V and dO copied contiguous, K and V
// transposed, a block of weights and its gradient, the slice's dK, dV and dQ. (The small-head
// kernels use kScratchWeights.)
enum ScratchSlot {
  kScratchQ, kScratchK, kScratchV, kScratchDO, kScratchKT, kScratchVT, kScratchWeights, kScratchGrads, kScratchSums,
  kScratchSlots
};
// A per-thread buffer of at least n floats, 64-byte aligned, one per slot: it grows once, later
// steps allocate nothing (attention_reference.cpp).
float* thread_scratch(size_t n, ScratchSlot slot);

// ---- What the tasks read and write -------------------------------------------------------------

// The forward's operands, shared by every (batch, query head) task.
struct ForwardOperands {
  AttnDims d;
  float scale;
  bool causal;
  const float *Q, *K, *V;  // at their column offsets: q (.., ldq), k and v (.., ldkv)
  float* P;                // (B, H, Tq, Tk) weights kept for backward or `pattern`; null: not kept
  float* Pd;               // (B, H, Tq, Tk) weights after dropout (written with drop_mask; else P)
  const float* drop_mask;  // (B, H, Tq, Tk) 0 or 1/(1-p), or null
  float* O;                // (B, Tq, H*dh) or (rows, H*dh) varlen
  const float *gates, *pad, *am;  // (H), (B, Tk) key padding, additive mask; each may be null
  MaskStrides ms;

  // One slice's pointers: q, k, v, out (Tq|Tk, dh) at their strides, P's (Tq, Tk) or null
  struct Slice {
    AttnDims ds;  // this sequence's dims (varlen) or d
    int64_t b, h;
    const float *Qh, *Kh, *Vh;
    float *S, *Oh;
    float g;
    const float* pad;  // (Tk) this sequence's key padding, or null
  };
  Slice slice(int64_t b, int64_t h) const {
    const int64_t kvh = h / d.group(), bh = b * d.H + h;
    return {d.seq(b),
            b,
            h,
            Q + d.q_row(b) * d.ldq() + h * d.dh,
            K + d.kv_row(b) * d.ldkv() + kvh * d.dh,
            V + d.kv_row(b) * d.ldkv() + kvh * d.dh,
            P ? P + bh * d.Tq * d.Tk : nullptr,
            O + d.q_row(b) * d.ldo() + h * d.dh,
            gates ? gates[h] : 1.f,
            pad ? pad + b * d.Tk : nullptr};
  }
};

// The backward's operands, shared by every (batch, kv head) task.
struct BackwardOperands {
  AttnDims d;
  float scale;
  bool causal;
  const float *Q, *K, *V, *dO;  // at their column offsets
  float *dQ, *dK, *dV;          // the same for the gradients; null: not wanted
  // Fresh gradient buffers are not zeroed by the op: each task zeroes the blocks it accumulates
  // into (in cache, on its own thread). Packed: one buffer, fresh or not.
  bool fresh_q, fresh_k, fresh_v;
  bool grads_alias;        // two of dQ, dK, dV are one block (attention(x, x, x))
  const float *P, *Pd;     // (B, H, Tq, Tk) kept weights and after dropout; null: recomputed
  float* U;                // (B, H, Tq, Tk) dL/dP, then dL/dS, where P is kept (not small-head)
  const float* drop_mask;  // or null
  const float* gates;      // or null
  float* gate_part;        // (B, H) each slice's dL/dg, or null: not wanted
  float* dP;               // (B, H, Tq, Tk) += dL/dP, or null
  const float *pad, *am;   // masks applied again when weights are recomputed
  MaskStrides ms;

  // A (batch, kv head) task's keys and values, (Tk, dh) at ldkv, and their gradients or null
  struct KvSlice {
    AttnDims ds;  // this sequence's dims (varlen) or d
    int64_t b, kvh;
    const float *Kh, *Vh;
    float *dKh, *dVh;
    const float* pad;  // (Tk) this sequence's key padding, or null
  };
  KvSlice kv_slice(int64_t b, int64_t kvh) const {
    const int64_t at = d.kv_row(b) * d.ldkv() + kvh * d.dh;
    return {d.seq(b), b, kvh, K + at, V + at, dK ? dK + at : nullptr, dV ? dV + at : nullptr,
            pad ? pad + b * d.Tk : nullptr};
  }
  // Query head h's rows of q (at ldq), dO (at ldo) and dQ (at ldq, or null) in sequence b
  struct QHead {
    const float *Qh, *dOh;
    float* dQh;
  };
  QHead head(int64_t b, int64_t h) const {
    return {Q + d.q_row(b) * d.ldq() + h * d.dh, dO + d.q_row(b) * d.ldo() + h * d.dh,
            dQ ? dQ + d.q_row(b) * d.ldq() + h * d.dh : nullptr};
  }
};

// ---- The paths ---------------------------------------------------------------------------------

// AVX-512 small-head kernels (attention_small_head.cpp). Which calls they take (false without
// AVX-512): the forward's shapes, and within those the backward's (d_head <= 8).
bool small_head_takes_forward(const AttnDims& d);
bool small_head_takes_backward(const AttnDims& d);
// transposed_P: P holds each slice as (Tk, Tq) for small_head_backward; else its usual layout.
void small_head_forward(const ForwardOperands& f, const ForwardOperands::Slice& s, bool transposed_P);
void small_head_backward(const BackwardOperands& t, const BackwardOperands::KvSlice& kv);
// P (B, H, Tq, Tk) from the small-head kernels' transposed slices.
Tensor small_head_pattern(const Tensor& PT, bool causal);

// Long slices (attention_long_slice.cpp). Whether backward can recompute the weights bit for bit
// instead of keeping P (only with a gradient, no pattern, dL/dP sink or dropout).
bool long_slices_recompute(const AttnDims& d);
void long_slice_forward(const ForwardOperands& f, const ForwardOperands::Slice& s);
void long_slice_backward(const BackwardOperands& t, const BackwardOperands::KvSlice& kv);

// The reference path (attention_reference.cpp), for slices the others do not take.
void reference_forward(const ForwardOperands& f, const ForwardOperands::Slice& s);
void reference_backward(const BackwardOperands& t, const BackwardOperands::KvSlice& kv);

// ---- The block loops the reference and long-slice paths share (attention_reference.cpp) -------

// A slice's (n, dh) rows: where they are (at stride ld), or a contiguous copy.
struct Rows {
  const float* p;
  int64_t ld;
};
// Where a slice's (n, dh) gradient adds up: in the gradient (at its stride) or a contiguous block.
struct Sums {
  float* p;  // null: gradient not wanted
  int64_t ld;
};

// Y^T (dh, Tk) of a slice's keys or values Y (Tk, dh) in the given scratch slot, or null where
// the products with Y keep going through OpenBLAS.
const float* transposed(Rows Y, int64_t Tk, int64_t dh, ScratchSlot slot);

// What the block loops need to make one slice's weights: the forward computes them and, when
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

// Forward of one slice from its rows: out_h = g softmax(scale Q_h K_h^T + masks) V_h, block by
// block of query rows. Vs (Tk, dh).
void attend_slice(const ForwardOperands& f, const ForwardOperands::Slice& s, const SliceScores& sc, Rows Vs);

// Backward of one query head h of a (batch, kv head) task over its row blocks: dQ_h, dK_h, dV_h
// add into their Sums. Vs (Tk, dh) and VT (dh, Tk, or null) the kv head's values; dOs (Tq, dh).
// Weights come from P or, with w_block and u_block (per-thread (rows, Tk) blocks), are computed
// again. Returns the gate's gradient from this slice: sum(dO_h V_h^T * weights after dropout).
struct HeadBackward {
  const SliceScores* sc;  // Q_h, K_h and what recomputing the weights needs
  Rows Vs, dOs;
  const float* VT;
  Sums dQs, dKs, dVs;
  float *w_block, *u_block;  // null: P kept
};
double backward_head(const BackwardOperands& t, const HeadBackward& hb);

}  // namespace hl::attn
