#include "models/hf_gpt2.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "lib/fileutil.h"
#include "models/hf_config.h"

namespace hl {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json parse_json_file(const std::string& path) {
  if (!file_exists(path)) fail(path, ": not found");
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

// (rows, cols) float32 bytes -> columns [c0, c0 + n) transposed: (n, rows) bytes. Conv1D keeps
// its weight as (in, out); headlab's Linear as (out, in).
std::string transposed_cols(const StTensor& t, int64_t c0, int64_t n) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::string out(static_cast<size_t>(4 * n * rows), '\0');
  const char* in = t.bytes.data();
  char* o = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) std::memcpy(o + 4 * (j * rows + r), in + 4 * (r * cols + c0 + j), 4);
  return out;
}

StTensor f32_tensor(Shape shape, std::string bytes) {
  StTensor t;
  t.dtype = DType::F32;
  t.shape = shape;
  t.bytes = std::move(bytes);
  return t;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// GPT-2's causal-mask buffers: not parameters, whatever dtype they were saved in.
bool is_mask_buffer(const std::string& name) { return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"); }

}  // namespace

std::map<std::string, StTensor> read_hf_weights(const std::string& dir, const SkipTensor& skip,
                                                std::map<std::string, std::string>& origin) {
  // The weight files: one model.safetensors, or the shards the index names.
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // tensor -> shard, from the index
  if (file_exists(dir + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else if (file_exists(dir + "/model.safetensors.index.json")) {
    const std::string index_path = dir + "/model.safetensors.index.json";
    const json index = parse_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(index_path, ": needs a \"weight_map\" object (tensor name -> shard file)");
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail(index_path, ": weight_map entry '", it.key(), "' is not a file name");
      const std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos || shard == "..")
        fail(index_path, ": shard name '", shard, "' must be a file in the same directory");
      weight_map[it.key()] = shard;
      if (std::find(files.begin(), files.end(), shard) == files.end()) files.push_back(shard);
    }
    if (files.empty()) fail(index_path, ": weight_map names no shard");
  } else {
    fail(dir, ": has a config.json but neither model.safetensors nor model.safetensors.index.json");
  }
  std::map<std::string, StTensor> hf;
  for (const std::string& name : files) {
    const std::string path = dir + "/" + name;
    if (!file_exists(path)) fail(dir, ": shard '", name, "' named in model.safetensors.index.json is missing");
    SafetensorsFile shard = read_safetensors(path, skip);
    for (auto& [key, t] : shard.tensors) {
      if (!weight_map.empty()) {
        auto w = weight_map.find(key);
        if (w == weight_map.end() || w->second != name)
          fail(path, ": tensor '", key, "' is not listed for this shard in model.safetensors.index.json");
      }
      if (hf.count(key)) fail(path, ": tensor '", key, "' appears twice (in two shards)");
      if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
        fail(path, ": tensor '", key, "' is ", dtype_name(t.dtype), "; model weights are read from F32, BF16 or F16");
      origin[key] = path;
      hf[key] = std::move(t);  // as stored: widened only on the way into the model (SafetensorsFile::f32_into)
    }
  }
  for (auto& [key, shard] : weight_map) {
    if (skip && skip(key)) continue;
    if (!hf.count(key)) fail(dir + "/" + shard, ": tensor '", key, "' listed in model.safetensors.index.json is not in the shard");
  }
  return hf;
}

const std::vector<std::string>& gpt2_tokenizer_files() {
  static const std::vector<std::string> names = {"vocab.json", "merges.txt", "encoder.json", "vocab.bpe"};
  return names;
}

std::vector<std::pair<std::string, std::string>> own_tokenizer_files(const std::string& dir, const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<std::string, std::string>> files;
  if (dir.empty()) return files;
  for (const std::string& name : names) {
    const std::string from = dir + "/" + name;
    if (!fs::exists(fs::symlink_status(from, ec))) continue;
    if (!is_own_file_of(dir, from))
      fail(from, ": is a symbolic link to ", fs::weakly_canonical(from, ec).string(), ", outside ", dir,
           "; the export copies only the model directory's own files: copy the file there or remove the link");
    files.emplace_back(name, read_file(from));
  }
  return files;
}

json parse_config_object(const std::string& text, const std::string& source) {
  json c;
  try {
    c = json::parse(text);
  } catch (const json::exception& e) {
    fail(source, ": not valid JSON (", e.what(), ")");
  }
  if (!c.is_object()) fail(source, ": not a JSON object");
  return c;
}

ModelConfig hf_gpt2_config(const std::string& config_text, const std::string& source) {
  json c = parse_config_object(config_text, source);
  auto integer = [&](const char* key, int64_t lo, int64_t hi) -> int64_t {
    if (!c.contains(key)) fail(source, ": GPT-2 config field '", key, "' is missing");
    const json& v = c[key];
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      fail(source, ": GPT-2 config field '", key, "' must be an integer in ", lo, "..", hi, ", got ", v.dump());
    return v.get<int64_t>();
  };
  auto flag = [&](const char* key, bool dflt) {
    if (!c.contains(key) || c[key].is_null()) return dflt;
    if (!c[key].is_boolean()) fail(source, ": GPT-2 config field '", key, "' must be true or false, got ", c[key].dump());
    return c[key].get<bool>();
  };
  if (c.contains("model_type") && c["model_type"] != "gpt2")
    fail(source, ": model_type is ", c["model_type"].dump(), ", only \"gpt2\" is read");
  ModelConfig cfg;
  cfg.vocab_size = integer("vocab_size", 1, int64_t{1} << 24);
  cfg.max_seq_len = integer("n_positions", 1, int64_t{1} << 20);
  cfg.d_model = integer("n_embd", 1, int64_t{1} << 16);
  cfg.n_layers = static_cast<int>(integer("n_layer", 1, 1024));
  cfg.n_heads = static_cast<int>(integer("n_head", 1, 4096));
  if (cfg.d_model % cfg.n_heads != 0)
    fail(source, ": GPT-2 config n_embd ", cfg.d_model, " is not a multiple of n_head ", cfg.n_heads);
  cfg.d_ff = 4 * cfg.d_model;
  if (c.contains("n_inner") && !c["n_inner"].is_null()) cfg.d_ff = integer("n_inner", 1, int64_t{1} << 20);
  const std::string act = c.contains("activation_function") ? c["activation_function"].dump() : "\"gelu_new\"";
  if (act == "\"gelu_new\"" || act == "\"gelu_pytorch_tanh\"") cfg.activation = Activation::GeluTanh;
  else if (act == "\"gelu\"") cfg.activation = Activation::GeluErf;
  else if (act == "\"relu\"") cfg.activation = Activation::Relu;
  else fail(source, ": GPT-2 config activation_function ", act, " is not one headlab has (gelu_new, gelu_pytorch_tanh, gelu, relu)");
  cfg.layer_norm_eps = 1e-5f;
  if (c.contains("layer_norm_epsilon")) {
    const json& e = c["layer_norm_epsilon"];
    if (!e.is_number() || !(e.get<double>() > 0)) fail(source, ": GPT-2 config layer_norm_epsilon must be a positive number, got ", e.dump());
    cfg.layer_norm_eps = e.get<float>();
  }
  // What headlab's attention cannot do.
  if (!flag("scale_attn_weights", true))
    fail(source, ": GPT-2 config scale_attn_weights false (no 1/sqrt(d_head) scaling) is not supported");
  if (flag("scale_attn_by_inverse_layer_idx", false))
    fail(source, ": GPT-2 config scale_attn_by_inverse_layer_idx true (scores divided by the layer number) is not supported");
  if (flag("add_cross_attention", false)) fail(source, ": GPT-2 config add_cross_attention true (an encoder-decoder model) is not supported");
  flag("tie_word_embeddings", true);  // read again by read_hf_gpt2; checked here, where every field is
  // reorder_and_upcast_attn only changes float16 numerics: the same maths in float32.
  cfg.norm = Norm::Pre;
  cfg.positions = Positions::Learned;
  cfg.attn_bias = true;
  cfg.mlp_bias = true;
  cfg.head_bias = false;
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
  return cfg;
}

SafetensorsFile read_hf_gpt2(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  if (!file_exists(config_path))
    fail(dir, ": a directory is read as a Hugging Face GPT-2 model (config.json and model.safetensors), but it has no config.json");
  const std::string config_text = read_file(config_path);
  const ModelConfig cfg = hf_gpt2_config(config_text, config_path);
  const json cj = json::parse(config_text);
  // a boolean or absent (hf_gpt2_config refused anything else)
  const bool tied = !cj.contains("tie_word_embeddings") || cj["tie_word_embeddings"].is_null() ||
                    cj["tie_word_embeddings"].get<bool>();

  // Read every shard, the mask buffers skipped; names without the "transformer." prefix.
  std::map<std::string, std::string> file_of;  // tensor -> file, for messages
  std::map<std::string, StTensor> hf;
  std::map<std::string, std::string> origin;
  for (auto& [key, t] : read_hf_weights(dir, is_mask_buffer, file_of)) {
    std::string k = key.rfind("transformer.", 0) == 0 ? key.substr(12) : key;
    if (hf.count(k)) fail(file_of[key], ": tensor '", key, "' appears twice (with and without the transformer. prefix)");
    origin[k] = file_of[key];
    // float32 here (the Conv1D transposes and the c_attn split below work on 4-byte values); a
    // BF16/F16 tensor's narrow bytes are released as soon as it is widened
    hf[k] = t.dtype == DType::F32 ? std::move(t) : as_f32(t, key, file_of[key]);
    std::string().swap(t.bytes);
  }

  // Every GPT-2 tensor the config needs, with its shape: (in, out) for Conv1D weights.
  const int64_t d = cfg.d_model, V = cfg.vocab_size, P = cfg.max_seq_len, F = cfg.d_ff;
  std::vector<std::pair<std::string, Shape>> expected = {{"wte.weight", Shape{V, d}}, {"wpe.weight", Shape{P, d}}};
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      expected.push_back({h + ln + ".weight", Shape{d}});
      expected.push_back({h + ln + ".bias", Shape{d}});
    }
    expected.push_back({h + "attn.c_attn.weight", Shape{d, 3 * d}});
    expected.push_back({h + "attn.c_attn.bias", Shape{3 * d}});
    expected.push_back({h + "attn.c_proj.weight", Shape{d, d}});
    expected.push_back({h + "attn.c_proj.bias", Shape{d}});
    expected.push_back({h + "mlp.c_fc.weight", Shape{d, F}});
    expected.push_back({h + "mlp.c_fc.bias", Shape{F}});
    expected.push_back({h + "mlp.c_proj.weight", Shape{F, d}});
    expected.push_back({h + "mlp.c_proj.bias", Shape{d}});
  }
  expected.push_back({"ln_f.weight", Shape{d}});
  expected.push_back({"ln_f.bias", Shape{d}});
  if (!tied) expected.push_back({"lm_head.weight", Shape{V, d}});
  const std::string summary = "(n_embd " + std::to_string(d) + ", n_layer " + std::to_string(cfg.n_layers) + ", n_head " +
                              std::to_string(cfg.n_heads) + ", n_inner " + std::to_string(F) + ", vocab_size " +
                              std::to_string(V) + ", n_positions " + std::to_string(P) + ")";
  for (auto& [name, shape] : expected) {
    auto it = hf.find(name);
    if (it == hf.end()) fail(dir, ": missing tensor '", name, "' that config.json needs");
    if (it->second.shape != shape)
      fail(origin[name], ": tensor '", name, "' has shape ", it->second.shape.str(), " but config.json ", summary, " needs ",
           shape.str());
  }
  for (auto& [name, t] : hf) {
    if (name == "lm_head.weight") continue;  // tied: the copy of wte is used, as from_pretrained does
    bool known = false;
    for (auto& [e, s] : expected) known = known || e == name;
    if (!known) fail(origin[name], ": unexpected tensor '", name, "' (not part of the GPT-2 model config.json describes)");
  }

  // Rename and transpose, one tensor at a time (each GPT-2 tensor is released once mapped).
  SafetensorsFile out;
  out.source = dir;
  auto move = [&](const std::string& from, const std::string& to) {
    out.tensors[to] = std::move(hf[from]);
    hf.erase(from);
  };
  out.tensors["head.weight"] = tied ? hf["wte.weight"] : std::move(hf["lm_head.weight"]);  // (V, d)
  hf.erase("lm_head.weight");
  move("wte.weight", "tok_emb.weight");
  move("wpe.weight", "pos_emb.weight");
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".", b = block_prefix(l);
    move(h + "ln_1.weight", b + "ln1.weight");
    move(h + "ln_1.bias", b + "ln1.bias");
    move(h + "ln_2.weight", b + "ln2.weight");
    move(h + "ln_2.bias", b + "ln2.bias");
    // c_attn (d, 3d) = [W_Q^T | W_K^T | W_V^T]; its bias (3d) = [b_Q | b_K | b_V].
    const StTensor& qkv = hf[h + "attn.c_attn.weight"];
    const StTensor& qkv_b = hf[h + "attn.c_attn.bias"];
    const char* names[3] = {"W_Q", "W_K", "W_V"};
    for (int i = 0; i < 3; ++i) {
      out.tensors[b + "attn." + names[i] + ".weight"] = f32_tensor(Shape{d, d}, transposed_cols(qkv, i * d, d));  // (d, d)
      out.tensors[b + "attn." + names[i] + ".bias"] = f32_tensor(Shape{d}, qkv_b.bytes.substr(4 * i * d, 4 * d));
    }
    hf.erase(h + "attn.c_attn.weight");
    hf.erase(h + "attn.c_attn.bias");
    out.tensors[b + "attn.W_O.weight"] = f32_tensor(Shape{d, d}, transposed_cols(hf[h + "attn.c_proj.weight"], 0, d));
    hf.erase(h + "attn.c_proj.weight");
    move(h + "attn.c_proj.bias", b + "attn.W_O.bias");
    out.tensors[b + "ffn.fc1.weight"] = f32_tensor(Shape{F, d}, transposed_cols(hf[h + "mlp.c_fc.weight"], 0, F));  // (d_ff, d)
    hf.erase(h + "mlp.c_fc.weight");
    move(h + "mlp.c_fc.bias", b + "ffn.fc1.bias");
    out.tensors[b + "ffn.fc2.weight"] = f32_tensor(Shape{d, F}, transposed_cols(hf[h + "mlp.c_proj.weight"], 0, d));  // (d, d_ff)
    hf.erase(h + "mlp.c_proj.weight");
    move(h + "mlp.c_proj.bias", b + "ffn.fc2.bias");
  }
  move("ln_f.weight", "ln_f.weight");
  move("ln_f.bias", "ln_f.bias");
  out.metadata["format"] = "headlab-checkpoint";
  out.metadata["format_version"] = "1";
  out.metadata["config"] = cfg.to_json();
  out.metadata["converted_from"] = "hf-gpt2";
  return out;
}

void check_hf_gpt2_exportable(const TransformerLM& model) {
  const ModelConfig& c = model.cfg;
  auto refuse = [](auto&&... why) { fail("export --format hf-gpt2: ", why..., "; GPT-2's layout cannot express it"); };
  if (c.norm != Norm::Pre) refuse("the model is post-norm (norm \"post\"), GPT-2 is pre-norm");
  if (c.positions != Positions::Learned)
    refuse("the model has ", to_string(c.positions), " positions (positions \"", to_string(c.positions), "\"), GPT-2 learns them");
  if (c.qk_norm || c.attn_scale != 0.f || c.attn_softcap != 0.f || c.sliding_window != 0 || c.qkv_bias != c.o_bias ||
      (c.qkv_bias && !c.attn_bias))
    refuse("the model's attention has options GPT-2's has not (qk_norm, attn_scale, attn_softcap, sliding_window or "
           "qkv_bias/o_bias apart)");
  if (c.kv_heads() != c.n_heads) refuse("the model has n_kv_heads ", c.kv_heads(), " != n_heads ", c.n_heads, " (grouped-query attention)");
  if (c.head_dim() * c.n_heads != c.d_model)
    refuse("the model has d_head ", c.head_dim(), " x n_heads ", c.n_heads, " != d_model ", c.d_model);
  if (!c.has_mlp()) refuse("the model is attention-only (d_ff 0), every GPT-2 block has an MLP");
  if (c.head_bias) refuse("the model's unembedding has a bias (head_bias), GPT-2's lm_head has none");
  // the block options: GPT-2's block is LayerNorm, a plain gelu/relu MLP, sequential, unscaled, uncapped
  if (c.activation == Activation::Relu2 || c.activation == Activation::Silu)
    refuse("the model's activation is ", to_string(c.activation), ", GPT-2's are gelu and relu");
  if (c.normalization != NormKind::LayerNorm) refuse("the model's normalization is ", to_string(c.normalization), ", GPT-2's is layernorm");
  if (c.sandwich_norm) refuse("the model has sandwich norms (sandwich_norm)");
  if (c.gated_mlp()) refuse("the model's MLP is gated (mlp \"", to_string(c.mlp), "\")");
  if (c.parallel_block) refuse("the model has parallel blocks (parallel_block)");
  if (c.embed_scale) refuse("the model scales its embeddings (embed_scale)");
  if (c.final_softcap > 0.f) refuse("the model soft-caps its logits (final_softcap)");
}

bool write_hf_gpt2(const TransformerLM& model, const std::string& dir, const std::string& tokenizer_dir) {
  check_hf_gpt2_exportable(model);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir, ec)) && !fs::is_directory(fs::symlink_status(dir, ec)))
    fail(dir, ": exists and is not a directory");
  if (fs::is_directory(dir, ec))
    for (const auto& entry : fs::directory_iterator(dir, ec))
      fail(dir, ": already holds ", entry.path().filename().string(),
           "; the export writes a directory of its own: give a new or empty directory");
  const auto tokenizer = own_tokenizer_files(tokenizer_dir, gpt2_tokenizer_files());  // name, bytes
  const ModelConfig& c = model.cfg;
  const int64_t d = c.d_model, F = c.d_ff;
  std::map<std::string, Tensor> p;
  for (auto& [name, t] : model.named_parameters()) p[name] = t;
  const Tensor& wte = p.at("tok_emb.weight");
  const Tensor& head = p.at("head.weight");
  const bool tied = std::memcmp(wte.data(), head.data(), sizeof(float) * wte.numel()) == 0;

  // (out, in) Linear weight -> (in, out) Conv1D bytes, columns [c0, c0 + n) of the Conv1D weight.
  auto conv1d_into = [](const Tensor& w, std::vector<float>& dst, int64_t dst_cols, int64_t c0, const std::vector<float>& row_scale) {
    const int64_t out = w.shape()[0], in = w.shape()[1];
    const float* s = w.data();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        dst[static_cast<size_t>(i * dst_cols + c0 + o)] = s[o * in + i] * (row_scale.empty() ? 1.f : row_scale[i]);
  };
  auto tensor_of = [](const std::vector<float>& v, Shape shape) {
    Tensor t = Tensor::empty(shape);
    std::memcpy(t.data(), v.data(), 4 * v.size());
    return t;
  };
  auto bias_or_zeros = [&](const std::string& name, int64_t n) {
    auto it = p.find(name);
    return it != p.end() ? it->second : Tensor::zeros(Shape{n});
  };
  const std::vector<std::vector<float>> gates = model.gate_values();

  SafetensorsWriter w;
  w.set_meta("format", "pt");
  w.add("transformer.wte.weight", wte);
  w.add("transformer.wpe.weight", p.at("pos_emb.weight"));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".", b = block_prefix(l);
    w.add(h + "ln_1.weight", p.at(b + "ln1.weight"));
    w.add(h + "ln_1.bias", p.at(b + "ln1.bias"));
    std::vector<float> qkv(static_cast<size_t>(d * 3 * d)), qkv_b(static_cast<size_t>(3 * d));  // (d, 3d), (3d)
    const char* names[3] = {"W_Q", "W_K", "W_V"};
    for (int i = 0; i < 3; ++i) {
      conv1d_into(p.at(b + "attn." + names[i] + ".weight"), qkv, 3 * d, i * d, {});
      const Tensor bias = bias_or_zeros(b + "attn." + names[i] + ".bias", d);
      std::memcpy(qkv_b.data() + i * d, bias.data(), 4 * d);
    }
    w.add(h + "attn.c_attn.weight", tensor_of(qkv, Shape{d, 3 * d}));
    w.add(h + "attn.c_attn.bias", tensor_of(qkv_b, Shape{3 * d}));
    // Head gates scale each head's output, i.e. its d_head rows of c_proj (W_O's columns).
    std::vector<float> scale;
    if (!model.gates_all_one()) {
      scale.resize(static_cast<size_t>(d));
      for (int64_t i = 0; i < d; ++i) scale[i] = gates[l][i / c.head_dim()];
    }
    std::vector<float> proj(static_cast<size_t>(d * d));
    conv1d_into(p.at(b + "attn.W_O.weight"), proj, d, 0, scale);
    w.add(h + "attn.c_proj.weight", tensor_of(proj, Shape{d, d}));
    w.add(h + "attn.c_proj.bias", bias_or_zeros(b + "attn.W_O.bias", d));
    w.add(h + "ln_2.weight", p.at(b + "ln2.weight"));
    w.add(h + "ln_2.bias", p.at(b + "ln2.bias"));
    std::vector<float> fc(static_cast<size_t>(d * F)), fc2(static_cast<size_t>(F * d));
    conv1d_into(p.at(b + "ffn.fc1.weight"), fc, F, 0, {});
    w.add(h + "mlp.c_fc.weight", tensor_of(fc, Shape{d, F}));
    w.add(h + "mlp.c_fc.bias", bias_or_zeros(b + "ffn.fc1.bias", F));
    conv1d_into(p.at(b + "ffn.fc2.weight"), fc2, d, 0, {});
    w.add(h + "mlp.c_proj.weight", tensor_of(fc2, Shape{F, d}));
    w.add(h + "mlp.c_proj.bias", bias_or_zeros(b + "ffn.fc2.bias", d));
  }
  w.add("transformer.ln_f.weight", p.at("ln_f.weight"));
  w.add("transformer.ln_f.bias", p.at("ln_f.bias"));
  if (!tied) w.add("lm_head.weight", head);

  const char* act = c.activation == Activation::GeluTanh ? "gelu_new" : c.activation == Activation::GeluErf ? "gelu" : "relu";
  json cfg = {{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", c.vocab_size},
              {"n_positions", c.max_seq_len},
              {"n_ctx", c.max_seq_len},
              {"n_embd", d},
              {"n_layer", c.n_layers},
              {"n_head", c.n_heads},
              {"n_inner", F},
              {"activation_function", act},
              {"layer_norm_epsilon", c.layer_norm_eps},
              {"resid_pdrop", c.dropout},
              {"embd_pdrop", c.dropout},
              {"attn_pdrop", c.attn_dropout},
              {"initializer_range", 0.02},
              {"scale_attn_weights", true},
              {"scale_attn_by_inverse_layer_idx", false},
              {"reorder_and_upcast_attn", false},
              {"tie_word_embeddings", tied},
              {"torch_dtype", "float32"}};
  const std::string weights = w.serialize();
  StagedDir out(dir);  // all files, or none on a full disk or a signal
  write_file_atomic(out.file("model.safetensors"), weights);
  write_file_atomic(out.file("config.json"), cfg.dump(2) + "\n");
  for (const auto& [name, bytes] : tokenizer) write_file_atomic(out.file(name), bytes);
  out.publish();
  return tied;
}

}  // namespace hl
