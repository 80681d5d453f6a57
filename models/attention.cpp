// Multi-head attention: the checks of the attention op's arguments, its public entry points
// (attention, attention_packed, attention_varlen, scaled_dot_product_attention) and the
// MultiHeadAttention module. The op itself (path choice, forward, backward) is in
// attention_op.cpp, its kernels in attention_reference.cpp, attention_long_slice.cpp and
// attention_small_head.cpp (see attention_kernels.h).
#include "models/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "lib/autograd.h"
#include "lib/profile.h"
#include "models/attention_kernels.h"

namespace hl {

using attn::AttnDims;

namespace {

// The checks every layout shares (heads, masks, gates); d.B, Tq, Tk and kv_rows are set.
void check_attention_args(AttnDims& d, const AttentionArgs& a) {
  if (a.gates.defined() && (a.gates.ndim() != 1 || a.gates.size(0) != d.H))
    fail("attention: gates ", a.gates.shape().str(), " must be (", d.H, ")");
  if (a.key_padding.defined() && a.key_padding.shape() != Shape({d.B, d.Tk}))
    fail("attention: key_padding ", a.key_padding.shape().str(), " must be (", d.B, ",", d.Tk, ")");
  if (a.pattern_grad.defined() && a.pattern_grad.shape() != Shape({d.B, d.H, d.Tq, d.Tk}))
    fail("attention: pattern_grad ", a.pattern_grad.shape().str(), " must be (B,H,Tq,Tk)");
  if (a.dropout > 0.f && !a.rng) fail("attention: dropout needs a random generator");
  if (a.window < 0 || (a.window > 0 && !a.causal)) fail("attention: a sliding window (", a.window, ") needs the causal mask");
  d.window = static_cast<int32_t>(std::min<int64_t>(a.window, d.Tk));  // a window of Tk or more hides nothing
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
  d.k_off = static_cast<int32_t>(d.H * d.dh);
  d.v_off = static_cast<int32_t>((d.H + d.Hkv) * d.dh);
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

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a,
                 Tensor* pattern) {
  HL_PROFILE(Attention);
  return attn::fused_attention(q, k, v, check_attention(q, k, v, a), a, pattern);
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
  return attn::fused_attention(qkv, qkv, qkv, d, a, nullptr, starts_buffer);
}

Tensor attention_packed(const Tensor& qkv, const AttentionArgs& a, Tensor* pattern) {
  HL_PROFILE(Attention);
  return attn::fused_attention(qkv, qkv, qkv, check_attention_packed(qkv, a), a, pattern);
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
  if (rotary) {
    const int64_t rd = rope.dim ? rope.dim : head_dim();
    if (rope.dim < 0 || rd % 2 || rd > head_dim())
      fail("attention: rotary_dim ", rope.dim, " must be even and at most d_head ", head_dim(), " (0 = d_head)");
    if (!(rope.theta > 0.f) || !std::isfinite(rope.theta)) fail("attention: rope_theta must be positive, got ", rope.theta);
    if (max_positions < 1) fail("attention: rotary positions need max_positions (the longest sequence), got ", max_positions);
  }
  if (!(scale >= 0.f) || !std::isfinite(scale)) fail("attention: attn_scale must be positive (0 = 1/sqrt(d_head)), got ", scale);
  if (!(softcap >= 0.f) || !std::isfinite(softcap)) fail("attention: attn_softcap must be positive (0 = none), got ", softcap);
  if (window < 0) fail("attention: sliding_window must be positive (0 = none), got ", window);
  if (qk_norm && (!(norm_eps > 0.f) || !std::isfinite(norm_eps))) fail("attention: the QK-norm's eps must be positive, got ", norm_eps);
}

// the identity gain to start: w = 1, or 1 + w with w = 0
MultiHeadAttention::HeadNorm::HeadNorm(int64_t d_head, bool one_plus)
    : weight(one_plus ? Tensor::zeros({d_head}) : Tensor::ones({d_head})) {
  register_parameter("weight", &weight);
}

MultiHeadAttention::MultiHeadAttention(const AttentionConfig& c, Rng& rng, Rng* dropout_rng)
    : cfg((c.validate(), c)),
      W_Q(c.d_model, c.n_heads * c.head_dim(), c.has_qkv_bias(), rng),
      W_K(c.d_model, c.kv_heads() * c.head_dim(), c.has_qkv_bias(), rng),
      W_V(c.d_model, c.kv_heads() * c.head_dim(), c.has_qkv_bias(), rng),
      W_O(c.n_heads * c.head_dim(), c.d_model, c.has_o_bias(), rng),
      gates(Tensor::ones({c.n_heads})),
      dropout_rng_(dropout_rng) {
  register_module("W_Q", &W_Q);
  register_module("W_K", &W_K);
  register_module("W_V", &W_V);
  register_module("W_O", &W_O);
  if (c.qk_norm) {  // the identity gain: no draws, the initialisation of everything else is unchanged
    q_norm = std::make_unique<HeadNorm>(c.head_dim(), c.qk_norm_one_plus);
    k_norm = std::make_unique<HeadNorm>(c.head_dim(), c.qk_norm_one_plus);
    register_module("q_norm", q_norm.get());
    register_module("k_norm", k_norm.get());
  }
  if (c.rotary) {
    cfg.rope.d_head = c.head_dim();
    rotary_cos_sin = rotary_table(c.max_positions, cfg.rope);
  }
  // Move the initialised W_Q, W_K, W_V (and biases) into one slab each, as views. A model about to
  // be loaded (SkipInitGuard) leaves the slab's pages untouched: writing them here would hold them
  // beside the file's tensors (0.9 GiB at Gemma-2-2B's shape).
  auto into_slab = [](std::initializer_list<Tensor*> parts) {
    int64_t total = 0;
    for (Tensor* t : parts) total += t->numel();
    Tensor slab = Tensor::empty({total});
    int64_t at = 0;
    for (Tensor* t : parts) {
      Tensor view = storage_view(slab, at, t->shape());
      if (!SkipInitGuard::active()) view.copy_from(*t);
      view.requires_grad_(true);
      *t = view;
      at += view.numel();
    }
  };
  into_slab({&W_Q.weight, &W_K.weight, &W_V.weight});
  if (c.has_qkv_bias()) into_slab({&W_Q.bias, &W_K.bias, &W_V.bias});
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

// The masks of scores s (B, H, Tq, Tk): masked keys are -inf (weight 0 after softmax).
Tensor mask_scores(Tensor s, const AttentionArgs& a, bool additive = true) {
  const int64_t B = s.size(0), Tq = s.size(2), Tk = s.size(3);
  if (additive && a.additive_mask.defined()) s = add(s, a.additive_mask);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (a.causal) {
    Tensor m = Tensor::zeros({Tq, Tk});
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j)  // after the query, or before its sliding window
        if (j > i + (Tk - Tq) || (a.window > 0 && j <= i + (Tk - Tq) - a.window)) m.at({i, j}) = 1.f;
    s = masked_fill(s, m, neg_inf);
  }
  if (a.key_padding.defined()) s = masked_fill(s, reshape(a.key_padding, {B, 1, 1, Tk}), neg_inf);
  return s;
}

// Scaled scores (B, H, Tq, Tk), unmasked.
Tensor scaled_scores(const Tensor& q, const Tensor& k, const AttentionArgs& a, int64_t Tk) {
  const int64_t B = q.size(0), Tq = q.size(1), H = a.n_heads, dh = a.d_head;
  const Tensor qh = permute(reshape(q, {B, Tq, H, dh}), {0, 2, 1, 3});  // (B, H, Tq, dh)
  const float scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(dh));
  return mul_scalar(matmul(qh, kv_heads_for_queries(k, Tk, a.n_heads, a.n_kv_heads, dh), false, true), scale);
}

// Scaled, masked scores (B, H, Tq, Tk): masked keys are -inf (weight 0 after softmax).
Tensor attention_scores(const Tensor& q, const Tensor& k, const AttentionArgs& a, int64_t Tk) {
  return mask_scores(scaled_scores(q, k, a, Tk), a);
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

// ---- MultiHeadAttention::forward, step by step -------------------------------------------------

// The hook points of one call. Names are built (strings allocated) only when there are hooks.
// The hook points attention makes, declared with the code that makes them: the steps below
// apply these names, and hook_points() lists them with their shapes and meanings.
constexpr char kHookQInput[] = "hook_q_input", kHookKInput[] = "hook_k_input", kHookVInput[] = "hook_v_input",
               kHookQ[] = "hook_q", kHookK[] = "hook_k", kHookV[] = "hook_v", kHookScores[] = "hook_attn_scores",
               kHookPattern[] = "hook_pattern", kHookZ[] = "hook_z", kHookResult[] = "hook_result",
               kHookQNormed[] = "q_norm.hook_normalized", kHookKNormed[] = "k_norm.hook_normalized",
               kHookRotQ[] = "hook_rot_q", kHookRotK[] = "hook_rot_k", kHookScoresCapped[] = "hook_attn_scores_capped";

struct HookPoints {
  const Hooks* hk;
  const std::string& pre;
  int64_t dh;
  bool hooked(const char* n) const { return hk && hk->any(pre + n); }
  // A hook sees (B, T, heads, d_head); a replacement goes back to (B, T, heads*d_head).
  Tensor heads(const char* n, const Tensor& t, int heads) const {
    if (!hooked(n)) return t;
    const Tensor view = reshape(t, {t.size(0), t.size(1), heads, dh});
    const Tensor r = hk->apply(pre + n, view);
    return r.same(view) ? t : reshape(r, t.shape());
  }
};

// ---- QK-norm and rotary positions (after hook_q and hook_k, before the KV cache) --------------

// The position ids of a call's rows: Call::positions, or 0..T-1 after the cache's rows, or with
// live_len 0..len-1 of each packed sequence. `buf` holds them when they are made here.
std::span<const int32_t> call_positions(const MultiHeadAttention::Call& call, int64_t rows, std::vector<int32_t>& buf) {
  if (!call.positions.empty()) return call.positions;
  if (!call.live_len.empty()) {
    for (int32_t len : call.live_len)
      for (int32_t t = 0; t < len; ++t) buf.push_back(t);
  } else {
    const int64_t offset = call.kv_cache ? call.kv_cache->len : 0;
    for (int64_t t = 0; t < rows; ++t) buf.push_back(static_cast<int32_t>(offset + t));
  }
  return buf;
}

// Packed rows qkv (n, (H + 2 Hkv) dh) of sequences back to back, their q and k normalised and
// turned (no hooks on this path).
Tensor position_and_norm_packed(const MultiHeadAttention& m, Tensor qkv, const MultiHeadAttention::Call& call, int64_t n) {
  const AttentionConfig& c = m.cfg;
  const int H = c.n_heads, Hkv = c.kv_heads();
  const int64_t dh = c.head_dim();
  std::vector<int32_t> buf;
  if (c.qk_norm) {
    std::vector<Tensor> p = split(qkv, {H * dh, Hkv * dh, Hkv * dh}, qkv.ndim() - 1);
    qkv = concat({head_rms_norm(p[0], H, dh, m.q_norm->weight, c.norm_eps, c.qk_norm_one_plus),
                  head_rms_norm(p[1], Hkv, dh, m.k_norm->weight, c.norm_eps, c.qk_norm_one_plus), p[2]},
                 qkv.ndim() - 1);
  }
  // q's and k's heads are the first H + Hkv of each row: one pass over the fresh buffer, in place
  if (c.rotary) qkv = rotary(qkv, H + Hkv, call_positions(call, n, buf), m.rotary_cos_sin, c.rope, /*in_place=*/true);
  return qkv;
}

// Sequences packed back to back (Call::live_len): x_q (n, d_model) -> (n or output rows, d_model).
// One projection and attention_varlen: nothing is computed beyond a sequence's own length.
Tensor forward_packed_sequences(const MultiHeadAttention& m, const Tensor& x_q, const Tensor& x_kv,
                                const MultiHeadAttention::Call& call, const AttentionArgs& a) {
  if (x_kv.defined() || call.kv_cache || call.hooks) fail("attention: packed sequences are for self-attention without hooks or cache");
  const Tensor ws[3] = {m.W_Q.weight, m.W_K.weight, m.W_V.weight}, bs[3] = {m.W_Q.bias, m.W_K.bias, m.W_V.bias};
  const Tensor qkv = position_and_norm_packed(m, linear_stacked(x_q, ws, bs), call, x_q.size(0));  // (n, (H + 2 Hkv) dh)
  const Tensor z = m.cfg.softcap > 0.f ? attention_varlen_capped(qkv, call.live_len, a, m.cfg.softcap)
                                       : attention_varlen(qkv, call.live_len, a);  // (n, H*dh)
  return m.W_O.forward(call.output_rows ? gather_rows(z, *call.output_rows) : z);  // (n or output rows, d_model)
}

// q, k and v of one call. Self-attention without a cache projects them with one sgemm into qkv
// and attends on it without copies (the fast path); q, k and v are split off it (copies) only
// for what needs them apart: a hook on them, the scores recomputed for a hook, the unfused path.
struct Projected {
  Tensor q, k, v;  // (B, Tq, H*dh), (B, Tk, Hkv*dh), (B, Tk, Hkv*dh); packed: defined once split
  Tensor qkv;      // packed: (B, T, (H + 2 Hkv) dh), holding any replacement of q, k or v
  bool packed;
  int H, Hkv;
  int64_t dh;
  void split_packed() {
    if (q.defined()) return;
    std::vector<Tensor> parts = split(qkv, {H * dh, Hkv * dh, Hkv * dh}, 2);
    q = parts[0], k = parts[1], v = parts[2];
  }
};

// The split inputs (TransformerLens's use_split_qkv_input): the input x (B, T, d_model) of a
// projection copied per head, (B, T, heads, d_model), through hook `name`. When a forward hook
// replaces the copies, each head is projected from its own copy: (B, T, heads*dh) (the per-head
// products sum in another order than the one product: equal to it to float32 rounding). When the
// hooks only read them, undefined: the usual projection runs, bit for bit as without the hook.
Tensor split_input_projection(const HookPoints& hp, const char* name, const Tensor& x, const Linear& lin, int heads) {
  if (!hp.hooked(name)) return Tensor();
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2), dh = hp.dh;
  const Tensor one = reshape(x, {B, T, 1, D});
  const Tensor copies = concat(std::vector<Tensor>(static_cast<size_t>(heads), one), 2);  // (B, T, heads, D)
  const Tensor r = hp.hk->apply(hp.pre + name, copies, /*tap_for_backward=*/false);
  if (r.same(copies)) return Tensor();
  const Tensor in = hp.hk->tapped(hp.pre + name, r);
  std::vector<Tensor> per_head;
  for (int h = 0; h < heads; ++h) {
    const Tensor xh = reshape(slice(in, 2, h, h + 1), {B, T, D});
    const Tensor w = slice(lin.weight, 0, h * dh, (h + 1) * dh);  // (dh, D): head h's rows
    per_head.push_back(linear(xh, w, lin.bias.defined() ? slice(lin.bias, 0, h * dh, (h + 1) * dh) : Tensor()));
  }
  return concat(per_head, 2);  // (B, T, heads*dh)
}

// A backward hook on a split input whose copies were left as they are: t (B, T, heads*dh), the
// usual projection, routed through tap() so the hook sees dL/d(copy of head h) = dL/dt_h W_h,
// (B, T, heads, d_model). t itself when no backward hook asks.
Tensor tap_split_input(const HookPoints& hp, const char* name, const Tensor& t, const Linear& lin, int heads) {
  if (!hp.hk || !grad_enabled() || !t.requires_grad() || !hp.hk->has_backward(hp.pre + name)) return t;
  return tap(t, [hooks = *hp.hk, n = hp.pre + name, W = lin.weight, heads, dh = hp.dh](const Tensor& g) {
    const int64_t rows = g.numel() / g.size(-1), D = W.size(1);
    Tensor per_head = Tensor::zeros({g.size(0), g.size(1), heads, D});
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < heads; ++h) {
        float* o = per_head.data() + (r * heads + h) * D;
        for (int64_t j = 0; j < dh; ++j) {
          const float gj = g.data()[r * heads * dh + h * dh + j];
          const float* w = W.data() + (h * dh + j) * D;
          for (int64_t d = 0; d < D; ++d) o[d] += gj * w[d];
        }
      }
    hooks.backward_at(n, per_head);
  });
}

// Step 1: project q, k, v (hook_q_input ... hook_v_input, then hook_q, hook_k, hook_v applied).
// x_kv: undefined for self-attention.
Projected project_qkv(const MultiHeadAttention& m, const Tensor& x_q, const Tensor& x_kv_in, bool packed,
                      const HookPoints& hp) {
  const Tensor& x_kv = x_kv_in.defined() ? x_kv_in : x_q;
  Projected p{Tensor(), Tensor(), Tensor(), Tensor(), packed, m.cfg.n_heads, m.cfg.kv_heads(), m.cfg.head_dim()};
  const bool split_inputs = hp.hooked(kHookQInput) || hp.hooked(kHookKInput) || hp.hooked(kHookVInput);
  if (split_inputs) {
    // a replaced copy: each head's q, k or v from its own copy (the others as usual)
    const Tensor q = split_input_projection(hp, kHookQInput, x_q, m.W_Q, p.H);
    const Tensor k = split_input_projection(hp, kHookKInput, x_kv, m.W_K, p.Hkv);
    const Tensor v = split_input_projection(hp, kHookVInput, x_kv, m.W_V, p.Hkv);
    if (q.defined() || k.defined() || v.defined()) {
      p.q = hp.heads(kHookQ, q.defined() ? q : tap_split_input(hp, kHookQInput, m.W_Q.forward(x_q), m.W_Q, p.H), p.H);
      p.k = hp.heads(kHookK, k.defined() ? k : tap_split_input(hp, kHookKInput, m.W_K.forward(x_kv), m.W_K, p.Hkv), p.Hkv);
      p.v = hp.heads(kHookV, v.defined() ? v : tap_split_input(hp, kHookVInput, m.W_V.forward(x_kv), m.W_V, p.Hkv), p.Hkv);
      if (packed) p.qkv = concat({p.q, p.k, p.v}, 2);  // (B, T, (H + 2 Hkv) dh)
      return p;
    }
  }
  if (packed) {
    const Tensor ws[3] = {m.W_Q.weight, m.W_K.weight, m.W_V.weight}, bs[3] = {m.W_Q.bias, m.W_K.bias, m.W_V.bias};
    p.qkv = linear_stacked(x_q, ws, bs);  // (B, T, (H + 2 Hkv) dh)
    // only a hook that replaces (or needs the gradient of) q, k or v (or their inputs) splits them
    if (hp.hooked(kHookQ) || hp.hooked(kHookK) || hp.hooked(kHookV) || split_inputs) {
      p.split_packed();
      const Tensor q2 = hp.heads(kHookQ, tap_split_input(hp, kHookQInput, p.q, m.W_Q, p.H), p.H),
                   k2 = hp.heads(kHookK, tap_split_input(hp, kHookKInput, p.k, m.W_K, p.Hkv), p.Hkv),
                   v2 = hp.heads(kHookV, tap_split_input(hp, kHookVInput, p.v, m.W_V, p.Hkv), p.Hkv);
      if (!q2.same(p.q) || !k2.same(p.k) || !v2.same(p.v)) p.qkv = concat({q2, k2, v2}, 2);
      p.q = q2, p.k = k2, p.v = v2;
    }
  } else {
    p.q = hp.heads(kHookQ, tap_split_input(hp, kHookQInput, m.W_Q.forward(x_q), m.W_Q, p.H), p.H);      // (B, Tq, H*dh)
    p.k = hp.heads(kHookK, tap_split_input(hp, kHookKInput, m.W_K.forward(x_kv), m.W_K, p.Hkv), p.Hkv);  // (B, Tk, Hkv*dh)
    p.v = hp.heads(kHookV, tap_split_input(hp, kHookVInput, m.W_V.forward(x_kv), m.W_V, p.Hkv), p.Hkv);
  }
  return p;
}

// Step 1b: QK-norm (q_norm.hook_normalized, k_norm.hook_normalized), then rotary positions
// (hook_rot_q, hook_rot_k), before the KV cache keeps the keys. Self-attention with neither
// QK-norm nor those hooks turns q and k where they lie in the packed buffer (one pass, in place);
// otherwise q and k are turned apart.
void norm_and_turn(const MultiHeadAttention& m, Projected& x, const MultiHeadAttention::Call& call, const HookPoints& hp) {
  const AttentionConfig& c = m.cfg;
  if (!c.qk_norm && !c.rotary) return;
  std::vector<int32_t> buf;
  const int64_t T = x.packed ? x.qkv.size(1) : x.q.size(1);
  const std::span<const int32_t> pos = c.rotary ? call_positions(call, T, buf) : std::span<const int32_t>();
  const int64_t B = x.packed ? x.qkv.size(0) : x.q.size(0);
  if (c.rotary && static_cast<int64_t>(pos.size()) != T && static_cast<int64_t>(pos.size()) != B * T)
    fail("attention: ", pos.size(), " position ids for ", B, " x ", T, " positions (rotary positions need one per position, or per row and position)");
  if (x.packed && !c.qk_norm && !hp.hooked(kHookRotQ) && !hp.hooked(kHookRotK)) {
    x.qkv = rotary(x.qkv, x.H + x.Hkv, pos, m.rotary_cos_sin, c.rope, /*in_place=*/true);
    x.q = x.k = x.v = Tensor();  // split again, from the turned buffer, if needed
    return;
  }
  x.split_packed();
  if (c.qk_norm) {
    x.q = hp.heads(kHookQNormed, head_rms_norm(x.q, x.H, x.dh, m.q_norm->weight, c.norm_eps, c.qk_norm_one_plus), x.H);
    x.k = hp.heads(kHookKNormed, head_rms_norm(x.k, x.Hkv, x.dh, m.k_norm->weight, c.norm_eps, c.qk_norm_one_plus), x.Hkv);
  }
  if (c.rotary) {
    x.q = hp.heads(kHookRotQ, rotary(x.q, x.H, pos, m.rotary_cos_sin, c.rope), x.H);
    x.k = hp.heads(kHookRotK, rotary(x.k, x.Hkv, pos, m.rotary_cos_sin, c.rope), x.Hkv);
  }
  if (x.packed) x.qkv = concat({x.q, x.k, x.v}, 2);
}

// Step 2: append this call's keys and values (B, T, Hkv*dh) to the cache buffers, which grow
// only when full, and point k and v at the buffers. Returns the rows filled: the keys to attend to.
int64_t append_to_cache(KVCacheLayer& c, Tensor& k, Tensor& v) {
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
  k = c.k;
  v = c.v;
  return need;
}

// Step 3 when a forward hook replaces the scores: they are recomputed beside the fused op for
// the hook, and the pattern is the softmax of the replacement (masked keys: -inf, weight 0).
// Undefined when the hook keeps them (the fused op then runs as usual).
Tensor pattern_of_replaced_scores(Projected& x, const AttentionArgs& a, const HookPoints& hp,
                                  const std::string& scores_name, int64_t Tk) {
  if (!hp.hk || !hp.hk->has_forward(scores_name)) return Tensor();
  x.split_packed();
  const Tensor S = attention_scores(x.q, x.k, a, Tk);
  const Tensor S2 = hp.hk->apply(scores_name, S, /*tap_for_backward=*/false);
  return S2.same(S) ? Tensor() : softmax(hp.hk->tapped(scores_name, S2), -1);
}

// Step 3, fused (the usual path). The fused op hands out the pattern for reading and, in
// backward, dL/dP (from which dL/dS follows) for backward hooks; only a forward hook that
// replaces the pattern takes the unfused path from there on.
Tensor attend_fused(Projected& x, AttentionArgs& a, const HookPoints& hp, const std::string& scores_name,
                    const std::string& pattern_name, int64_t B, int64_t Tq, int64_t Tk) {
  const Hooks* hk = hp.hk;
  const bool pattern_hooked = hp.hooked(kHookPattern);
  const bool grads_wanted = hk && grad_enabled() && (hk->has_backward(pattern_name) || hk->has_backward(scores_name));
  // the fused op's P, shared with the backward hook of the scores (allocated only for hooks)
  auto pattern = pattern_hooked || grads_wanted ? std::make_shared<Tensor>() : nullptr;
  if (grads_wanted) {
    a.pattern_grad = Tensor::zeros({B, x.H, Tq, Tk});
    a.on_pattern_grad = [hooks = *hk, pattern_name, scores_name, pattern](const Tensor& dP) {
      if (hooks.has_backward(pattern_name)) hooks.backward_at(pattern_name, dP);
      if (hooks.has_backward(scores_name)) hooks.backward_at(scores_name, softmax_backward(*pattern, dP));
    };
  }
  const bool want_pattern = pattern_hooked || grads_wanted;
  Tensor z = x.packed ? attention_packed(x.qkv, a, want_pattern ? pattern.get() : nullptr)  // qkv holds any replacement
                      : attention(x.q, x.k, x.v, a, want_pattern ? pattern.get() : nullptr);
  if (pattern_hooked) {
    const Tensor P2 = hk->apply(pattern_name, *pattern, /*tap_for_backward=*/false);  // detached
    if (!P2.same(*pattern)) {
      x.split_packed();
      z = attention_from_pattern(hk->tapped(pattern_name, P2), x.v, a);  // the replacement decides the output
    }
  }
  return z;
}

// Step 3 with a soft-cap on the scores, from differentiable primitive ops (the fused op has no
// cap): hook_attn_scores sees the scaled scores before the cap (masked keys -inf), then
// cap * tanh(scores / cap), the additive mask and the masks again, hook_attn_scores_capped,
// softmax, hook_pattern, dropout, P V.
Tensor attend_capped(Projected& x, const AttentionArgs& a, const HookPoints& hp, float cap, int64_t Tk,
                     const std::string& scores_name, const std::string& pattern_name) {
  x.split_packed();
  Tensor S = mask_scores(scaled_scores(x.q, x.k, a, Tk), a, /*additive=*/false);
  if (hp.hooked(kHookScores)) S = hp.hk->apply(scores_name, S);
  Tensor C = mask_scores(mul_scalar(tanh(mul_scalar(S, 1.f / cap)), cap), a);
  if (hp.hooked(kHookScoresCapped)) C = hp.hk->apply(hp.pre + kHookScoresCapped, C);
  Tensor P = softmax(C, -1);
  if (hp.hooked(kHookPattern)) P = hp.hk->apply(pattern_name, P);
  if (a.dropout > 0.f) P = dropout(P, a.dropout, *a.rng, true);
  return attention_from_pattern(P, x.v, a);
}

// Step 3: z (B, Tq, H*dh), the gated head outputs: the fused op, unless a forward hook replaces
// the scores or the pattern, or the scores are soft-capped. kv_len: the cache's filled rows, or 0.
Tensor attend(Projected& x, AttentionArgs& a, const HookPoints& hp, int64_t B, int64_t Tq, int64_t kv_len, float softcap) {
  const int64_t Tk = kv_len ? kv_len : (x.packed ? Tq : x.k.size(1));
  const std::string scores_name = hp.hk ? hp.pre + kHookScores : std::string(),  // no strings
                    pattern_name = hp.hk ? hp.pre + kHookPattern : std::string();      // without hooks
  if (softcap > 0.f) return attend_capped(x, a, hp, softcap, Tk, scores_name, pattern_name);
  Tensor P = pattern_of_replaced_scores(x, a, hp, scores_name, Tk);
  if (!P.defined()) return attend_fused(x, a, hp, scores_name, pattern_name, B, Tq, Tk);
  // unfused from the replaced scores' pattern on: hook_pattern, dropout, P V
  if (hp.hooked(kHookPattern)) P = hp.hk->apply(pattern_name, P);
  if (a.dropout > 0.f) P = dropout(P, a.dropout, *a.rng, true);
  return attention_from_pattern(P, x.v, a);
}

// Step 4: the output W_O z (B, Tq, d_model) from z (B, Tq, H*dh). hook_result sees each head's
// contribution z_h W_O[:, h]^T, (B, Tq, H, d_model), whose sum (+ bias) is the output: a
// replacement is summed into the output; else the output keeps its one product and a backward
// hook receives dL/d(output) for every head (the gradient of each head's contribution).
Tensor output_projection(const MultiHeadAttention& m, const Tensor& z, const HookPoints& hp) {
  if (!hp.hooked(kHookResult)) return m.W_O.forward(z);
  const Hooks* hk = hp.hk;
  const std::string result_name = hp.pre + kHookResult;
  const int H = m.cfg.n_heads;
  const int64_t dh = hp.dh, B = z.size(0), Tq = z.size(1);
  if (hk->has_forward(result_name)) {
    std::vector<Tensor> per_head;
    for (int h = 0; h < H; ++h) {
      const Tensor zh = slice(z, 2, h * dh, (h + 1) * dh), wh = slice(m.W_O.weight, 1, h * dh, (h + 1) * dh);
      per_head.push_back(reshape(matmul(zh, wh, false, true), {B, Tq, 1, m.cfg.d_model}));
    }
    const Tensor result = concat(per_head, 2);
    const Tensor r2 = hk->apply(result_name, result, /*tap_for_backward=*/false);
    if (!r2.same(result)) {
      const Tensor out = sum(hk->tapped(result_name, r2), {2});
      return m.W_O.bias.defined() ? add(out, m.W_O.bias) : out;
    }
  }
  if (hk->has_backward(result_name) && grad_enabled()) {
    const Hooks hooks = *hk;
    const int heads = H;
    return tap(m.W_O.forward(z), [hooks, result_name, heads](const Tensor& g) {  // g (B, Tq, d_model)
      const int64_t rows = g.numel() / g.size(-1), D = g.size(-1);
      Tensor per_head = Tensor::empty({g.size(0), g.size(1), heads, D});
      for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < heads; ++h) std::copy(g.data() + r * D, g.data() + (r + 1) * D, per_head.data() + (r * heads + h) * D);
      hooks.backward_at(result_name, per_head);
    });
  }
  return m.W_O.forward(z);
}

}  // namespace

Tensor head_rms_norm(const Tensor& t, int heads, int64_t dh, const Tensor& w, float eps, bool one_plus) {
  const Tensor x = reshape(t, {t.numel() / (heads * dh), heads, dh});
  const Tensor inv = pow(add_scalar(mean(mul(x, x), {-1}, true), eps), -0.5f);  // (rows, heads, 1)
  return reshape(mul(mul(x, inv), one_plus ? add_scalar(w, 1.f) : w), t.shape());
}

Tensor attention_varlen_capped(const Tensor& qkv, std::span<const int32_t> len, const AttentionArgs& a_in, float softcap) {
  if (!(softcap > 0.f)) fail("attention: soft-cap ", softcap, " must be positive");
  AttnDims d = packed_columns(qkv, a_in, 2, "packed sequences", "(rows, (heads + 2 kv_heads) d_head)");
  if (a_in.kv_len || a_in.pattern_grad.defined() || a_in.on_pattern_grad || a_in.additive_mask.defined() || !a_in.causal)
    fail("attention: soft-capped packed sequences are causal, with no kv_len or additive mask and no pattern gradient");
  const int64_t B = static_cast<int64_t>(len.size()), n = qkv.size(0), W = qkv.size(1);
  int64_t longest = 0, rows = 0;
  for (int32_t l : len) {
    if (l < 0) fail("attention: sequence length ", l, " < 0");
    longest = std::max<int64_t>(longest, l), rows += l;
  }
  if (rows != n) fail("attention: sequence lengths add up to ", rows, ", qkv has ", n, " rows");
  if (longest == 0) return Tensor::zeros({0, d.H * d.dh});
  // padded row (b, t) <- packed row start_b + t, or the zero row n after the sequence
  Ids padded(Shape{B * longest}), packed(Shape{n});
  for (int64_t b = 0, start = 0; b < B; start += len[static_cast<size_t>(b)], ++b)
    for (int64_t t = 0; t < longest; ++t) {
      const bool real = t < len[static_cast<size_t>(b)];
      padded.data[static_cast<size_t>(b * longest + t)] = static_cast<int32_t>(real ? start + t : n);
      if (real) packed.data[static_cast<size_t>(start + t)] = static_cast<int32_t>(b * longest + t);
    }
  const Tensor grid = reshape(gather_rows(concat({qkv, Tensor::zeros({1, W})}, 0), padded), {B, longest, W});
  const std::vector<Tensor> p = split(grid, {d.H * d.dh, d.Hkv * d.dh, d.Hkv * d.dh}, 2);
  AttentionArgs a = a_in;
  a.d_head = static_cast<int>(d.dh);
  a.n_kv_heads = static_cast<int>(d.Hkv);
  a.window = std::min<int64_t>(a.window, longest);
  const Tensor S = mask_scores(scaled_scores(p[0], p[1], a, longest), a, /*additive=*/false);  // (B, H, longest, longest)
  Tensor P = softmax(mask_scores(mul_scalar(tanh(mul_scalar(S, 1.f / softcap)), softcap), a), -1);
  if (a.dropout > 0.f) P = dropout(P, a.dropout, *a.rng, true);
  const Tensor z = attention_from_pattern(P, p[2], a);  // (B, longest, H*dh)
  return gather_rows(reshape(z, {B * longest, d.H * d.dh}), packed);
}

std::vector<HookPointInfo> MultiHeadAttention::hook_points(const AttentionConfig& c) {
  const std::string H = std::to_string(c.n_heads), Hkv = std::to_string(c.kv_heads()), dh = std::to_string(c.head_dim()),
                    D = std::to_string(c.d_model);
  std::vector<HookPointInfo> p = {
      {kHookQInput, "(B, T, " + H + ", " + D + ")",
       "input of the queries, a copy per head: each head's q from its own (computed only when hooked)"},
      {kHookKInput, "(B, T, " + Hkv + ", " + D + ")",
       "input of the keys, a copy per kv head: each head's k from its own (computed only when hooked)"},
      {kHookVInput, "(B, T, " + Hkv + ", " + D + ")",
       "input of the values, a copy per kv head: each head's v from its own (computed only when hooked)"},
      {kHookQ, "(B, T, " + H + ", " + dh + ")", "queries per head"},
      {kHookK, "(B, T, " + Hkv + ", " + dh + ")", "keys per kv head"},
      {kHookV, "(B, T, " + Hkv + ", " + dh + ")", "values per kv head"}};
  if (c.qk_norm) {
    p.push_back({kHookQNormed, "(B, T, " + H + ", " + dh + ")", "queries after the QK-norm"});
    p.push_back({kHookKNormed, "(B, T, " + Hkv + ", " + dh + ")", "keys after the QK-norm"});
  }
  if (c.rotary) {
    p.push_back({kHookRotQ, "(B, T, " + H + ", " + dh + ")", "queries turned by their positions (rotary)"});
    p.push_back({kHookRotK, "(B, T, " + Hkv + ", " + dh + ")", "keys turned by their positions (rotary)"});
  }
  if (c.softcap > 0.f) {
    p.push_back({kHookScores, "(B, " + H + ", T, T)", "scaled scores before the soft-cap (-inf where masked)"});
    p.push_back({kHookScoresCapped, "(B, " + H + ", T, T)", "soft-capped, masked scores before softmax (-inf where masked)"});
  } else {
    p.push_back({kHookScores, "(B, " + H + ", T, T)", "scaled, masked scores before softmax (-inf where masked)"});
  }
  p.push_back({kHookPattern, "(B, " + H + ", T, T)", "attention weights (rows: queries, columns: keys)"});
  p.push_back({kHookZ, "(B, T, " + H + ", " + dh + ")", "head outputs (gated) before W_O"});
  p.push_back({kHookResult, "(B, T, " + H + ", " + D + ")", "each head's contribution to the residual stream (computed only when hooked)"});
  return p;
}

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
  a.scale = cfg.scale;
  a.window = cfg.window;
  return a;
}

Tensor MultiHeadAttention::forward(const Tensor& x_q, const Tensor& x_kv, const Call& call) {
  if (!call.live_len.empty()) {
    return forward_packed_sequences(*this, x_q, x_kv, call, args_for(call, 0));
  }
  const HookPoints hp{call.hooks, call.hook_prefix, cfg.head_dim()};
  // 1. q, k, v: self-attention without a cache projects them in one packed product
  if (cfg.rotary && x_kv.defined()) fail("attention: rotary positions are for self-attention (x_kv given)");
  Projected x = project_qkv(*this, x_q, x_kv, !x_kv.defined() && !call.kv_cache, hp);
  norm_and_turn(*this, x, call, hp);  // QK-norm, rotary positions
  // 2. KV cache: append this call's keys and values, attend to all of them
  const int64_t kv_len = call.kv_cache ? append_to_cache(*call.kv_cache, x.k, x.v) : 0;
  // 3. attend: the gated head outputs z (B, Tq, H*dh)
  AttentionArgs a = args_for(call, kv_len);
  Tensor z = attend(x, a, hp, x_q.size(0), x_q.size(1), kv_len, cfg.softcap);
  z = hp.heads(kHookZ, z, cfg.n_heads);
  // 4. result: W_O z (B, Tq, d_model), through each head's contribution when that is hooked
  return output_projection(*this, z, hp);
}

}  // namespace hl
