// FeedForward, TransformerBlock (pre- or post-norm) and the decoder-only TransformerLM, with
// the exact semantics and parameter names of docs/formats.md.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "models/attention.h"

namespace hl {

enum class Norm { Pre, Post };
// Learned and sinusoidal positions are added to the embeddings; rotary ones turn q and k in
// every layer's attention; none (NoPE) has no positional signal but the causal mask.
enum class Positions { Learned, Sinusoidal, Rotary, None };
enum class Mlp { Plain, SwiGLU, GeGLU };  // GeGLU's gelu is `activation`'s (gelu_tanh or gelu_erf)

struct ModelConfig {
  int64_t vocab_size = 13;
  int64_t d_model = 64;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 0;   // 0 = n_heads
  int64_t d_head = 0;   // 0 = d_model / n_heads
  int64_t d_ff = 256;   // 0 = attention-only: blocks without MLP (and without ln2)
  int64_t max_seq_len = 64;
  Norm norm = Norm::Pre;
  Activation activation = Activation::GeluTanh;
  Positions positions = Positions::Learned;
  bool attn_bias = false;
  bool mlp_bias = true;
  bool head_bias = false;  // bias on the output Linear (the PyTorch bench model has one)
  float layer_norm_eps = 1e-5f;
  float dropout = 0.f;       // embeddings and residual branches
  float attn_dropout = 0.f;  // attention weights
  // attention options (docs/architectures.md, "attention options"); the defaults are today's
  // attention, and a config without these keys reads as the defaults
  float rope_theta = 10000.f;          // rotary positions: angle base
  float rope_theta_local = 0.f;        // > 0: the angle base of the local (sliding-window) layers (Gemma 3); 0 = rope_theta
  int64_t rotary_dim = 0;              // rotary positions: dims of each head that turn; 0 = rotary_pct's
  float rotary_pct = 1.f;              // rotary positions with rotary_dim 0: this fraction of d_head (Pythia 0.25)
  std::string rotary_style = "half";   // half (rotate-half, Llama/NeoX) or interleaved (GPT-J)
  bool qk_norm = false;                // RMSNorm over d_head on q and k (Qwen3, OLMo2); (1 + w) with rmsnorm_1p (Gemma 3)
  float attn_scale = 0.f;              // score scale; 0 = 1/sqrt(d_head); 1 = unscaled (GPT-Neo)
  float attn_softcap = 0.f;            // > 0: scores -> cap * tanh(scores / cap) (Gemma 2)
  int64_t sliding_window = 0;          // > 0: local layers see the last this many keys
  std::string window_layers = "all";   // which layers are local: all, alternate (even ones), L:G, or one L/G per layer ("GLGL")
  bool qkv_bias = false, o_bias = false;  // biases on W_Q/W_K/W_V, on W_O (attn_bias = both)
  int64_t window_of_layer(int layer) const;  // layer's sliding window, 0 = global
  // the dims of each head rotary positions turn: rotary_dim, or floor(rotary_pct * d_head) as GPT-NeoX
  int64_t rotary_dims() const {
    return rotary_dim ? rotary_dim : static_cast<int64_t>(static_cast<double>(rotary_pct) * static_cast<double>(head_dim()) + 1e-4);
  }
  // block options (docs/architectures.md); the defaults are the GPT-2-style block
  NormKind normalization = NormKind::LayerNorm;  // ln1, ln2, ln_f (and the sandwich norms); eps layer_norm_eps
  bool sandwich_norm = false;   // ln1_post / ln2_post on attention's and the MLP's output (Gemma 2)
  Mlp mlp = Mlp::Plain;         // gated: fc2(act(gate x) * fc1 x)
  bool parallel_block = false;  // x + attn(ln1 x) + mlp(ln2 x) (GPT-NeoX, GPT-J)
  bool embed_scale = false;     // token embeddings times sqrt(d_model) (Gemma)
  float final_softcap = 0.f;    // logits -> cap tanh(logits / cap); 0 = none
  std::string arch;             // the --arch preset it was made with: provenance only, "" = none

  int kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return d_head ? d_head : d_model / n_heads; }
  bool has_mlp() const { return d_ff > 0; }
  bool gated_mlp() const { return mlp != Mlp::Plain; }
  Activation gate_activation() const { return mlp == Mlp::SwiGLU ? Activation::Silu : activation; }
  AttentionConfig attention(int layer = 0) const;  // layer: which window it has
  void validate() const;  // one clear message for the first bad value
  std::string to_json() const;  // the "config" metadata (docs/formats.md)
  static ModelConfig from_json(const std::string& text, const std::string& source);
};

std::string to_string(Norm n);
std::string to_string(Activation a);
std::string to_string(Positions p);
std::string to_string(NormKind n);
std::string to_string(Mlp m);
NormKind parse_normalization(const std::string& s);
Mlp parse_mlp(const std::string& s);
Norm parse_norm(const std::string& s);
Activation parse_activation(const std::string& s);
Positions parse_positions(const std::string& s);

class FeedForward : public Module {
 public:
  // Plain: fc2(act(fc1 x)). Gated (SwiGLU, GeGLU): fc2(act(gate x) * fc1 x), gate (d_ff, d_model)
  // made after fc1 and fc2 (a plain model's initialisation draws stay as they were).
  FeedForward(const ModelConfig& cfg, Rng& rng);
  // (..., d_model) -> (..., d_model). Hook points prefix + hook_pre (..., d_ff) before the
  // activation (a gated MLP's: gate x), hook_pre_linear (gated only: fc1 x) and hook_post
  // (..., d_ff), what fc2 reads.
  Tensor forward(const Tensor& x, const Hooks* hooks = nullptr, const std::string& prefix = "") const;
  static std::vector<HookPointInfo> hook_points(const ModelConfig& cfg);
  Linear fc1, fc2;
  std::unique_ptr<Linear> gate;  // gated MLPs only
  Activation act;                // of the plain MLP, or of the gate
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(const ModelConfig& cfg, Rng& rng, Rng* dropout_rng, int layer = 0);
  // x (B, T, d_model) -> (B, T, d_model). Hook points (prefix "blocks.{l}."): hook_resid_pre,
  // ln1.hook_normalized (pre-norm), attn.*, [ln1_post.*], hook_attn_out, hook_resid_mid,
  // ln2.hook_normalized (pre-norm), mlp.hook_pre, [mlp.hook_pre_linear], mlp.hook_post,
  // [ln2_post.*], hook_mlp_out, hook_resid_post; all (B, T, d_model) but the attention's and the
  // MLP's (d_ff). Attention-only (d_ff 0): no hook_resid_mid, ln2, mlp.*. A parallel block has
  // no hook_resid_mid (nothing sits between attention and the MLP): hook_attn_out and
  // hook_mlp_out are both added to hook_resid_pre. hook_attn_out / hook_mlp_out are what is
  // added to the residual stream (after the sandwich norm when there is one).
  Tensor forward(const Tensor& x, const MultiHeadAttention::Call& call, const Hooks* hooks = nullptr,
                 const std::string& prefix = "");
  // Its hook points and its modules', in forward order, named within the block ("attn.hook_q").
  static std::vector<HookPointInfo> hook_points(const ModelConfig& cfg);
  Norm norm;
  bool parallel;  // attention and MLP both read the block's input (ModelConfig::parallel_block)
  LayerNorm ln1;
  MultiHeadAttention attn;
  std::unique_ptr<LayerNorm> ln2;    // null in an attention-only model (d_ff 0)
  std::unique_ptr<FeedForward> ffn;  // likewise
  // sandwich norms (ModelConfig::sandwich_norm): on attention's and the MLP's output before
  // each residual add; null without
  std::unique_ptr<LayerNorm> ln1_post, ln2_post;
  Dropout resid_dropout;
};

// Everything the LM forward can be asked to do beyond computing logits.
struct ForwardOptions {
  Tensor key_padding;                    // (B, T), non-zero = padding (never attended to)
  // (B, T) each token's position; null = 0..T-1 (after a KV cache's tokens). A left-padded row's
  // positions start at its first real token (positions_from_padding), as TransformerLens's do;
  // hook_pos_embed is then (B, T, d_model). Not with live_len.
  const Ids* position_ids = nullptr;
  const Hooks* hooks = nullptr;          // named hook points (models/hooks.h); none = fast path
  std::vector<KVCacheLayer>* kv_cache = nullptr;  // incremental decoding (no grad)
  // Compute only the first live_len[b] positions of row b (0 <= live_len[b] <= T): in a causal
  // model later positions change nothing before them, so the padding after a row's last target
  // costs nothing. Logits then come back packed, (sum of live_len, vocab): row 0's positions,
  // then row 1's, and so on. Not with hooks or a KV cache. Empty = every position.
  std::span<const int32_t> live_len;
  // With live_len: logits only for these of the packed positions (e.g. those with a target; the
  // last block then runs its attention output, feed-forward and the head on them alone).
  const Ids* output_rows = nullptr;
  // >= 0: run blocks 0..stop_at_layer-1 only and return the residual stream there, (B, T,
  // d_model), with no final norm and no unembedding (TransformerLens's stop_at_layer): a study
  // that reads attention patterns then never makes the (B, T, vocab) logits. -1 = the logits.
  int stop_at_layer = -1;
};

// The positions of a padded batch from its key_padding (B, T): each token's count of real
// tokens before it (0 for padding before the first), so a row's real tokens sit at 0, 1, ...
// wherever the padding is. `offset`: real tokens already cached before column 0 (per row, or
// none = 0).
Ids positions_from_padding(const Tensor& key_padding, const std::vector<int32_t>& offset = {});

struct Sae;  // models/sae.h

// An SAE attached to a model (TransformerLM::add_sae), SAELens's HookedSAETransformer.add_sae.
struct AttachedSae {
  std::shared_ptr<const Sae> sae;
  bool use_error_term = true;
};

class TransformerLM : public Module {
 public:
  TransformerLM(const ModelConfig& cfg, uint64_t seed);
  // ids (B, T) -> logits (B, T, vocab). With a KV cache, positions continue after the cached
  // tokens and only the new tokens' logits are returned.
  Tensor forward(const Ids& ids, const ForwardOptions& opt = {});
  // The forward from block `layer` on (0 <= layer <= n_layers; n_layers = only ln_final and the
  // head): resid_pre is block `layer`'s input, (B, T, d_model), or with opt.live_len the live
  // positions packed, (sum of live_len, d_model). Hooks (of block `layer` on) are honoured;
  // forward_from(l, the forward's hook_resid_pre of block l) gives the forward's logits bit for
  // bit. What patching runs when only block `layer` on can change. With opt.kv_cache (one entry
  // per layer, those from `layer` on holding the same number of positions; not with live_len),
  // resid_pre is the positions after the cached ones, which it appends to the cache.
  Tensor forward_from(int layer, const Tensor& resid_pre, const ForwardOptions& opt = {});
  // The final residual stream (..., d_model) -> logits (..., vocab): ln_final, the head and its
  // soft-cap, as the forward ends (no hooks).
  Tensor unembed(const Tensor& resid);
  // The forward with every activation whose name passes `filter` recorded (and, with_grads, its
  // gradient filled in by a later backward): returns (logits (B, T, vocab), cache).
  std::pair<Tensor, ActivationCache> run_with_cache(const Ids& ids, NameFilter filter, bool with_grads = false,
                                                    const Tensor& key_padding = Tensor());
  // Per-head gates of layer l (H); ones unless pruned. Not parameters.
  Tensor& gates(int layer) {
    if (layer < 0 || layer >= static_cast<int>(blocks.size()))
      fail("gates: layer ", layer, " is outside 0..", static_cast<int>(blocks.size()) - 1, " (the model has ", blocks.size(), " layers)");
    return blocks[layer]->attn.gates;
  }
  void set_gates_require_grad(bool on);
  // The head's logits as the forward returns them: cap tanh(logits / cap) with final_softcap, else as they are.
  Tensor cap_logits(const Tensor& logits) const;
  std::vector<std::vector<float>> gate_values() const;  // (n_layers, H)
  bool gates_all_one() const;

  ModelConfig cfg;
  Rng init_rng;     // one stream for all initialisers, in construction order: a seed fixes the model
  Rng dropout_rng;
  Embedding tok_emb;
  std::unique_ptr<Embedding> pos_emb;  // learned positions only
  Tensor sinusoid;                     // (max_seq_len, d_model), sinusoidal positions only
  Dropout emb_dropout;
  std::vector<std::unique_ptr<TransformerBlock>> blocks;
  std::unique_ptr<LayerNorm> ln_f;     // pre-norm only
  Linear head;

  // ---- SAEs spliced into every later forward (SAELens's HookedSAETransformer): at its hook
  // point the SAE's features, reconstruction and error become hook points of their own
  // ("<hook>.hook_sae_acts_post": sae_hook_points, models/sae.h), so every tool that takes hooks
  // or hook names patches and ablates features. With the error term (x - x_hat added back) the
  // forward's output is the model's own, bit for bit, until a hook edits a feature; then a
  // forward without hooks skips the SAEs, and a model with none attached runs as before.
  void add_sae(std::shared_ptr<const Sae> sae, bool use_error_term = true);
  void reset_saes() { saes.clear(); }
  // Whether an attached SAE runs without its error term: its x_hat replaces the activation in
  // every forward (which then takes no live_len).
  bool saes_replace_activations() const {
    for (const AttachedSae& a : saes)
      if (!a.use_error_term) return true;
    return false;
  }
  std::vector<AttachedSae> saes;

 private:
  Tensor forward_live(const Ids& ids, const ForwardOptions& opt);  // forward with live_len
  // opt with the attached SAEs spliced into its hooks (spliced_opt, its hooks in spliced_hooks), or
  // false when the forward runs as it is (none attached, already spliced, or only error-term SAEs
  // and no hooks)
  bool splice_saes(const ForwardOptions& opt, ForwardOptions& spliced_opt, std::optional<Hooks>& spliced_hooks) const;
  Tensor token_embeddings(const Ids& ids) const;  // tok_emb, times sqrt(d_model) with embed_scale
  // blocks[layer..] on x, then ln_final and the head: the one tail of forward and forward_from
  Tensor run_blocks(int layer, Tensor x, MultiHeadAttention::Call& call, const ForwardOptions& opt);
  // the attention call of a forward of B rows: causal, with opt's key padding checked as (B, keys)
  MultiHeadAttention::Call causal_call(const ForwardOptions& opt, int64_t B, int64_t keys) const;
  Ids positions_;  // position ids of the last forward, kept to avoid an allocation per step
  Ids live_ids_, live_positions_;  // the live positions' token and position ids (reused)
};

// The hook points of a model with this config, in forward order, gathered from the modules that
// make them: name, shape and meaning, e.g. ("blocks.0.attn.hook_pattern", "(B, 4, T, T)", ...).
std::vector<HookPointInfo> describe_hook_points(const ModelConfig& cfg);
// The same for a model: its config's, and each attached SAE's points after the one it splices.
std::vector<HookPointInfo> describe_hook_points(const TransformerLM& model);
// The same as (name, shape) pairs.
std::vector<std::pair<std::string, std::string>> hook_points(const ModelConfig& cfg);

// Every parameter's name (docs/formats.md) and shape for a config, in named_parameters() order, computed
// without building the model (so a checkpoint's config can be checked against its tensors
// before anything is allocated).
std::vector<std::pair<std::string, Shape>> parameter_shapes(const ModelConfig& cfg);
int64_t parameter_count(const ModelConfig& cfg);

// About how many bytes a forward (and, with training, backward and an Adam step) of a batch of
// B sequences of T tokens needs: parameters (x4 when training: weights, gradients, two Adam
// moments), activations kept for backward and their gradients, the attention patterns. An
// estimate for refusing what cannot fit, not an exact count. logits false: a forward that stops
// before the unembedding (ForwardOptions::stop_at_layer), so no (B, T, vocab) tensor.
double estimate_step_bytes(const ModelConfig& cfg, int64_t B, int64_t T, bool training, bool logits = true);

// Row block of head h in a W_Q/W_K/W_V-shaped (heads*d_head, d_model) matrix, or column block
// of W_O (d_model, heads*d_head): copies (d_head, d_model) or (d_model, d_head).
Tensor head_rows(const Tensor& w, int head, int64_t d_head);
Tensor head_cols(const Tensor& w, int head, int64_t d_head);

}  // namespace hl
