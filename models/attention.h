// Multi-head attention for studying heads.
//
// `attention` is one fused op (forward + backward in models/attention_op.cpp): scores, masks,
// softmax, dropout, P V and per-head gates, with no split/merge copies. Head h of
// q (B, Tq, H*dh) is the (Tq, dh) matrix at column offset h*dh with leading dimension H*dh,
// so each (batch, head) pair is a few single-threaded strided sgemm calls, run in parallel
// over (batch, kv-head) with OpenMP. The op keeps the attention pattern P (B, H, Tq, Tk)
// for analysis and can hand out dL/dP after backward.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "lib/nn.h"
#include "lib/ops.h"
#include "models/hooks.h"

namespace hl {

// The differentiable ops defined in models/; tests/test_attention.cpp gradchecks each one.
#define HEADLAB_MODEL_OPS(X) X(attention) X(attention_packed) X(attention_varlen) X(rotary)

struct AttentionArgs {
  int n_heads = 1;
  int n_kv_heads = 0;   // 0 = n_heads; query head h reads kv head h / (n_heads / n_kv_heads)
  int d_head = 0;       // 0 = q's width / n_heads
  float scale = 0.f;    // 0 = 1/sqrt(d_head)
  bool causal = false;  // query i sees keys j <= i + (Tk - Tq) (so a KV cache works)
  Tensor additive_mask; // broadcast to (B, H, Tq, Tk): e.g. (Tq,Tk), (B,1,1,Tk), (B,H,Tq,Tk)
  Tensor key_padding;   // (B, Tk), non-zero = padded key (weight 0)
                        // (both masks are read again in backward, which may recompute the
                        // weights: change neither in place between forward and backward)
  Tensor gates;         // (H) multipliers on each head's output; differentiable; may be undefined
  float dropout = 0.f;  // on the attention weights, training only
  Rng* rng = nullptr;   // for dropout
  Tensor pattern_grad;  // if defined, (B,H,Tq,Tk), zeros: backward adds dL/dP into it
  std::function<void(const Tensor& dP)> on_pattern_grad;  // then called with it (backward hooks)
  int64_t kv_len = 0;   // 0 = k.size(1); else only the first kv_len rows of k and v are keys
                        // (a KV-cache buffer holds more rows than are filled)
  int64_t window = 0;   // > 0, causal only: query i sees the last `window` keys up to its own
                        // (sliding-window attention); 0 = all of them
};

// q (B, Tq, H*dh), k and v (B, Tk, Hkv*dh) -> (B, Tq, H*dh): per head g_h * softmax(q k^T
// * scale + mask) v, heads concatenated in order. If `pattern` is given it receives P
// (B, H, Tq, Tk), the softmax output before dropout. A row whose keys are all masked gives
// zeros, never NaN.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& args,
                 Tensor* pattern = nullptr);

// The same op on one packed tensor qkv (B, T, (H + 2 Hkv) dh) whose columns are q's heads, then
// k's, then v's (the output of one linear_stacked over W_Q, W_K, W_V): self-attention with no
// copies to split it. Gradients land in one (B, T, (H + 2 Hkv) dh) block. No kv_len.
Tensor attention_packed(const Tensor& qkv, const AttentionArgs& args, Tensor* pattern = nullptr);

// Self-attention within each of B sequences of their own lengths, packed back to back: qkv
// (sum of len, (H + 2 Hkv) dh) as in attention_packed, sequence b being len[b] consecutive rows
// -> (sum of len, H*dh). No position is computed beyond its sequence (a batch's padding costs
// nothing). key_padding, if given, is (B, longest len). No pattern, additive mask or kv_len.
Tensor attention_varlen(const Tensor& qkv, std::span<const int32_t> len, const AttentionArgs& a);

// attention_varlen with soft-capped scores, softcap * tanh(scores / softcap) after scaling (Gemma
// 2): the fused op has no cap, so the sequences are laid out padded, (B, longest, ...), and
// attended by differentiable primitive ops; the padding after a sequence is never a key of its
// positions (causal), and the result comes back packed, (sum of len, H*dh). Dropout as `a` says.
Tensor attention_varlen_capped(const Tensor& qkv, std::span<const int32_t> len, const AttentionArgs& a, float softcap);

// RMSNorm over d_head of each of the `heads` heads of t (..., heads*dh) with the (dh) weight w
// shared by the heads (the QK-norm): x / sqrt(mean(x^2) + eps) * w, or * (1 + w) with one_plus (Gemma 3).
Tensor head_rms_norm(const Tensor& t, int heads, int64_t dh, const Tensor& w, float eps, bool one_plus = false);

// Rotary position embeddings (RoPE, Su et al.): the pair (a, b) of a head's columns at position
// p turns by the angle p * theta^(-2i/dim): a' = a cos - b sin, b' = b cos + a sin.
struct RotaryArgs {
  int64_t d_head = 0;
  int64_t dim = 0;          // columns of each head that turn (even, <= d_head); 0 = d_head
  float theta = 10000.f;
  bool interleaved = false; // pairs (2i, 2i+1) as GPT-J; else (i, i + dim/2), rotate-half as Llama/NeoX
  int64_t rot_dim() const { return dim ? dim : d_head; }
};
// cos and sin of every angle for positions 0..positions-1: (positions, dim) as dim/2 cosines then
// dim/2 sines per row (computed in double, rounded once). What rotary() reads.
Tensor rotary_table(int64_t positions, const RotaryArgs& a);
// While one is alive on this thread, rotary_table hands out one table per (positions, turned
// columns, theta): the layers of one model (TransformerLM's constructor) share it rather than each
// holding a copy (Qwen2.5-0.5B: 24 of 32768 x 64 floats, 200 MB). Tables are read-only once built.
class RotaryTableSharing {
 public:
  RotaryTableSharing();
  ~RotaryTableSharing();
  RotaryTableSharing(const RotaryTableSharing&) = delete;
  RotaryTableSharing& operator=(const RotaryTableSharing&) = delete;

 private:
  friend Tensor rotary_table(int64_t positions, const RotaryArgs& a);
  struct Entry {
    int64_t positions, dim;
    float theta;
    Tensor table;
  };
  RotaryTableSharing* outer_;
  std::vector<Entry> tables_;
};
// x (..., W) with rows of W columns: the first `heads` heads of d_head columns of each row turn
// by that row's position, the other columns pass through (so a packed qkv turns q and k, not v:
// heads = H + Hkv). Row r is at position pos[r % pos.size()] (pos: (T) for (B, T, W), or one per
// row). in_place: x's storage is overwritten and the result shares it (x itself must not be
// read again; its gradient is still its own) - one pass over the buffer, no copy of v.
Tensor rotary(const Tensor& x, int heads, std::span<const int32_t> pos, const Tensor& table, const RotaryArgs& a,
              bool in_place = false);

// Functional scaled dot-product attention without projections: q, k, v (T, H*dk) or
// (B, T, H*dk), heads split by columns. Returns (output, pattern (B, H, Tq, Tk)).
std::pair<Tensor, Tensor> scaled_dot_product_attention(const Tensor& q, const Tensor& k,
                                                       const Tensor& v, int n_heads,
                                                       bool causal = false,
                                                       const Tensor& additive_mask = Tensor());

// Keys and values seen so far, for incremental decoding. The buffers are allocated once at
// `capacity` rows and filled in place, so decoding allocates nothing per token.
struct KVCacheLayer {
  Tensor k, v;         // (B, capacity, Hkv*dh); rows [0, len) are valid
  int64_t len = 0;
  int64_t capacity = 0;  // rows to allocate (the LM sets max_seq_len); 0 = what is needed
  int64_t length() const { return len; }
};

struct AttentionConfig {
  int64_t d_model = 64;
  int n_heads = 4;
  int n_kv_heads = 0;  // 0 = n_heads
  int64_t d_head = 0;  // 0 = d_model / n_heads (must divide)
  bool bias = false;
  float dropout = 0.f;  // attention-weight dropout
  // Today's attention options (docs/architectures.md, "attention options"):
  bool qkv_bias = false, o_bias = false;  // biases on W_Q/W_K/W_V and on W_O (`bias` = both)
  bool rotary = false;                    // rotary positions on q and k (after QK-norm)
  RotaryArgs rope;                        // its dims, theta and pairing (d_head filled in)
  int64_t max_positions = 0;              // positions the rotary table covers (the LM's max_seq_len)
  bool qk_norm = false;   // RMSNorm over d_head on q and k, learned (d_head) weights q_norm, k_norm
  bool qk_norm_one_plus = false;  // the QK-norm's gain is 1 + w (Gemma 3; w starts at 0)
  float norm_eps = 1e-5f;  // of the QK-norm
  float scale = 0.f;       // of the scores; 0 = 1/sqrt(d_head)
  float softcap = 0.f;     // > 0: scores -> softcap * tanh(scores / softcap), after scaling
  int64_t window = 0;      // > 0: each query sees the last `window` keys up to its own
  bool has_qkv_bias() const { return bias || qkv_bias; }
  bool has_o_bias() const { return bias || o_bias; }
  int kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return d_head ? d_head : d_model / n_heads; }
  void validate() const;  // throws naming the bad value
};

class MultiHeadAttention : public Module {
 public:
  // The hook points attention makes (hook_q_input ... hook_result), in the order it makes them.
  static std::vector<HookPointInfo> hook_points(const AttentionConfig& c);
  MultiHeadAttention(const AttentionConfig& cfg, Rng& init_rng, Rng* dropout_rng = nullptr);

  struct Call {
    bool causal = false;
    Tensor additive_mask;
    Tensor key_padding;            // (B, Tk)
    KVCacheLayer* kv_cache = nullptr;  // append this call's keys/values, attend to all
    // Sequences packed back to back: x_q is (sum of live_len, d_model), sequence b its live_len[b]
    // consecutive rows (self-attention without hooks or cache); the output is the same shape.
    std::span<const int32_t> live_len;
    const Ids* output_rows = nullptr;  // with live_len: the output only at these packed rows
    // Position ids of x_q's rows for rotary positions: (T), the same for every sequence, (B, T)
    // one per row and position (a padded batch's), or with live_len one per packed row. Empty:
    // 0..T-1 after the KV cache's filled rows.
    std::span<const int32_t> positions;
    const Hooks* hooks = nullptr;  // hook points hook_prefix + hook_q_input, hook_k_input, hook_v_input,
    std::string hook_prefix;       //   hook_q, hook_k, hook_v, hook_attn_scores, hook_pattern, hook_z, hook_result
  };
  // x_q (B, Tq, d_model); x_kv (B, Tk, d_model) for cross-attention or undefined for self.
  // Hook points (shapes): hook_q_input (B,Tq,H,d_model), hook_k_input and hook_v_input
  // (B,Tk,Hkv,d_model): the input copied per head, each head projected from its own copy
  // (computed only when hooked, as TransformerLens's use_split_qkv_input), hook_q (B,Tq,H,dh), hook_k and hook_v (B,Tk,Hkv,dh),
  // hook_attn_scores (B,H,Tq,Tk) scaled and masked (-inf) before softmax, hook_pattern
  // (B,H,Tq,Tk), hook_z (B,Tq,H,dh) gated head outputs before W_O, hook_result (B,Tq,H,d_model)
  // each head's contribution to the output (computed only when hooked; W_O's bias not included).
  Tensor forward(const Tensor& x_q, const Tensor& x_kv, const Call& call);

  AttentionConfig cfg;
  // W_Q, W_K and W_V (and their biases) are consecutive rows of one block of storage, so
  // self-attention projects with one sgemm (linear_stacked) and feeds attention_packed. Each
  // is still its own parameter with its own name and gradient (views of one gradient block).
  Linear W_Q, W_K, W_V, W_O;
  // QK-norm's learned (d_head) weights, shared by the heads (parameters q_norm.weight,
  // k_norm.weight); undefined without qk_norm.
  struct HeadNorm : Module {
    HeadNorm(int64_t d_head, bool one_plus);
    Tensor weight;
  };
  std::unique_ptr<HeadNorm> q_norm, k_norm;
  Tensor rotary_cos_sin;  // rotary_table(max_positions) with rotary; not a parameter
  // Per-head gates (H), ones by default; not a parameter (not in checkpoints' tensors).
  // Call gates.requires_grad_() to get dL/dg (Michel et al. head importance).
  Tensor gates;

 private:
  AttentionArgs args_for(const Call& call, int64_t kv_len) const;  // the op's arguments for a call
  Rng* dropout_rng_;
};

}  // namespace hl
