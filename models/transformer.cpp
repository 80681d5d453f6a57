#include "models/transformer.h"

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "models/sae.h"

namespace hl {

using json = nlohmann::json;

std::string to_string(Norm n) { return n == Norm::Pre ? "pre" : "post"; }
std::string to_string(Activation a) {
  switch (a) {
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::GeluErf: return "gelu_erf";
    case Activation::Relu: return "relu";
    case Activation::Relu2: return "relu2";
    case Activation::Silu: return "silu";
  }
  return "?";
}
std::string to_string(Positions p) {
  switch (p) {
    case Positions::Learned: return "learned";
    case Positions::Sinusoidal: return "sinusoidal";
    case Positions::Rotary: return "rotary";
    case Positions::None: return "none";
  }
  return "learned";
}
Norm parse_norm(const std::string& s) {
  if (s == "pre") return Norm::Pre;
  if (s == "post") return Norm::Post;
  fail("unknown norm '", s, "' (expected pre or post)");
}
Activation parse_activation(const std::string& s) {
  if (s == "gelu_tanh" || s == "gelu") return Activation::GeluTanh;
  if (s == "gelu_erf") return Activation::GeluErf;
  if (s == "relu") return Activation::Relu;
  if (s == "relu2") return Activation::Relu2;
  if (s == "silu") return Activation::Silu;
  fail("unknown activation '", s, "' (expected gelu_tanh, gelu_erf, relu, relu2 or silu)");
}
Positions parse_positions(const std::string& s) {
  if (s == "learned") return Positions::Learned;
  if (s == "sinusoidal") return Positions::Sinusoidal;
  if (s == "rotary") return Positions::Rotary;
  if (s == "none") return Positions::None;
  fail("unknown positions '", s, "' (expected learned, sinusoidal, rotary or none)");
}

std::string to_string(NormKind n) {
  return n == NormKind::LayerNorm ? "layernorm" : n == NormKind::RMSNorm ? "rmsnorm" : "rmsnorm_1p";
}
std::string to_string(Mlp m) { return m == Mlp::Plain ? "plain" : m == Mlp::SwiGLU ? "swiglu" : "geglu"; }
NormKind parse_normalization(const std::string& s) {
  if (s == "layernorm") return NormKind::LayerNorm;
  if (s == "rmsnorm") return NormKind::RMSNorm;
  if (s == "rmsnorm_1p") return NormKind::RMSNorm1p;
  fail("unknown normalization '", s, "' (expected layernorm, rmsnorm or rmsnorm_1p)");
}
Mlp parse_mlp(const std::string& s) {
  if (s == "plain") return Mlp::Plain;
  if (s == "swiglu") return Mlp::SwiGLU;
  if (s == "geglu") return Mlp::GeGLU;
  fail("unknown mlp '", s, "' (expected plain, swiglu or geglu)");
}

AttentionConfig ModelConfig::attention(int layer) const {
  AttentionConfig a;
  a.d_model = d_model;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.d_head = d_head;
  a.bias = attn_bias;
  a.dropout = attn_dropout;
  // attention options
  a.qkv_bias = qkv_bias;
  a.o_bias = o_bias;
  a.rotary = positions == Positions::Rotary;
  a.rope.dim = rotary_dims();
  a.rope.theta = rope_theta_local > 0.f && window_of_layer(layer) > 0 ? rope_theta_local : rope_theta;
  a.rope.interleaved = rotary_style == "interleaved";
  a.max_positions = max_seq_len;
  a.qk_norm = qk_norm;
  a.qk_norm_one_plus = normalization == NormKind::RMSNorm1p;  // the QK-norm is of the model's norm kind
  a.norm_eps = layer_norm_eps;
  a.scale = attn_scale;
  a.softcap = attn_softcap;
  a.window = window_of_layer(layer);
  return a;
}

namespace {
// window_layers as one letter per layer (L local, G global: GPT-Neo's and layer_types' patterns),
// or "" when it is not of that form.
bool is_layer_letters(const std::string& s) {
  return !s.empty() && s.find_first_not_of("LG") == std::string::npos;
}
// window_layers "L:G" as (L, G), or (0, 0) when it is not of that form.
std::pair<int, int> local_global(const std::string& s) {
  const size_t colon = s.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size() || s.size() > 12) return {0, 0};
  for (size_t i = 0; i < s.size(); ++i)
    if (i != colon && !std::isdigit(static_cast<unsigned char>(s[i]))) return {0, 0};
  return {std::stoi(s.substr(0, colon)), std::stoi(s.substr(colon + 1))};
}
}  // namespace

int64_t ModelConfig::window_of_layer(int layer) const {
  if (sliding_window <= 0 || window_layers == "all") return sliding_window;
  if (window_layers == "alternate") return layer % 2 == 0 ? sliding_window : 0;  // even layers local (Gemma 2)
  if (is_layer_letters(window_layers))
    return static_cast<size_t>(layer) < window_layers.size() && window_layers[static_cast<size_t>(layer)] == 'L' ? sliding_window : 0;
  const auto [local, global] = local_global(window_layers);
  return layer % (local + global) < local ? sliding_window : 0;  // `local` local layers, then `global` global ones
}

void ModelConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v < 1) fail("model config: ", name, " must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  if (d_ff < 0) fail("model config: d_ff must not be negative (0 = attention-only: no MLP), got ", d_ff);
  positive("max_seq_len", max_seq_len);
  // Caps far above what a CPU trains, so a corrupt config is refused before anything is sized
  // by it (a sinusoidal model has no tensor that could contradict max_seq_len).
  auto at_most = [](const char* name, int64_t v, int64_t cap) {
    if (v > cap) fail("model config: ", name, " ", v, " is above the supported maximum ", cap);
  };
  at_most("vocab_size", vocab_size, int64_t{1} << 24);
  at_most("d_model", d_model, int64_t{1} << 16);
  at_most("n_layers", n_layers, 1024);
  at_most("n_heads", n_heads, 4096);
  at_most("d_ff", d_ff, int64_t{1} << 20);
  at_most("max_seq_len", max_seq_len, int64_t{1} << 20);
  if (!(dropout >= 0.f && dropout < 1.f)) fail("model config: dropout must be in [0, 1), got ", dropout);
  if (!(attn_dropout >= 0.f && attn_dropout < 1.f)) fail("model config: attn_dropout must be in [0, 1), got ", attn_dropout);
  if (!(layer_norm_eps > 0.f) || !std::isfinite(layer_norm_eps))
    fail("model config: layer_norm_eps must be positive, got ", layer_norm_eps);
  // block options: what only the pre-norm block has, and the values that mean nothing
  if (norm == Norm::Post && (sandwich_norm || parallel_block))
    fail("model config: ", sandwich_norm ? "sandwich_norm" : "parallel_block", " needs norm pre (a post-norm block has no such form)");
  if (mlp == Mlp::GeGLU && activation != Activation::GeluTanh && activation != Activation::GeluErf)
    fail("model config: mlp geglu takes activation gelu_tanh or gelu_erf (its gate's gelu), got ", to_string(activation));
  if (!(final_softcap >= 0.f) || !std::isfinite(final_softcap))
    fail("model config: final_softcap must be a positive cap, or 0 for none, got ", final_softcap);
  // attention options: each message names the setting (the flag is it with '-' for '_')
  if (rotary_style != "half" && rotary_style != "interleaved")
    fail("model config: rotary_style '", rotary_style, "' is not half or interleaved");
  if (positions == Positions::Rotary && (rotary_dim < 0 || rotary_dim % 2 || rotary_dim > head_dim()))
    fail("model config: rotary_dim ", rotary_dim, " must be even and at most d_head ", head_dim(), " (0 = rotary_pct's)");
  if (!(rotary_pct > 0.f && rotary_pct <= 1.f)) fail("model config: rotary_pct must be in (0, 1], got ", rotary_pct);
  if (positions == Positions::Rotary && rotary_dim == 0 && (rotary_dims() < 2 || rotary_dims() % 2))
    fail("model config: rotary_pct ", rotary_pct, " of d_head ", head_dim(), " is ", rotary_dims(),
         " dims; rotary needs an even number, at least 2 (or give rotary_dim)");
  if (!(rope_theta > 0.f) || !std::isfinite(rope_theta)) fail("model config: rope_theta must be positive, got ", rope_theta);
  if (!(rope_theta_local >= 0.f) || !std::isfinite(rope_theta_local))
    fail("model config: rope_theta_local must be positive (0 = rope_theta), got ", rope_theta_local);
  if (!(attn_scale >= 0.f) || !std::isfinite(attn_scale))
    fail("model config: attn_scale must be positive (0 = 1/sqrt(d_head)), got ", attn_scale);
  if (!(attn_softcap >= 0.f) || !std::isfinite(attn_softcap))
    fail("model config: attn_softcap must be positive (0 = no cap), got ", attn_softcap);
  if (sliding_window < 0) fail("model config: sliding_window must be positive (0 = none), got ", sliding_window);
  if (is_layer_letters(window_layers)) {
    if (static_cast<int>(window_layers.size()) != n_layers)
      fail("model config: window_layers '", window_layers, "' has ", window_layers.size(), " letters for ", n_layers,
           " layers (one L or G per layer)");
  } else if (window_layers != "all" && window_layers != "alternate") {
    const auto [local, global] = local_global(window_layers);
    if (local < 1 || global < 0)
      fail("model config: window_layers '", window_layers, "' is not all, alternate, L:G (local:global layers, e.g. 5:1) or one L/G per layer");
  }
  if (window_layers != "all" && sliding_window == 0)
    fail("model config: window_layers '", window_layers, "' needs a sliding_window (the local layers' window)");
  for (int l = 0; l < n_layers; ++l) attention(l).validate();
}

std::string ModelConfig::to_json() const {
  json j = {{"vocab_size", vocab_size},   {"d_model", d_model},
            {"n_layers", n_layers},       {"n_heads", n_heads},
            {"n_kv_heads", kv_heads()},   {"d_head", head_dim()},
            {"d_ff", d_ff},               {"max_seq_len", max_seq_len},
            {"norm", to_string(norm)},    {"activation", to_string(activation)},
            {"positions", to_string(positions)}, {"attn_bias", attn_bias},
            {"mlp_bias", mlp_bias},       {"head_bias", head_bias},
            {"layer_norm_eps", layer_norm_eps}};
  // attention options (absent in older files: the defaults, today's attention)
  j["rope_theta"] = rope_theta;
  j["rope_theta_local"] = rope_theta_local;
  j["rotary_dim"] = rotary_dim;
  j["rotary_pct"] = rotary_pct;
  j["rotary_style"] = rotary_style;
  j["qk_norm"] = qk_norm;
  j["attn_scale"] = attn_scale;
  j["attn_softcap"] = attn_softcap;
  j["sliding_window"] = sliding_window;
  j["window_layers"] = window_layers;
  j["qkv_bias"] = qkv_bias;
  j["o_bias"] = o_bias;
  // block options
  j["normalization"] = to_string(normalization);
  j["sandwich_norm"] = sandwich_norm;
  j["mlp"] = to_string(mlp);
  j["parallel_block"] = parallel_block;
  j["embed_scale"] = embed_scale;
  j["final_softcap"] = final_softcap;
  j["arch"] = arch;
  return j.dump();
}

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(source, ": config is not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(source, ": config is not a JSON object");
  ModelConfig c;
  auto get = [&](const char* key, auto& dst, bool required) {
    if (!j.contains(key)) {
      if (required) fail(source, ": config key '", key, "' is missing");
      return;
    }
    try {
      dst = j[key].get<std::decay_t<decltype(dst)>>();
    } catch (const json::exception&) {
      fail(source, ": config key '", key, "' has the wrong type (", j[key].dump(), ")");
    }
  };
  get("vocab_size", c.vocab_size, true);
  get("d_model", c.d_model, true);
  get("n_layers", c.n_layers, true);
  get("n_heads", c.n_heads, true);
  get("n_kv_heads", c.n_kv_heads, false);
  get("d_head", c.d_head, false);
  get("d_ff", c.d_ff, true);
  get("max_seq_len", c.max_seq_len, true);
  std::string norm = "pre", act = "gelu_tanh", pos = "learned";
  get("norm", norm, false);
  get("activation", act, false);
  get("positions", pos, false);
  try {
    c.norm = parse_norm(norm);
    c.activation = parse_activation(act);
    c.positions = parse_positions(pos);
  } catch (const Error& e) {
    fail(source, ": config: ", e.what());
  }
  get("attn_bias", c.attn_bias, false);
  get("mlp_bias", c.mlp_bias, false);
  get("head_bias", c.head_bias, false);
  get("layer_norm_eps", c.layer_norm_eps, false);
  // attention options (absent: the defaults)
  get("rope_theta", c.rope_theta, false);
  get("rope_theta_local", c.rope_theta_local, false);
  get("rotary_dim", c.rotary_dim, false);
  get("rotary_pct", c.rotary_pct, false);
  get("rotary_style", c.rotary_style, false);
  get("qk_norm", c.qk_norm, false);
  get("attn_scale", c.attn_scale, false);
  get("attn_softcap", c.attn_softcap, false);
  get("sliding_window", c.sliding_window, false);
  get("window_layers", c.window_layers, false);
  get("qkv_bias", c.qkv_bias, false);
  get("o_bias", c.o_bias, false);
  // block options (absent in older files: the GPT-2-style block)
  std::string normalization = "layernorm", mlp = "plain";
  get("normalization", normalization, false);
  get("mlp", mlp, false);
  try {
    c.normalization = parse_normalization(normalization);
    c.mlp = parse_mlp(mlp);
  } catch (const Error& e) {
    fail(source, ": config: ", e.what());
  }
  get("sandwich_norm", c.sandwich_norm, false);
  get("parallel_block", c.parallel_block, false);
  get("embed_scale", c.embed_scale, false);
  get("final_softcap", c.final_softcap, false);
  get("arch", c.arch, false);
  try {
    c.validate();
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
  return c;
}

FeedForward::FeedForward(const ModelConfig& c, Rng& rng)
    : fc1(c.d_model, c.d_ff, c.mlp_bias, rng), fc2(c.d_ff, c.d_model, c.mlp_bias, rng), act(c.gate_activation()) {
  register_module("fc1", &fc1);
  register_module("fc2", &fc2);
  if (c.gated_mlp()) {
    gate = std::make_unique<Linear>(c.d_model, c.d_ff, c.mlp_bias, rng);
    register_module("gate", gate.get());
  }
}

namespace {
Tensor activation(const Tensor& x, Activation a) {
  switch (a) {
    case Activation::Relu: return relu(x);
    case Activation::GeluTanh: return gelu_tanh(x);
    case Activation::GeluErf: return gelu_erf(x);
    case Activation::Relu2: return relu2(x);
    case Activation::Silu: return silu(x);
  }
  return x;
}
}  // namespace

// The hook points of the MLP, declared with the code that makes them.
constexpr char kHookPre[] = "hook_pre", kHookPreLinear[] = "hook_pre_linear", kHookPost[] = "hook_post";

std::vector<HookPointInfo> FeedForward::hook_points(const ModelConfig& c) {
  const std::string shape = "(B, T, " + std::to_string(c.d_ff) + ")";
  if (c.gated_mlp())
    return {{kHookPre, shape, "gated MLP's gate pre-activation (gate output)"},
            {kHookPreLinear, shape, "gated MLP's linear branch (fc1 output)"},
            {kHookPost, shape, "gated MLP's act(gate) * linear, into fc2"}};
  return {{kHookPre, shape, "MLP pre-activation (fc1 output)"}, {kHookPost, shape, "MLP activation"}};
}

Tensor FeedForward::forward(const Tensor& x, const Hooks* hk, const std::string& prefix) const {
  if (gate) {  // fc2(act(gate x) * fc1 x); the elementwise middle is one fused op
    auto hook = [&](const char* name, const Tensor& t) { return hk ? hk->apply(prefix + name, t) : t; };
    const Tensor g = hook(kHookPre, gate->forward(x)), u = hook(kHookPreLinear, fc1.forward(x));
    return fc2.forward(hook(kHookPost, gated_act(g, u, act)));
  }
  Tensor h;  // (..., d_ff)
  if (hk && hk->any(prefix + kHookPre))  // the pre-activation exists only on request
    h = activation(hk->apply(prefix + kHookPre, linear(x, fc1.weight, fc1.bias)), act);
  else
    h = linear_act(x, fc1.weight, fc1.bias, act);  // act(fc1(x)) in one pass
  if (hk) h = hk->apply(prefix + kHookPost, h);
  return fc2.forward(h);
}

TransformerBlock::TransformerBlock(const ModelConfig& c, Rng& rng, Rng* dropout_rng, int layer)
    : norm(c.norm),
      parallel(c.parallel_block),
      ln1(c.d_model, c.layer_norm_eps, c.normalization),
      attn(c.attention(layer), rng, dropout_rng),
      resid_dropout(c.dropout, dropout_rng) {
  register_module("ln1", &ln1);
  register_module("attn", &attn);
  if (c.sandwich_norm) {
    ln1_post = std::make_unique<LayerNorm>(c.d_model, c.layer_norm_eps, c.normalization);
    register_module("ln1_post", ln1_post.get());
  }
  register_module("resid_dropout", &resid_dropout);  // so eval() turns it off
  if (c.has_mlp()) {  // after attention's: the initialisation draws in the same order as always
    ln2 = std::make_unique<LayerNorm>(c.d_model, c.layer_norm_eps, c.normalization);
    ffn = std::make_unique<FeedForward>(c, rng);
    register_module("ln2", ln2.get());
    register_module("ffn", ffn.get());
    if (c.sandwich_norm) {
      ln2_post = std::make_unique<LayerNorm>(c.d_model, c.layer_norm_eps, c.normalization);
      register_module("ln2_post", ln2_post.get());
    }
  }
}

// ---- layer norm's hook_scale ----------------------------------------------------------------

constexpr char kScaleShape[] = "(B, T, 1)";

namespace {
std::string scale_what(const ModelConfig& c) {
  return c.normalization == NormKind::LayerNorm
             ? "layer norm's divisor sqrt(var + eps) of each position (as TransformerLens)"
             : "RMSNorm's divisor sqrt(mean(x^2) + eps) of each position (as TransformerLens)";
}

// The divisor of each row of x (..., D) -> (..., 1): sqrt(var + eps) for layer norm (biased
// variance, as layer_norm), sqrt(mean(x^2) + eps) for the RMS forms; in double then rounded. No
// graph: a constant of the forward.
Tensor norm_scale(const Tensor& x, float eps, bool centred) {
  const int64_t D = x.shape().back(), N = x.numel() / D;
  Shape dims = x.shape();
  dims[dims.ndim - 1] = 1;
  Tensor s = Tensor::empty(dims);
  const float* X = x.data();
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = X + r * D;
    double mu = 0, var = 0;
    if (centred) {
      for (int64_t j = 0; j < D; ++j) mu += xr[j];
      mu /= static_cast<double>(D);
    }
    for (int64_t j = 0; j < D; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    s.data()[r] = static_cast<float>(std::sqrt(var / static_cast<double>(D) + eps));
  }
  return s;
}

// ln(x), with the hook point `scale_name` (its divisor, (..., 1)) when hooked. A hook that only
// reads it leaves the fused norm (bit for bit); a replaced scale is used as TransformerLens
// uses it: (x - mean) / scale * weight + bias (RMS forms: x / scale * weight, or * (1 + weight)),
// the gradient flowing through the numerator only.
// The hook's name (prefix + name) is made only when there are hooks: an unhooked forward (a
// training step) builds no string.
Tensor hooked_layer_norm(const LayerNorm& ln, const Tensor& x, const Hooks* hk, const std::string& prefix, const char* name) {
  if (!hk) return ln.forward(x);
  const std::string scale_name = prefix + name;
  if (!hk->any(scale_name)) return ln.forward(x);
  const Tensor scale = norm_scale(x, ln.eps, ln.centred());  // (..., 1)
  const Tensor used = hk->apply(scale_name, scale);
  if (used.impl() == scale.impl()) return ln.forward(x);  // read, not replaced
  if (!ln.centred())
    return mul(div(x, used), ln.kind == NormKind::RMSNorm1p ? add_scalar(ln.weight, 1.f) : ln.weight);
  const Tensor centred = sub(x, mean(x, {-1}, true));  // (..., D)
  return add(mul(div(centred, used), ln.weight), ln.bias);
}
}  // namespace

// The block's hook points, declared with the code that makes them.
constexpr char kResidPre[] = "hook_resid_pre", kLn1[] = "ln1.hook_normalized", kAttnOut[] = "hook_attn_out",
               kResidMid[] = "hook_resid_mid", kLn2[] = "ln2.hook_normalized", kMlpOut[] = "hook_mlp_out",
               kLn1Scale[] = "ln1.hook_scale", kLn2Scale[] = "ln2.hook_scale",
               kResidPost[] = "hook_resid_post", kAttn[] = "attn.", kMlp[] = "mlp.",
               kLn1Post[] = "ln1_post.hook_normalized", kLn1PostScale[] = "ln1_post.hook_scale",
               kLn2Post[] = "ln2_post.hook_normalized", kLn2PostScale[] = "ln2_post.hook_scale";

std::vector<HookPointInfo> TransformerBlock::hook_points(const ModelConfig& c) {
  const std::string resid = "(B, T, " + std::to_string(c.d_model) + ")";
  const bool pre = c.norm == Norm::Pre;
  std::vector<HookPointInfo> p = {{kResidPre, resid, "residual stream into the block"}};
  if (pre) {
    p.push_back({kLn1Scale, kScaleShape, scale_what(c)});
    p.push_back({kLn1, resid, "norm before attention"});
  }
  append_hook_points(p, kAttn, MultiHeadAttention::hook_points(c.attention()));
  if (c.sandwich_norm) {
    p.push_back({kLn1PostScale, kScaleShape, scale_what(c)});
    p.push_back({kLn1Post, resid, "sandwich norm on attention's output"});
  }
  p.push_back({kAttnOut, resid, "attention output added to the residual stream"});
  if (!c.has_mlp()) {  // attention-only: the residual stream goes on from attention
    p.push_back({kResidPost, resid, "residual stream out of the block"});
    return p;
  }
  if (!c.parallel_block) p.push_back({kResidMid, resid, "residual stream after attention"});
  if (pre) {
    p.push_back({kLn2Scale, kScaleShape, scale_what(c)});
    p.push_back({kLn2, resid, c.parallel_block ? "norm before the MLP (of the block's input)" : "norm before the MLP"});
  }
  append_hook_points(p, kMlp, FeedForward::hook_points(c));
  if (c.sandwich_norm) {
    p.push_back({kLn2PostScale, kScaleShape, scale_what(c)});
    p.push_back({kLn2Post, resid, "sandwich norm on the MLP's output"});
  }
  p.push_back({kMlpOut, resid, "MLP output added to the residual stream"});
  p.push_back({kResidPost, resid, "residual stream out of the block"});
  return p;
}

Tensor TransformerBlock::forward(const Tensor& x_in, const MultiHeadAttention::Call& call_in, const Hooks* hk,
                                 const std::string& prefix) {
  auto hook = [&](const char* name, const Tensor& t) { return hk ? hk->apply(prefix + name, t) : t; };
  MultiHeadAttention::Call call = call_in;
  if (hk) {
    call.hooks = hk;
    call.hook_prefix = prefix + kAttn;
  }
  const std::string mlp = hk ? prefix + kMlp : std::string();
  const Tensor x = hook(kResidPre, x_in);
  // with output_rows, attention reads every row and the block goes on with only those rows
  const Tensor x_out = call.output_rows ? gather_rows(x, *call.output_rows) : x;
  // a branch's output as added to the residual stream: through the sandwich norm when there is one
  auto branch_out = [&](const Tensor& y, const std::unique_ptr<LayerNorm>& post, const char* name, const char* scale) {
    return post ? hook(name, hooked_layer_norm(*post, y, hk, prefix, scale)) : y;
  };
  if (norm == Norm::Pre) {  // x = x + attn(ln1(x)); x = x + ffn(ln2(x)); parallel: x + attn(ln1 x) + ffn(ln2 x)
    const Tensor a = hook(kAttnOut, resid_dropout.forward(branch_out(
        attn.forward(hook(kLn1, hooked_layer_norm(ln1, x, hk, prefix, kLn1Scale)), Tensor(), call), ln1_post, kLn1Post, kLn1PostScale)));
    if (!ffn) return hook(kResidPost, add(x_out, a));  // attention-only
    const Tensor mid = parallel ? x_out : hook(kResidMid, add(x_out, a));  // what the MLP reads
    const Tensor m = hook(kMlpOut, resid_dropout.forward(branch_out(
        ffn->forward(hook(kLn2, hooked_layer_norm(*ln2, mid, hk, prefix, kLn2Scale)), hk, mlp), ln2_post, kLn2Post, kLn2PostScale)));
    return hook(kResidPost, parallel ? add(add(x_out, a), m) : add(mid, m));
  }
  // post-norm: x = ln1(x + attn(x)); x = ln2(x + ffn(x))
  const Tensor a = hook(kAttnOut, resid_dropout.forward(attn.forward(x, Tensor(), call)));
  if (!ffn) return hook(kResidPost, ln1.forward(add(x_out, a)));  // attention-only
  const Tensor mid = hook(kResidMid, ln1.forward(add(x_out, a)));
  const Tensor m = hook(kMlpOut, resid_dropout.forward(ffn->forward(mid, hk, mlp)));
  return hook(kResidPost, ln2->forward(add(mid, m)));
}

// The model's own hook points, declared with the code that makes them.
constexpr char kHookEmbed[] = "hook_embed", kHookPosEmbed[] = "hook_pos_embed", kLnFinal[] = "ln_final.hook_normalized",
               kLnFinalScale[] = "ln_final.hook_scale";

TransformerLM::TransformerLM(const ModelConfig& c, uint64_t seed)
    : cfg((c.validate(), c)),
      init_rng(seed),
      dropout_rng(seed ^ 0xD50F0u),
      tok_emb(c.vocab_size, c.d_model, init_rng),
      emb_dropout(c.dropout, &dropout_rng),
      head(c.d_model, c.vocab_size, c.head_bias, init_rng) {
  register_module("tok_emb", &tok_emb);
  register_module("emb_dropout", &emb_dropout);  // so eval() turns it off
  if (c.positions == Positions::Learned) {
    pos_emb = std::make_unique<Embedding>(c.max_seq_len, c.d_model, init_rng);
    register_module("pos_emb", pos_emb.get());
  } else if (c.positions == Positions::Sinusoidal) {
    sinusoid = Tensor::empty({c.max_seq_len, c.d_model});
    std::vector<double> inv_freq;  // 1 / 10000^(i / d_model) for even i
    for (int64_t i = 0; i < c.d_model; i += 2) inv_freq.push_back(1.0 / std::pow(10000.0, static_cast<double>(i) / c.d_model));
    for (int64_t p = 0; p < c.max_seq_len; ++p)
      for (int64_t i = 0; i < c.d_model; i += 2) {
        const double angle = p * inv_freq[static_cast<size_t>(i / 2)];
        sinusoid.at({p, i}) = static_cast<float>(std::sin(angle));
        if (i + 1 < c.d_model) sinusoid.at({p, i + 1}) = static_cast<float>(std::cos(angle));
      }
  }
  RotaryTableSharing one_table_per_rotation;  // layers that turn alike read one table
  for (int l = 0; l < c.n_layers; ++l) {
    blocks.push_back(std::make_unique<TransformerBlock>(c, init_rng, &dropout_rng, l));
    register_module("blocks." + std::to_string(l), blocks.back().get());
  }
  if (c.norm == Norm::Pre) {
    ln_f = std::make_unique<LayerNorm>(c.d_model, c.layer_norm_eps, c.normalization);
    register_module("ln_f", ln_f.get());
  }
  register_module("head", &head);
}

Tensor TransformerLM::forward(const Ids& ids, const ForwardOptions& opt) {
  if (!saes.empty()) {  // attached SAEs: the forward again with their splices (nothing to do without)
    ForwardOptions spliced_opt;
    std::optional<Hooks> spliced_hooks;
    if (splice_saes(opt, spliced_opt, spliced_hooks)) return forward(ids, spliced_opt);
  }
  if (ids.shape.ndim != 2) fail("model: token ids must be (B, T), got ", ids.shape.str());
  const int64_t B = ids.shape[0], T = ids.shape[1];
  const int64_t offset = opt.kv_cache && !opt.kv_cache->empty() ? (*opt.kv_cache)[0].length() : 0;
  if (offset + T > cfg.max_seq_len)
    fail("model: sequence of length ", offset + T, " exceeds max_seq_len ", cfg.max_seq_len);
  if (opt.kv_cache && opt.kv_cache->empty()) {
    opt.kv_cache->resize(cfg.n_layers);
    for (auto& c : *opt.kv_cache) c.capacity = cfg.max_seq_len;
  }
  if (opt.stop_at_layer > cfg.n_layers)
    fail("model: stop_at_layer ", opt.stop_at_layer, " is past the model's ", cfg.n_layers, " layers");
  if (opt.stop_at_layer >= 0 && (!opt.live_len.empty() || opt.kv_cache))
    fail("model: stop_at_layer cannot be combined with live_len or a KV cache");
  if (!opt.live_len.empty()) return forward_live(ids, opt);
  if (opt.output_rows) fail("model: output_rows needs live_len");
  const Hooks* hk = opt.hooks;
  auto hook = [&](const char* name, const Tensor& t) { return hk ? hk->apply(name, t) : t; };  // no string without hooks
  const Tensor tok = hook(kHookEmbed, token_embeddings(ids));  // (B, T, d_model)
  // (T, d_model), broadcast over B, or (B, T, d_model) for position_ids; rotary and none add none
  Tensor pos;
  std::span<const int32_t> rows_positions;  // what rotary attention turns q and k by
  if (opt.position_ids) {
    const Ids& p = *opt.position_ids;
    if (p.shape != ids.shape) fail("model: position_ids ", p.shape.str(), " must be the ids' ", ids.shape.str());
    for (int32_t v : p.data)
      if (v < 0 || v >= cfg.max_seq_len) fail("model: position ", v, " is outside 0..", cfg.max_seq_len - 1, " (n_ctx)");
    if (pos_emb) pos = pos_emb->forward(p);
    else if (sinusoid.defined()) pos = embedding(sinusoid, p);
    rows_positions = p.data;  // (B, T): one per row
  } else {
    positions_.shape = Shape{T};  // reused: no allocation per forward
    positions_.data.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) positions_.data[t] = static_cast<int32_t>(offset + t);
    if (pos_emb) pos = pos_emb->forward(positions_);
    else if (sinusoid.defined()) pos = slice(sinusoid, 0, offset, offset + T);
    rows_positions = positions_.data;  // (T): the same for every row
  }
  Tensor x = emb_dropout.forward(pos.defined() ? add(tok, hook(kHookPosEmbed, pos)) : tok);
  MultiHeadAttention::Call call = causal_call(opt, B, offset + T);
  call.positions = rows_positions;  // rotary attention turns q and k by them
  return run_blocks(0, x, call, opt);
}

Tensor TransformerLM::token_embeddings(const Ids& ids) const {
  const Tensor e = tok_emb.forward(ids);
  // Gemma's normaliser is sqrt(d_model) rounded to the activations' type first, as here
  return cfg.embed_scale ? mul_scalar(e, std::sqrt(static_cast<float>(cfg.d_model))) : e;
}

MultiHeadAttention::Call TransformerLM::causal_call(const ForwardOptions& opt, int64_t B, int64_t keys) const {
  MultiHeadAttention::Call call;
  call.causal = true;
  if (opt.key_padding.defined()) {
    if (opt.key_padding.shape() != Shape({B, keys}))
      fail("model: key_padding ", opt.key_padding.shape().str(), " must be (", B, ",", keys, ")");
    call.key_padding = opt.key_padding;
  }
  return call;
}

Tensor TransformerLM::run_blocks(int layer, Tensor x, MultiHeadAttention::Call& call, const ForwardOptions& opt) {
  const Hooks* hk = opt.hooks;
  const bool live = !opt.live_len.empty();
  const int stop = opt.stop_at_layer >= 0 ? opt.stop_at_layer : cfg.n_layers;
  for (int l = layer; l < stop; ++l) {
    call.kv_cache = opt.kv_cache ? &(*opt.kv_cache)[l] : nullptr;
    if (live && l + 1 == cfg.n_layers) call.output_rows = opt.output_rows;  // the last block: only those rows on
    x = blocks[l]->forward(x, call, hk, hk ? block_prefix(l) : std::string());
  }
  if (opt.stop_at_layer >= 0) return x;  // (B, T, d_model): the residual stream entering block stop
  if (live && opt.output_rows && layer == cfg.n_layers) x = gather_rows(x, *opt.output_rows);
  if (!hk) return unembed(x);  // (B, T, vocab), or (live or output rows, vocab)
  if (ln_f) x = hk->apply(kLnFinal, hooked_layer_norm(*ln_f, x, hk, std::string(), kLnFinalScale));
  return cap_logits(head.forward(x));
}

Tensor TransformerLM::unembed(const Tensor& resid) {
  return cap_logits(head.forward(ln_f ? ln_f->forward(resid) : resid));
}

Tensor TransformerLM::cap_logits(const Tensor& logits) const {
  if (cfg.final_softcap == 0.f) return logits;
  return mul_scalar(tanh(mul_scalar(logits, 1.f / cfg.final_softcap)), cfg.final_softcap);  // cap tanh(logits / cap)
}

Tensor TransformerLM::forward_from(int layer, const Tensor& resid_pre, const ForwardOptions& opt) {
  if (!saes.empty()) {
    ForwardOptions spliced_opt;
    std::optional<Hooks> spliced_hooks;
    if (splice_saes(opt, spliced_opt, spliced_hooks)) return forward_from(layer, resid_pre, spliced_opt);
  }
  if (layer < 0 || layer > cfg.n_layers)
    fail("model: forward_from layer ", layer, " is outside 0..", cfg.n_layers, " (the model has ", cfg.n_layers, " layers)");
  int64_t cached = 0;  // positions in the KV cache before resid_pre's
  if (opt.kv_cache) {
    if (!opt.live_len.empty()) fail("model: forward_from takes live_len or a KV cache, not both");
    if (static_cast<int>(opt.kv_cache->size()) != cfg.n_layers)
      fail("model: forward_from's KV cache has ", opt.kv_cache->size(), " layers, the model ", cfg.n_layers);
    for (int l = layer; l < cfg.n_layers; ++l) {
      if (l == layer) cached = (*opt.kv_cache)[l].len;
      if ((*opt.kv_cache)[l].len != cached)
        fail("model: forward_from's KV cache holds ", (*opt.kv_cache)[l].len, " positions at layer ", l, ", ", cached,
             " at layer ", layer);
    }
  }
  if (opt.stop_at_layer > cfg.n_layers || (opt.stop_at_layer >= 0 && (opt.stop_at_layer < layer || !opt.live_len.empty())))
    fail("model: stop_at_layer ", opt.stop_at_layer, " must be ", layer, "..", cfg.n_layers, " (forward_from layer ", layer,
         ") and without live_len");
  if (opt.output_rows && opt.live_len.empty()) fail("model: output_rows needs live_len");
  if (!opt.live_len.empty()) {
    if (opt.hooks) fail("model: live_len cannot be combined with hooks");
    int64_t n = 0;
    for (int32_t len : opt.live_len) {
      if (len < 0) fail("model: live_len ", len, " < 0");
      n += len;
    }
    if (resid_pre.ndim() != 2 || resid_pre.size(0) != n || resid_pre.size(1) != cfg.d_model)
      fail("model: forward_from with live_len takes the live positions packed, (", n, ", ", cfg.d_model, "), got ",
           resid_pre.shape().str());
    if (opt.key_padding.defined()) fail("model: forward_from with live_len takes no key_padding");
    MultiHeadAttention::Call call;
    call.causal = true;
    call.live_len = opt.live_len;
    return run_blocks(layer, resid_pre, call, opt);
  }
  if (resid_pre.ndim() != 3 || resid_pre.size(2) != cfg.d_model)
    fail("model: forward_from takes the residual stream (B, T, ", cfg.d_model, "), got ", resid_pre.shape().str());
  if (cached + resid_pre.size(1) > cfg.max_seq_len)
    fail("model: sequence of length ", cached + resid_pre.size(1), " exceeds max_seq_len ", cfg.max_seq_len);
  MultiHeadAttention::Call call = causal_call(opt, resid_pre.size(0), cached + resid_pre.size(1));
  if (opt.position_ids) {  // rotary attention turns q and k by them (the embeddings' are in resid_pre)
    if (opt.position_ids->shape != Shape{resid_pre.size(0), resid_pre.size(1)})
      fail("model: position_ids ", opt.position_ids->shape.str(), " must be the residual stream's (B, T)");
    call.positions = opt.position_ids->data;
  }
  return run_blocks(layer, resid_pre, call, opt);
}

Tensor TransformerLM::forward_live(const Ids& ids, const ForwardOptions& opt) {
  const int64_t B = ids.shape[0], T = ids.shape[1];
  if (opt.hooks || opt.kv_cache || opt.position_ids)
    fail("model: live_len cannot be combined with hooks, a KV cache or position_ids");
  if (static_cast<int64_t>(opt.live_len.size()) != B)
    fail("model: live_len has ", opt.live_len.size(), " entries for ", B, " rows");
  int64_t n = 0, T_live = 0;
  for (int32_t len : opt.live_len) {
    if (len < 0 || len > T) fail("model: live_len ", len, " outside 0..", T);
    n += len;
    T_live = std::max<int64_t>(T_live, len);
  }
  if (n == 0) fail("model: live_len leaves no position to compute");
  for (Ids* v : {&live_ids_, &live_positions_}) {
    v->shape = Shape{n};
    v->data.reserve(static_cast<size_t>(B * T));  // once for every later batch of this size
    v->data.resize(static_cast<size_t>(n));
  }
  for (int64_t b = 0, i = 0; b < B; ++b)
    for (int32_t t = 0; t < opt.live_len[static_cast<size_t>(b)]; ++t, ++i) {
      live_ids_.data[static_cast<size_t>(i)] = ids.at(b, t);
      live_positions_.data[static_cast<size_t>(i)] = t;
    }
  const Tensor pos = pos_emb ? pos_emb->forward(live_positions_)
                     : sinusoid.defined() ? embedding(sinusoid, live_positions_) : Tensor();  // (n, d_model)
  const Tensor tok = token_embeddings(live_ids_);
  Tensor x = emb_dropout.forward(pos.defined() ? add(tok, pos) : tok);  // (n, d_model)
  MultiHeadAttention::Call call;
  call.causal = true;
  call.live_len = opt.live_len;
  call.positions = live_positions_.data;
  if (opt.key_padding.defined()) {
    if (opt.key_padding.shape() != Shape({B, T}))
      fail("model: key_padding ", opt.key_padding.shape().str(), " must be (", B, ",", T, ")");
    bool padded = false;  // the copy tasks pad only after the last target: nothing to hide then
    for (int64_t b = 0; b < B && !padded; ++b)
      for (int32_t t = 0; t < opt.live_len[static_cast<size_t>(b)] && !padded; ++t)
        padded = opt.key_padding.data()[b * T + t] != 0.f;
    if (padded) call.key_padding = T_live == T ? opt.key_padding : slice(opt.key_padding, 1, 0, T_live);
  }
  return run_blocks(0, x, call, opt);  // (n or output rows, vocab)
}

// ---- attached SAEs ----
void TransformerLM::add_sae(std::shared_ptr<const Sae> sae, bool use_error_term) {
  HL_CHECK(sae, "add_sae: no SAE");
  const std::string& hook = sae->cfg.hook_name;
  HL_CHECK(!sae->cfg.transcoder(), "add_sae: a transcoder (", hook, " -> ", sae->cfg.hook_name_out,
           ") cannot be attached; splice it through hooks (add_sae_splice)");
  bool known = false;
  for (const auto& [name, shape] : hook_points(cfg)) known = known || name == hook;
  HL_CHECK(known, "add_sae: the SAE's hook '", hook, "' is not a hook point of this model (headlab hooks lists them)");
  for (const AttachedSae& a : saes)
    HL_CHECK(a.sae->cfg.hook_name != hook, "add_sae: an SAE is already attached at ", hook, " (reset_saes first)");
  saes.push_back({std::move(sae), use_error_term});
}

bool TransformerLM::splice_saes(const ForwardOptions& opt, ForwardOptions& spliced_opt, std::optional<Hooks>& spliced_hooks) const {
  if (saes.empty() || (opt.hooks && opt.hooks->has_splices())) return false;
  if (!opt.hooks && !saes_replace_activations()) return false;  // nothing can see or edit a feature: the model itself
  if (!opt.live_len.empty())
    fail("model: an SAE attached without its error term (", saes[0].sae->cfg.hook_name,
         ") changes the activations, which a forward over live_len cannot splice");
  std::vector<std::pair<std::string, Hooks::Splice>> splices;
  for (const AttachedSae& a : saes) splices.push_back({a.sae->cfg.hook_name, attached_sae_splice(a.sae, a.use_error_term)});
  spliced_hooks = (opt.hooks ? *opt.hooks : Hooks()).spliced(splices);
  spliced_opt = opt;
  spliced_opt.hooks = &*spliced_hooks;
  return true;
}

std::vector<HookPointInfo> describe_hook_points(const TransformerLM& model) {
  std::vector<HookPointInfo> p;
  for (HookPointInfo& h : describe_hook_points(model.cfg)) {
    p.push_back(h);
    for (const AttachedSae& a : model.saes)
      if (a.sae->cfg.hook_name == h.name) append_hook_points(p, "", sae_hook_points(*a.sae, a.use_error_term));
  }
  return p;
}

std::pair<Tensor, ActivationCache> TransformerLM::run_with_cache(const Ids& ids, NameFilter filter, bool with_grads,
                                                                 const Tensor& key_padding) {
  ActivationCache cache;
  Hooks hooks;
  hooks.cache(cache, std::move(filter), with_grads);
  ForwardOptions opt;
  opt.hooks = &hooks;
  opt.key_padding = key_padding;
  Tensor logits = forward(ids, opt);
  return {logits, cache};
}

Ids positions_from_padding(const Tensor& key_padding, const std::vector<int32_t>& offset) {
  if (key_padding.ndim() != 2) fail("model: key_padding must be (B, T), got ", key_padding.shape().str());
  const int64_t B = key_padding.size(0), T = key_padding.size(1);
  if (!offset.empty() && static_cast<int64_t>(offset.size()) != B)
    fail("model: ", offset.size(), " position offsets for ", B, " rows");
  Ids pos(Shape{B, T});
  for (int64_t b = 0; b < B; ++b) {
    int32_t seen = offset.empty() ? 0 : offset[static_cast<size_t>(b)];  // real tokens before this column
    for (int64_t t = 0; t < T; ++t) {
      const bool real = key_padding.data()[b * T + t] == 0.f;
      pos.at(b, t) = real ? seen : std::max(seen - 1, 0);  // padding: the last real token's (TransformerLens)
      seen += real;
    }
  }
  return pos;
}

std::vector<HookPointInfo> describe_hook_points(const ModelConfig& c) {
  const std::string D = std::to_string(c.d_model);
  std::vector<HookPointInfo> p = {{kHookEmbed, "(B, T, " + D + ")", "token embeddings"}};
  if (c.positions == Positions::Learned || c.positions == Positions::Sinusoidal)  // rotary and none add none
    p.push_back({kHookPosEmbed, "(T, " + D + ")", "position embeddings (broadcast over the batch)"});
  const std::vector<HookPointInfo> block = TransformerBlock::hook_points(c);
  for (int l = 0; l < c.n_layers; ++l) append_hook_points(p, block_prefix(l), block);
  if (c.norm == Norm::Pre) {
    p.push_back({kLnFinalScale, kScaleShape, scale_what(c)});
    p.push_back({kLnFinal, "(B, T, " + D + ")", "final norm (into the unembedding)"});
  }
  return p;
}

std::vector<std::pair<std::string, std::string>> hook_points(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> p;
  for (const HookPointInfo& h : describe_hook_points(c)) p.push_back({h.name, h.shape});
  return p;
}

void TransformerLM::set_gates_require_grad(bool on) {
  for (auto& b : blocks) {
    b->attn.gates.zero_grad();
    b->attn.gates.requires_grad_(on);
  }
}

std::vector<std::vector<float>> TransformerLM::gate_values() const {
  std::vector<std::vector<float>> g;
  for (auto& b : blocks) g.push_back(b->attn.gates.to_vector());
  return g;
}

bool TransformerLM::gates_all_one() const {
  for (auto& row : gate_values())
    for (float v : row)
      if (v != 1.f) return false;
  return true;
}

std::vector<std::pair<std::string, Shape>> parameter_shapes(const ModelConfig& c) {
  const int64_t D = c.d_model, dh = c.head_dim(), Hq = c.n_heads * dh, Hkv = c.kv_heads() * dh;
  std::vector<std::pair<std::string, Shape>> p;
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    p.push_back({name + ".weight", Shape{out, in}});
    if (bias) p.push_back({name + ".bias", Shape{out}});
  };
  auto norm = [&](const std::string& name) {
    p.push_back({name + ".weight", Shape{D}});
    if (c.normalization == NormKind::LayerNorm) p.push_back({name + ".bias", Shape{D}});
  };
  p.push_back({"tok_emb.weight", Shape{c.vocab_size, D}});
  if (c.positions == Positions::Learned) p.push_back({"pos_emb.weight", Shape{c.max_seq_len, D}});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = block_prefix(l);
    norm(b + "ln1");
    const AttentionConfig a = c.attention(l);
    linear(b + "attn.W_Q", Hq, D, a.has_qkv_bias());
    linear(b + "attn.W_K", Hkv, D, a.has_qkv_bias());
    linear(b + "attn.W_V", Hkv, D, a.has_qkv_bias());
    linear(b + "attn.W_O", D, Hq, a.has_o_bias());
    if (c.qk_norm) {
      p.push_back({b + "attn.q_norm.weight", Shape{dh}});
      p.push_back({b + "attn.k_norm.weight", Shape{dh}});
    }
    if (c.sandwich_norm) norm(b + "ln1_post");
    if (!c.has_mlp()) continue;  // attention-only
    norm(b + "ln2");
    linear(b + "ffn.fc1", c.d_ff, D, c.mlp_bias);
    linear(b + "ffn.fc2", D, c.d_ff, c.mlp_bias);
    if (c.gated_mlp()) linear(b + "ffn.gate", c.d_ff, D, c.mlp_bias);
    if (c.sandwich_norm) norm(b + "ln2_post");
  }
  if (c.norm == Norm::Pre) norm("ln_f");
  linear("head", c.vocab_size, D, c.head_bias);
  return p;
}

int64_t parameter_count(const ModelConfig& cfg) {
  int64_t n = 0;
  for (auto& [name, shape] : parameter_shapes(cfg)) n += shape.numel();
  return n;
}

double estimate_step_bytes(const ModelConfig& c, int64_t B, int64_t T, bool training, bool logits) {
  const double D = static_cast<double>(c.d_model), F = static_cast<double>(c.d_ff),
               W = static_cast<double>(c.n_heads * c.head_dim()), Wkv = static_cast<double>(c.kv_heads() * c.head_dim()),
               H = c.n_heads, V = static_cast<double>(c.vocab_size), tokens = static_cast<double>(B) * static_cast<double>(T);
  double params = 0;
  for (auto& [name, shape] : parameter_shapes(c)) params += static_cast<double>(shape.numel());
  if (c.positions == Positions::Sinusoidal) params += static_cast<double>(c.max_seq_len) * D;  // the table
  // per token and layer: residuals, two norms, q/k/v, head outputs, W_O output, FFN in and out;
  // per sequence and layer: the (H, T, T) pattern (and in backward its gradient work buffer)
  const double per_token_layer = 6 * D + W + 2 * Wkv + W + (c.gated_mlp() ? 4 : 2) * F + (c.sandwich_norm ? 2 * D : 0);
  const double pattern = H * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(B);
  double acts = c.n_layers * (tokens * per_token_layer + pattern) + tokens * (2 * D + (logits ? 2 * V : 0));
  if (training) acts *= 2;  // their gradients
  return 4.0 * ((training ? 4 : 1) * params + acts);
}

Tensor head_rows(const Tensor& w, int head, int64_t d_head) {
  if (w.ndim() != 2 || (head + 1) * d_head > w.size(0) || head < 0)
    fail("head_rows: head ", head, " of d_head ", d_head, " outside ", w.shape().str());
  NoGradGuard ng;
  return slice(w, 0, head * d_head, (head + 1) * d_head);
}
Tensor head_cols(const Tensor& w, int head, int64_t d_head) {
  if (w.ndim() != 2 || (head + 1) * d_head > w.size(1) || head < 0)
    fail("head_cols: head ", head, " of d_head ", d_head, " outside ", w.shape().str());
  NoGradGuard ng;
  return slice(w, 1, head * d_head, (head + 1) * d_head);
}

}  // namespace hl
