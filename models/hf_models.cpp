#include "models/hf_models.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "lib/fileutil.h"
#include "models/hf_config.h"
#include "models/hf_gpt2.h"

namespace hl {

using json = nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Buffers some exports carry beside the weights (causal masks, rotary tables): not parameters.
bool is_buffer(const std::string& name) {
  return ends_with(name, ".attention.bias") || ends_with(name, ".attention.masked_bias") || ends_with(name, ".attn.bias") ||
         ends_with(name, ".attn.masked_bias") || ends_with(name, "rotary_emb.inv_freq");
}

// The families: which table of keys and tensors a model_type uses.
enum class Family { NeoX, Llama, Neo, Gemma };
Family family_of(const std::string& type) {
  if (type == "gpt_neox") return Family::NeoX;
  if (type == "gpt_neo") return Family::Neo;
  if (type == "gemma2" || type == "gemma3_text") return Family::Gemma;
  return Family::Llama;  // llama, mistral, qwen2, qwen3
}

// config.json's fields, read with one message form: "<file>: <type> config field '<key>' ...".
struct Fields {
  const json& c;
  std::string source, type;
  [[noreturn]] void bad(const std::string& key, const std::string& why) const {
    fail(source, ": ", type, " config field '", key, "' ", why);
  }
  bool has(const char* key) const { return c.contains(key) && !c[key].is_null(); }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    if (!has(key)) bad(key, "is missing");
    const json& v = c[key];
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      bad(key, "must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + v.dump());
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t lo, int64_t hi, int64_t dflt) const { return has(key) ? integer(key, lo, hi) : dflt; }
  double positive_or(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    const json& v = c[key];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) bad(key, "must be a positive number, got " + v.dump());
    return v.get<double>();
  }
  bool flag(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!c[key].is_boolean()) bad(key, "must be true or false, got " + c[key].dump());
    return c[key].get<bool>();
  }
  std::string text_or(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!c[key].is_string()) bad(key, "must be a string, got " + c[key].dump());
    return c[key].get<std::string>();
  }
};

Activation activation_of(const Fields& f, const char* key, const std::string& dflt) {
  const std::string a = f.text_or(key, dflt);
  if (a == "gelu") return Activation::GeluErf;
  if (a == "gelu_new" || a == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (a == "relu") return Activation::Relu;
  if (a == "silu" || a == "swish") return Activation::Silu;
  f.bad(key, "\"" + a + "\" is not an activation headlab has (gelu, gelu_new, gelu_pytorch_tanh, relu, silu)");
}

// rope_scaling: only none or the default rotation; any other type changes the angles.
void check_rope_scaling(const Fields& f) {
  if (!f.has("rope_scaling")) return;
  const json& r = f.c["rope_scaling"];
  std::string type = "?";
  if (r.is_object() && r.contains("rope_type") && r["rope_type"].is_string()) type = r["rope_type"].get<std::string>();
  else if (r.is_object() && r.contains("type") && r["type"].is_string()) type = r["type"].get<std::string>();
  if (type != "default") f.bad("rope_scaling", "of type \"" + type + "\" is not supported (headlab's rotary positions have no scaling)");
}

// Sliding-window layers as window_layers: "all", or one letter per layer, L local and G global.
std::string window_pattern(const std::vector<bool>& local) {
  bool all = true;
  for (bool l : local) all = all && l;
  if (all) return "all";
  std::string s;
  for (bool l : local) s += l ? 'L' : 'G';
  return s;
}

// layer_types ("sliding_attention" / "full_attention" per layer), when config.json has it.
bool read_layer_types(const Fields& f, int n_layers, std::vector<bool>& local) {
  if (!f.has("layer_types")) return false;
  const json& t = f.c["layer_types"];
  if (!t.is_array() || static_cast<int>(t.size()) != n_layers)
    f.bad("layer_types", "must list one type per layer (" + std::to_string(n_layers) + ")");
  local.clear();
  for (const json& v : t) {
    if (v == "sliding_attention") local.push_back(true);
    else if (v == "full_attention") local.push_back(false);
    else f.bad("layer_types", "holds " + v.dump() + "; headlab reads sliding_attention and full_attention");
  }
  return true;
}

}  // namespace

const std::vector<std::string>& hf_model_types() {
  static const std::vector<std::string> types = {"gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gpt_neo", "gemma2", "gemma3_text"};
  return types;
}

ModelConfig hf_model_config(const std::string& config_text, const std::string& source) {
  json c = parse_config_object(config_text, source);
  if (!c.contains("model_type") || !c["model_type"].is_string()) fail(source, ": config field 'model_type' is missing");
  const std::string type = c["model_type"].get<std::string>();
  const auto& types = hf_model_types();
  if (std::find(types.begin(), types.end(), type) == types.end()) {
    std::string known = "gpt2";
    for (const std::string& t : types) known += ", " + t;
    fail(source, ": model_type \"", type, "\" is not an architecture headlab reads (", known, ")");
  }
  const Fields f{c, source, type};
  const Family fam = family_of(type);
  ModelConfig cfg;
  cfg.vocab_size = f.integer("vocab_size", 1, int64_t{1} << 24);
  cfg.max_seq_len = f.integer("max_position_embeddings", 1, int64_t{1} << 20);
  cfg.norm = Norm::Pre;
  cfg.attn_bias = false;
  cfg.head_bias = false;

  if (fam == Family::Neo) {
    cfg.d_model = f.integer("hidden_size", 1, int64_t{1} << 16);
    cfg.n_layers = static_cast<int>(f.integer("num_layers", 1, 1024));
    cfg.n_heads = static_cast<int>(f.integer("num_heads", 1, 4096));
    cfg.d_ff = f.integer_or("intermediate_size", 1, int64_t{1} << 20, 4 * cfg.d_model);
    cfg.activation = activation_of(f, "activation_function", "gelu_new");
    cfg.layer_norm_eps = static_cast<float>(f.positive_or("layer_norm_epsilon", 1e-5));
    cfg.positions = Positions::Learned;
    cfg.attn_scale = 1.f;  // GPT-Neo does not scale its scores
    cfg.o_bias = true;     // out_proj has a bias, q/k/v have none
    cfg.mlp_bias = true;
    // attention_layers (one type per layer), or attention_types [[types, repeats], ...] expanded
    std::vector<std::string> kinds;
    if (f.has("attention_layers")) {
      if (!c["attention_layers"].is_array()) f.bad("attention_layers", "must be a list of \"local\" and \"global\"");
      for (const json& v : c["attention_layers"])
        kinds.push_back(v.is_string() ? v.get<std::string>() : "?");
    } else if (f.has("attention_types")) {
      const json& t = c["attention_types"];
      if (!t.is_array()) f.bad("attention_types", "must be a list of [types, repeats]");
      for (const json& item : t) {
        if (!item.is_array() || item.size() != 2 || !item[0].is_array() || !item[1].is_number_integer() || item[1].get<int64_t>() < 0 ||
            item[1].get<int64_t>() > 1024)
          f.bad("attention_types", "must be a list of [types, repeats], got " + item.dump());
        for (int64_t r = 0; r < item[1].get<int64_t>(); ++r)
          for (const json& v : item[0]) kinds.push_back(v.is_string() ? v.get<std::string>() : "?");
      }
    } else {
      f.bad("attention_types", "is missing");
    }
    if (static_cast<int>(kinds.size()) != cfg.n_layers)
      f.bad(f.has("attention_layers") ? "attention_layers" : "attention_types",
            "describes " + std::to_string(kinds.size()) + " layers but num_layers is " + std::to_string(cfg.n_layers));
    std::vector<bool> local;
    for (const std::string& k : kinds) {
      if (k != "local" && k != "global")
        f.bad(f.has("attention_layers") ? "attention_layers" : "attention_types", "holds \"" + k + "\"; headlab reads local and global");
      local.push_back(k == "local");
    }
    bool any_local = false;
    for (bool l : local) any_local = any_local || l;
    if (any_local) {
      cfg.sliding_window = f.integer("window_size", 1, int64_t{1} << 20);
      cfg.window_layers = window_pattern(local);
    }
  } else {
    cfg.d_model = f.integer("hidden_size", 1, int64_t{1} << 16);
    cfg.n_layers = static_cast<int>(f.integer("num_hidden_layers", 1, 1024));
    cfg.n_heads = static_cast<int>(f.integer("num_attention_heads", 1, 4096));
    cfg.d_ff = f.integer("intermediate_size", 1, int64_t{1} << 20);
    cfg.positions = Positions::Rotary;
    check_rope_scaling(f);
    if (fam == Family::NeoX) {
      if (cfg.d_model % cfg.n_heads) f.bad("hidden_size", "is not a multiple of num_attention_heads");
      cfg.activation = activation_of(f, "hidden_act", "gelu");
      cfg.layer_norm_eps = static_cast<float>(f.positive_or("layer_norm_eps", 1e-5));
      cfg.parallel_block = f.flag("use_parallel_residual", true);
      cfg.rotary_pct = static_cast<float>(f.positive_or("rotary_pct", f.positive_or("partial_rotary_factor", 0.25)));
      if (cfg.rotary_pct > 1.f) f.bad("rotary_pct", "must be at most 1");
      cfg.rope_theta = static_cast<float>(f.positive_or("rotary_emb_base", f.positive_or("rope_theta", 10000)));
      cfg.qkv_bias = cfg.o_bias = f.flag("attention_bias", true);
      cfg.mlp_bias = true;
    } else {
      cfg.n_kv_heads = static_cast<int>(f.integer_or("num_key_value_heads", 1, 4096, cfg.n_heads));
      if (cfg.n_heads % cfg.n_kv_heads) f.bad("num_key_value_heads", "must divide num_attention_heads");
      const int64_t dflt_head = fam == Family::Gemma ? 256 : cfg.d_model / cfg.n_heads;
      cfg.d_head = f.integer_or("head_dim", 1, 4096, dflt_head);
      cfg.rope_theta = static_cast<float>(f.positive_or("rope_theta", type == "gemma3_text" ? 1e6 : 10000));
      cfg.normalization = fam == Family::Gemma ? NormKind::RMSNorm1p : NormKind::RMSNorm;
      cfg.layer_norm_eps = static_cast<float>(f.positive_or("rms_norm_eps", 1e-6));
      cfg.mlp = fam == Family::Gemma ? Mlp::GeGLU : Mlp::SwiGLU;
      cfg.mlp_bias = type == "llama" && f.flag("mlp_bias", false);
      if (fam == Family::Gemma) {
        cfg.activation = activation_of(f, f.has("hidden_activation") ? "hidden_activation" : "hidden_act", "gelu_pytorch_tanh");
        if (cfg.activation != Activation::GeluTanh && cfg.activation != Activation::GeluErf)
          f.bad("hidden_activation", "must be a gelu (Gemma's MLP is GeGLU)");
      } else {
        if (activation_of(f, "hidden_act", "silu") != Activation::Silu) f.bad("hidden_act", "must be silu (the MLP is SwiGLU)");
        cfg.activation = Activation::Silu;
      }
      // q/k/v biases: Qwen2 always; attention_bias puts them on q/k/v and o (Llama, Qwen3)
      if (type == "qwen2") cfg.qkv_bias = true;
      else if (type == "llama" || type == "qwen3") cfg.qkv_bias = cfg.o_bias = f.flag("attention_bias", false);
      else if (f.flag("attention_bias", false)) f.bad("attention_bias", "true is not read for " + type);
      cfg.qk_norm = type == "qwen3" || type == "gemma3_text";  // Gemma 3's is (1 + w), as its other norms
      if (type == "qwen2" || type == "qwen3") {
        if (f.flag("use_sliding_window", false))
          f.bad("use_sliding_window", "true (sliding windows on the layers above max_window_layers) is not supported");
      } else if (type == "mistral" && f.has("sliding_window")) {
        cfg.sliding_window = f.integer("sliding_window", 1, int64_t{1} << 30);
      }
      if (fam == Family::Gemma) {
        cfg.sandwich_norm = true;
        cfg.embed_scale = true;
        cfg.attn_scale = static_cast<float>(1.0 / std::sqrt(f.positive_or("query_pre_attn_scalar", 256)));
        cfg.attn_softcap = static_cast<float>(f.positive_or("attn_logit_softcapping", 0));
        cfg.final_softcap = static_cast<float>(f.positive_or("final_logit_softcapping", 0));
        std::vector<bool> local;
        if (!read_layer_types(f, cfg.n_layers, local)) {
          if (type == "gemma2") {
            for (int l = 0; l < cfg.n_layers; ++l) local.push_back(l % 2 == 0);  // Gemma 2: even layers slide
          } else {  // Gemma 3: every sliding_window_pattern-th layer is global (5 local, 1 global)
            const char* key = f.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
            const int64_t every = f.integer_or(key, 1, 1024, 6);
            for (int l = 0; l < cfg.n_layers; ++l) local.push_back((l + 1) % every != 0);
          }
        }
        bool any_local = false;
        for (bool l : local) any_local = any_local || l;
        if (any_local && f.has("sliding_window")) {
          cfg.sliding_window = f.integer("sliding_window", 1, int64_t{1} << 30);
          cfg.window_layers = window_pattern(local);
        }
        if (type == "gemma3_text") {
          if (f.flag("use_bidirectional_attention", false))
            f.bad("use_bidirectional_attention", "true (an encoder: every token sees every other) is not supported");
          // local layers turn by their own base; rope_scaling (checked above) is the global layers'
          const float local_base = static_cast<float>(f.positive_or("rope_local_base_freq", 10000));
          if (cfg.sliding_window > 0 && local_base != cfg.rope_theta) cfg.rope_theta_local = local_base;
        }
      }
    }
  }
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
  return cfg;
}

std::vector<HfTensor> hf_tensor_map(const std::string& type, const ModelConfig& c, bool tied) {
  const Family fam = family_of(type);
  const int64_t D = c.d_model, V = c.vocab_size, F = c.d_ff, dh = c.head_dim(), Hq = c.n_heads * dh, Hkv = c.kv_heads() * dh;
  const AttentionConfig a = c.attention();
  std::vector<HfTensor> m;
  auto same = [&](const std::string& hf, Shape s, const std::string& to) { m.push_back({hf, s, {to}, HfTransform::Same}); };
  auto linear = [&](const std::string& hf, int64_t out, int64_t in, const std::string& to, bool bias) {
    same(hf + ".weight", Shape{out, in}, to + ".weight");
    if (bias) same(hf + ".bias", Shape{out}, to + ".bias");
  };
  auto norm = [&](const std::string& hf, const std::string& to) {
    same(hf + ".weight", Shape{D}, to + ".weight");
    if (c.normalization == NormKind::LayerNorm) same(hf + ".bias", Shape{D}, to + ".bias");
  };
  if (fam == Family::NeoX) {
    same("gpt_neox.embed_in.weight", Shape{V, D}, "tok_emb.weight");
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string h = "gpt_neox.layers." + std::to_string(l) + ".", b = block_prefix(l);
      norm(h + "input_layernorm", b + "ln1");
      norm(h + "post_attention_layernorm", b + "ln2");
      m.push_back({h + "attention.query_key_value.weight", Shape{3 * Hq, D},
                   {b + "attn.W_Q.weight", b + "attn.W_K.weight", b + "attn.W_V.weight"}, HfTransform::NeoxQkv});
      if (a.has_qkv_bias())
        m.push_back({h + "attention.query_key_value.bias", Shape{3 * Hq},
                     {b + "attn.W_Q.bias", b + "attn.W_K.bias", b + "attn.W_V.bias"}, HfTransform::NeoxQkv});
      linear(h + "attention.dense", D, Hq, b + "attn.W_O", a.has_o_bias());
      linear(h + "mlp.dense_h_to_4h", F, D, b + "ffn.fc1", true);
      linear(h + "mlp.dense_4h_to_h", D, F, b + "ffn.fc2", true);
    }
    norm("gpt_neox.final_layer_norm", "ln_f");
    if (!tied) same("embed_out.weight", Shape{V, D}, "head.weight");
    return m;
  }
  if (fam == Family::Neo) {
    same("transformer.wte.weight", Shape{V, D}, "tok_emb.weight");
    same("transformer.wpe.weight", Shape{c.max_seq_len, D}, "pos_emb.weight");
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".", b = block_prefix(l);
      norm(h + "ln_1", b + "ln1");
      linear(h + "attn.attention.q_proj", Hq, D, b + "attn.W_Q", false);
      linear(h + "attn.attention.k_proj", Hkv, D, b + "attn.W_K", false);
      linear(h + "attn.attention.v_proj", Hkv, D, b + "attn.W_V", false);
      linear(h + "attn.attention.out_proj", D, Hq, b + "attn.W_O", true);
      norm(h + "ln_2", b + "ln2");
      linear(h + "mlp.c_fc", F, D, b + "ffn.fc1", true);
      linear(h + "mlp.c_proj", D, F, b + "ffn.fc2", true);
    }
    norm("transformer.ln_f", "ln_f");
    if (!tied) same("lm_head.weight", Shape{V, D}, "head.weight");
    return m;
  }
  // Llama, Mistral, Qwen2, Qwen3, Gemma 2
  same("model.embed_tokens.weight", Shape{V, D}, "tok_emb.weight");
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", b = block_prefix(l);
    norm(h + "input_layernorm", b + "ln1");
    linear(h + "self_attn.q_proj", Hq, D, b + "attn.W_Q", a.has_qkv_bias());
    linear(h + "self_attn.k_proj", Hkv, D, b + "attn.W_K", a.has_qkv_bias());
    linear(h + "self_attn.v_proj", Hkv, D, b + "attn.W_V", a.has_qkv_bias());
    linear(h + "self_attn.o_proj", D, Hq, b + "attn.W_O", a.has_o_bias());
    if (c.qk_norm) {
      same(h + "self_attn.q_norm.weight", Shape{dh}, b + "attn.q_norm.weight");
      same(h + "self_attn.k_norm.weight", Shape{dh}, b + "attn.k_norm.weight");
    }
    if (fam == Family::Gemma) {
      norm(h + "post_attention_layernorm", b + "ln1_post");
      norm(h + "pre_feedforward_layernorm", b + "ln2");
      norm(h + "post_feedforward_layernorm", b + "ln2_post");
    } else {
      norm(h + "post_attention_layernorm", b + "ln2");
    }
    linear(h + "mlp.gate_proj", F, D, b + "ffn.gate", c.mlp_bias);
    linear(h + "mlp.up_proj", F, D, b + "ffn.fc1", c.mlp_bias);
    linear(h + "mlp.down_proj", D, F, b + "ffn.fc2", c.mlp_bias);
  }
  norm("model.norm", "ln_f");
  if (!tied) same("lm_head.weight", Shape{V, D}, "head.weight");
  return m;
}

namespace {

// GPT-NeoX's fused rows [H][3][d_head][cols] -> the three (H * d_head, cols) blocks q, k, v, in
// the stored dtype (rows of bytes moved, nothing widened).
std::vector<StTensor> split_neox_qkv(const StTensor& t, int64_t H, int64_t dh) {
  const int64_t cols = t.shape.ndim == 2 ? t.shape[1] : 1;
  const size_t row = t.bytes.size() / static_cast<size_t>(3 * H * dh);  // bytes of one row
  std::vector<StTensor> out(3);
  for (int j = 0; j < 3; ++j) {
    out[j].dtype = t.dtype;
    out[j].shape = t.shape.ndim == 2 ? Shape{H * dh, cols} : Shape{H * dh};
    out[j].bytes.resize(static_cast<size_t>(H * dh) * row);
  }
  for (int64_t h = 0; h < H; ++h)
    for (int j = 0; j < 3; ++j)
      for (int64_t i = 0; i < dh; ++i)
        std::memcpy(out[j].bytes.data() + (h * dh + i) * row, t.bytes.data() + ((h * 3 + j) * dh + i) * row, row);
  return out;
}

}  // namespace

std::unique_ptr<TransformerLM> ungroup_grouped_query_attention(const TransformerLM& model) {
  ModelConfig cfg = model.cfg;
  cfg.n_kv_heads = 0;
  std::unique_ptr<TransformerLM> out;
  {
    SkipInitGuard copied_next;  // every parameter is written below
    out = std::make_unique<TransformerLM>(cfg, 0);
  }
  const int64_t H = cfg.n_heads, group = H / model.cfg.kv_heads(), dh = cfg.head_dim();
  const auto from = model.named_parameters();
  const auto to = out->named_parameters();
  NoGradGuard ng;
  for (size_t i = 0; i < to.size(); ++i) {
    HL_CHECK(from[i].first == to[i].first, "ungroup: parameter ", to[i].first, " where the model has ", from[i].first);
    const Tensor& src = from[i].second;
    Tensor dst = to[i].second;  // a handle on the parameter
    if (src.shape() == dst.shape()) {
      dst.copy_from(src);
      continue;
    }
    // W_K / W_V (Hkv * dh, d_model) or their biases (Hkv * dh): kv head h / group's rows for query head h
    const int64_t block = dh * (src.ndim() == 2 ? src.size(1) : 1);
    for (int64_t h = 0; h < H; ++h) std::copy_n(src.data() + (h / group) * block, block, dst.data() + h * block);
  }
  for (int l = 0; l < cfg.n_layers; ++l) out->blocks[l]->attn.gates.copy_from(model.blocks[l]->attn.gates);
  out->train(model.training());
  return out;
}

double hf_load_bytes(const ModelConfig& cfg) {
  double params = 0, largest = 0;
  for (const auto& [name, shape] : parameter_shapes(cfg)) {
    params += static_cast<double>(shape.numel());
    largest = std::max(largest, static_cast<double>(shape.numel()));
  }
  // the rotary tables: one (max_seq_len, rotary dims) of cosines and sines per angle base, shared
  // by the layers that turn alike (RotaryTableSharing)
  std::set<float> thetas;
  for (int l = 0; cfg.positions == Positions::Rotary && l < cfg.n_layers; ++l) thetas.insert(cfg.attention(l).rope.theta);
  const double rotary = 4.0 * static_cast<double>(thetas.size()) * static_cast<double>(cfg.max_seq_len) *
                        static_cast<double>(cfg.rotary_dims());
  // the float32 parameters once: the file's tensors are held as stored (BF16/F16 bytes are half
  // their float32) and each is widened straight into its parameter, then released
  // (load_model_releasing), so the model's pages replace the file's; the largest tensor once more
  // (an F32 file's bytes beside its parameter while it is copied); and the 64 MiB freed between
  // two returns to the system
  return 4.0 * params + 4.0 * largest + 64.0 * (1 << 20) + rotary;
}

SafetensorsFile read_hf_directory(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  if (!file_exists(config_path))
    fail(dir, ": a directory is read as a Hugging Face model (config.json and model.safetensors), but it has no config.json");
  const std::string config_text = read_file(config_path);
  json cj = parse_config_object(config_text, config_path);
  // no model_type: GPT-2's reader, as before (its configs from older exports lack the key)
  if (!cj.contains("model_type") || cj["model_type"] == "gpt2") return read_hf_gpt2(dir);
  const ModelConfig cfg = hf_model_config(config_text, config_path);
  const std::string type = cj["model_type"].get<std::string>();
  const Fields f{cj, config_path, type};
  const bool tied = f.flag("tie_word_embeddings", type == "gpt_neo" || family_of(type) == Family::Gemma);

  // refused before any weight is read, with the estimate (docs/models.md, "Memory and time")
  check_fits_in_memory(hf_load_bytes(cfg), dir + ": loading the model config.json describes (" +
                                               std::to_string(parameter_count(cfg)) + " parameters)");
  std::map<std::string, std::string> origin;
  std::map<std::string, StTensor> hf = read_hf_weights(dir, is_buffer, origin);
  const std::vector<HfTensor> map = hf_tensor_map(type, cfg, tied);
  const std::string summary = "(hidden_size " + std::to_string(cfg.d_model) + ", " + std::to_string(cfg.n_layers) + " layers, " +
                              std::to_string(cfg.n_heads) + " heads of " + std::to_string(cfg.head_dim()) + ", " +
                              std::to_string(cfg.kv_heads()) + " key/value heads, intermediate_size " + std::to_string(cfg.d_ff) +
                              ", vocab_size " + std::to_string(cfg.vocab_size) + ")";
  for (const HfTensor& e : map) {
    auto it = hf.find(e.hf);
    if (it == hf.end()) fail(dir, ": missing tensor '", e.hf, "' that config.json needs");
    if (it->second.shape != e.shape)
      fail(origin[e.hf], ": tensor '", e.hf, "' has shape ", it->second.shape.str(), " but config.json ", summary, " needs ",
           e.shape.str());
  }
  const std::string unembed = type == "gpt_neox" ? "embed_out.weight" : "lm_head.weight";
  for (auto& [name, t] : hf) {
    if (tied && name == unembed) continue;  // tied: the embedding is used, as from_pretrained does
    bool known = false;
    for (const HfTensor& e : map) known = known || e.hf == name;
    if (!known)
      fail(origin[name], ": unexpected tensor '", name, "' (not part of the ", type, " model config.json describes)");
  }

  SafetensorsFile out;
  out.source = dir;
  for (const HfTensor& e : map) {
    StTensor& t = hf[e.hf];
    switch (e.how) {
      case HfTransform::Same: out.tensors[e.to[0]] = std::move(t); break;
      case HfTransform::NeoxQkv: {
        std::vector<StTensor> qkv = split_neox_qkv(t, cfg.n_heads, cfg.head_dim());
        for (int j = 0; j < 3; ++j) out.tensors[e.to[j]] = std::move(qkv[j]);
        break;
      }
    }
    hf.erase(e.hf);
  }
  if (tied) out.tensors["head.weight"] = out.tensors.at("tok_emb.weight");
  out.metadata["format"] = "headlab-checkpoint";
  out.metadata["format_version"] = "1";
  out.metadata["config"] = cfg.to_json();
  out.metadata["converted_from"] = "hf-" + type;
  return out;
}

namespace {

// A model's computation as (setting, value) pairs: two configs with the same pairs compute the same
// function of the same parameters. Provenance (arch), dropout and equivalent spellings (attn_bias
// vs qkv_bias/o_bias, rotary_pct vs rotary_dim, alternate vs per-layer letters, the default score
// scale) compare by what they do.
std::vector<std::pair<std::string, std::string>> computation(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> v;
  auto put = [&](const char* name, auto value) {
    std::ostringstream o;
    o.precision(9);
    o << value;
    v.emplace_back(name, o.str());
  };
  put("vocab_size", c.vocab_size);
  put("d_model", c.d_model);
  put("n_layers", c.n_layers);
  put("n_heads", c.n_heads);
  put("n_kv_heads", c.kv_heads());
  put("d_head", c.head_dim());
  put("d_ff", c.d_ff);
  put("max_seq_len", c.max_seq_len);
  put("norm", to_string(c.norm));
  put("normalization", to_string(c.normalization));
  put("layer_norm_eps", c.layer_norm_eps);
  put("positions", to_string(c.positions));
  if (c.positions == Positions::Rotary) {
    std::string thetas;  // each layer's base: rope_theta, or rope_theta_local on local layers
    for (int l = 0; l < c.n_layers; ++l) {
      std::ostringstream o;
      o.precision(9);
      o << c.attention(l).rope.theta;
      thetas += o.str() + (l + 1 < c.n_layers ? "," : "");
    }
    put("rope_theta", thetas);
    put("rotary_dim", c.rotary_dims());
    put("rotary_style", c.rotary_style);
  }
  put("qk_norm", c.qk_norm);
  put("attn_scale", c.attn_scale > 0.f ? c.attn_scale : 1.f / std::sqrt(static_cast<float>(c.head_dim())));
  put("attn_softcap", c.attn_softcap);
  std::string windows;
  for (int l = 0; l < c.n_layers; ++l) windows += std::to_string(c.window_of_layer(l)) + (l + 1 < c.n_layers ? "," : "");
  put("sliding_window", windows);
  const AttentionConfig a = c.attention();
  put("qkv_bias", a.has_qkv_bias());
  put("o_bias", a.has_o_bias());
  if (c.has_mlp()) {
    put("mlp", to_string(c.mlp));
    put("activation", to_string(c.gated_mlp() ? c.gate_activation() : c.activation));
    put("mlp_bias", c.mlp_bias);
  }
  put("head_bias", c.head_bias);
  put("sandwich_norm", c.sandwich_norm);
  put("parallel_block", c.parallel_block);
  put("embed_scale", c.embed_scale);
  put("final_softcap", c.final_softcap);
  return v;
}

const char* hf_activation(Activation a) {
  switch (a) {
    case Activation::GeluErf: return "gelu";
    case Activation::GeluTanh: return "gelu_pytorch_tanh";
    case Activation::Relu: return "relu";
    case Activation::Silu: return "silu";
    default: return "";  // relu2: no HF name
  }
}

// config.json for `type` from the model's settings (hf_model_config reads it back).
json hf_config_json(const ModelConfig& c, const std::string& type, bool tied) {
  const Family fam = family_of(type);
  const AttentionConfig a = c.attention();
  json j = {{"model_type", type}, {"vocab_size", c.vocab_size}, {"max_position_embeddings", c.max_seq_len},
            {"hidden_size", c.d_model}, {"tie_word_embeddings", tied}, {"torch_dtype", "float32"}};
  const double dh = static_cast<double>(c.head_dim());
  if (fam == Family::Neo) {
    j["architectures"] = {"GPTNeoForCausalLM"};
    j["num_layers"] = c.n_layers;
    j["num_heads"] = c.n_heads;
    j["intermediate_size"] = c.d_ff;
    j["activation_function"] = c.activation == Activation::GeluTanh ? "gelu_new" : hf_activation(c.activation);
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    json types = json::array();
    for (int l = 0; l < c.n_layers; ++l) types.push_back({{c.window_of_layer(l) > 0 ? "local" : "global"}, 1});
    j["attention_types"] = types;
    j["window_size"] = c.sliding_window > 0 ? c.sliding_window : 256;
    return j;
  }
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["intermediate_size"] = c.d_ff;
  j["rope_theta"] = c.rope_theta;
  if (fam == Family::NeoX) {
    j["architectures"] = {"GPTNeoXForCausalLM"};
    j["hidden_act"] = hf_activation(c.activation);
    j["layer_norm_eps"] = c.layer_norm_eps;
    j["use_parallel_residual"] = c.parallel_block;
    j["rotary_pct"] = static_cast<double>(c.rotary_dims()) / dh;
    j["rotary_emb_base"] = c.rope_theta;
    j["attention_bias"] = a.has_qkv_bias();
    return j;
  }
  j["num_key_value_heads"] = c.kv_heads();
  j["head_dim"] = c.head_dim();
  j["rms_norm_eps"] = c.layer_norm_eps;
  j["rope_scaling"] = nullptr;
  if (fam == Family::Gemma) {
    j["architectures"] = {type == "gemma2" ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"};
    if (type == "gemma3_text") j["rope_local_base_freq"] = c.rope_theta_local > 0.f ? c.rope_theta_local : c.rope_theta;
    j["hidden_activation"] = hf_activation(c.gate_activation());
    const double s = c.attn_scale > 0.f ? c.attn_scale : 1.0 / std::sqrt(dh);
    j["query_pre_attn_scalar"] = 1.0 / (s * s);
    j["attn_logit_softcapping"] = c.attn_softcap > 0.f ? json(c.attn_softcap) : json(nullptr);
    j["final_logit_softcapping"] = c.final_softcap > 0.f ? json(c.final_softcap) : json(nullptr);
    j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : 4096;
    json types = json::array();
    for (int l = 0; l < c.n_layers; ++l) types.push_back(c.window_of_layer(l) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    j["attention_bias"] = false;
    return j;
  }
  j["hidden_act"] = "silu";
  const std::map<std::string, const char*> names = {
      {"llama", "LlamaForCausalLM"}, {"mistral", "MistralForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"}};
  j["architectures"] = {names.at(type)};
  if (type == "llama") {
    j["attention_bias"] = a.has_qkv_bias();
    j["mlp_bias"] = c.mlp_bias;
  } else if (type == "qwen3") {
    j["attention_bias"] = a.has_qkv_bias();
  }
  if (type == "qwen2" || type == "qwen3") j["use_sliding_window"] = false;
  if (type == "mistral") j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  return j;
}

// The first setting where `want` and `got` differ, as "name value (the layout: other)"; "" if none.
std::string first_difference(const ModelConfig& want, const ModelConfig& got) {
  const auto a = computation(want), b = computation(got);
  for (size_t i = 0; i < a.size(); ++i)
    if (i >= b.size() || a[i] != b[i])
      return a[i].first + " " + a[i].second + " (the layout gives " + (i < b.size() ? b[i].second : "nothing") + ")";
  return "";
}

// "" when `type`'s layout expresses the model, else the first setting it cannot.
std::string layout_gap(const TransformerLM& model, const std::string& type) {
  const ModelConfig& c = model.cfg;
  if (!model.gates_all_one()) return "head gates (a pruned model): export with --format hf-gpt2, which folds them";
  if (c.has_mlp() && c.gated_mlp() == (family_of(type) == Family::NeoX || family_of(type) == Family::Neo))
    return std::string("mlp ") + to_string(c.mlp) + " (the layout's MLP is " + (c.gated_mlp() ? "plain" : "gated") + ")";
  if (!c.has_mlp()) return "d_ff 0 (attention-only: every block of the layout has an MLP)";
  if (c.has_mlp() && !*hf_activation(c.gated_mlp() ? c.gate_activation() : c.activation))
    return "activation " + to_string(c.activation) + " (no Hugging Face name)";
  ModelConfig back;
  try {
    back = hf_model_config(hf_config_json(c, type, true).dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return first_difference(c, back);
}

}  // namespace

std::string hf_layout_for(const TransformerLM& model) {
  try {
    check_hf_gpt2_exportable(model);
    return "gpt2";
  } catch (const Error&) {
  }
  const std::vector<std::string> order = {"gpt_neox", "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "gpt_neo"};
  for (const std::string& t : order)
    if (layout_gap(model, t).empty()) return t;
  // the nearest: the layout of the model's MLP and norm kind
  const ModelConfig& c = model.cfg;
  const std::string nearest = c.normalization == NormKind::RMSNorm1p ? (c.qk_norm ? "gemma3_text" : "gemma2")
                              : c.normalization == NormKind::RMSNorm ? (c.qk_norm ? "qwen3" : "llama")
                              : c.positions == Positions::Rotary     ? "gpt_neox"
                                                                     : "gpt_neo";
  fail("export --format hf: no Hugging Face layout expresses the model; the nearest, ", nearest, ", cannot express its ",
       layout_gap(model, nearest));
}

void check_hf_model_exportable(const TransformerLM& model, const std::string& type) {
  const std::string gap = layout_gap(model, type);
  if (!gap.empty()) fail("export --format hf-", type, ": the ", type, " layout cannot express the model's ", gap);
}

const std::vector<std::string>& hf_tokenizer_files() {
  static const std::vector<std::string> names = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                                 "tokenizer.model", "vocab.json", "merges.txt"};
  return names;
}

bool write_hf_model(const TransformerLM& model, const std::string& type, const std::string& dir, const std::string& tokenizer_dir) {
  check_hf_model_exportable(model, type);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir, ec)) && !fs::is_directory(fs::symlink_status(dir, ec)))
    fail(dir, ": exists and is not a directory");
  if (fs::is_directory(dir, ec))
    for (const auto& entry : fs::directory_iterator(dir, ec))
      fail(dir, ": already holds ", entry.path().filename().string(),
           "; the export writes a directory of its own: give a new or empty directory");
  const auto tokenizer = own_tokenizer_files(tokenizer_dir, hf_tokenizer_files());  // name, bytes
  const ModelConfig& c = model.cfg;
  std::map<std::string, Tensor> p;
  for (auto& [name, t] : model.named_parameters()) p[name] = t;
  const Tensor& emb = p.at("tok_emb.weight");
  const Tensor& head = p.at("head.weight");
  const bool tied = std::memcmp(emb.data(), head.data(), sizeof(float) * emb.numel()) == 0;
  SafetensorsWriter w;
  w.set_meta("format", "pt");
  for (const HfTensor& e : hf_tensor_map(type, c, tied)) {
    if (e.how == HfTransform::Same) {
      w.add(e.hf, p.at(e.to[0]));
      continue;
    }
    // NeoxQkv: the three (H * d_head, cols) blocks interleaved per head, rows [H][3][d_head]
    const int64_t H = c.n_heads, dh = c.head_dim(), cols = e.shape.ndim == 2 ? e.shape[1] : 1;
    Tensor fused = Tensor::empty(e.shape);
    for (int j = 0; j < 3; ++j) {
      const float* src = p.at(e.to[j]).data();
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < dh; ++i)
          std::memcpy(fused.data() + ((h * 3 + j) * dh + i) * cols, src + (h * dh + i) * cols, sizeof(float) * cols);
    }
    w.add(e.hf, fused);
  }
  const std::string weights = w.serialize();
  StagedDir out(dir);  // all files, or none on a full disk or a signal
  write_file_atomic(out.file("model.safetensors"), weights);
  write_file_atomic(out.file("config.json"), hf_config_json(c, type, tied).dump(2) + "\n");
  for (const auto& [name, bytes] : tokenizer) write_file_atomic(out.file(name), bytes);
  out.publish();
  return tied;
}

}  // namespace hl
