// Hugging Face model directories of today's decoder-only architectures (docs/models.md):
// gpt_neox (Pythia), llama, mistral, qwen2, qwen3, gpt_neo, gemma2 and gemma3_text, beside GPT-2's own reader
// (models/hf_gpt2.h). A directory holds config.json and model.safetensors, or shards listed in
// model.safetensors.index.json; BF16 and F16 tensors are widened to float32 exactly.
//
// Each architecture is two tables read in one place: config.json's keys -> ModelConfig
// (hf_model_config), and HF tensor names -> headlab parameter names with a per-tensor transform
// (hf_tensor_map). Reading and writing both walk the same map, so what is read is what is written.
#pragma once
#include <string>
#include <vector>

#include "lib/safetensors.h"
#include "models/transformer.h"

namespace hl {

// The ungrouped equivalent of a grouped-query model (TransformerLens's ungroup_grouped_query_attention):
// n_kv_heads = n_heads, each query head's W_K / W_V rows (and biases) a copy of its group's key and
// value head (query head h reads kv head h / (n_heads / n_kv_heads)); everything else (QK-norm
// weights, which are shared by the heads, and the head gates) copied. Its forward computes the
// same logits; a head's key and value inputs are then its own, so the edge analyses can patch one
// query head's copy. A model that already has a key and value head per query head is copied as it is.
std::unique_ptr<TransformerLM> ungroup_grouped_query_attention(const TransformerLM& model);

// The model_type values read here (gpt2 is read by models/hf_gpt2.h).
const std::vector<std::string>& hf_model_types();

// The headlab config of a config.json of one of hf_model_types(); refuses, naming the field, what
// headlab cannot represent (rope_scaling other than default, a sliding window on Qwen, an unknown
// activation, ...). `source` names the file in messages.
ModelConfig hf_model_config(const std::string& config_text, const std::string& source);

// How one HF tensor becomes headlab parameters.
enum class HfTransform {
  Same,          // the same values under another name
  NeoxQkv,       // GPT-NeoX's fused query_key_value, rows per head [H, 3, d_head] -> W_Q, W_K, W_V
};
struct HfTensor {
  std::string hf;               // the HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;                  // its shape as config.json describes it
  std::vector<std::string> to;  // headlab parameter(s) it becomes
  HfTransform how = HfTransform::Same;
};
// Every tensor of an HF model of this type and config, in the order the HF model has them; the
// unembedding (lm_head / embed_out) only when `tied` is false.
std::vector<HfTensor> hf_tensor_map(const std::string& model_type, const ModelConfig& cfg, bool tied);

// Reads any HF directory headlab knows (gpt2 and hf_model_types()) as a headlab checkpoint held in
// memory (parameters under headlab's names, the metadata of a headlab checkpoint). Every tensor is
// checked against config.json (name and shape) before any model is built; an unknown model_type,
// a missing or extra tensor, and a shape config.json does not describe are refused naming them.
SafetensorsFile read_hf_directory(const std::string& dir);
// About how many bytes loading an HF model of this config takes at its peak: its float32
// parameters once (the files' tensors are held as stored and each is widened straight into its
// parameter as load_model_releasing fills the model, releasing them), the largest tensor once
// more in flight, and one rotary table per angle base. read_hf_directory refuses, before reading
// any weight, a model that needs more than the memory available (the estimate in the message).
double hf_load_bytes(const ModelConfig& cfg);

// The layouts `headlab export --format hf` can write: "gpt2" (models/hf_gpt2.h) and
// hf_model_types().
// The layout a model's options call for: the first of gpt2, gpt_neox, llama, qwen2, qwen3,
// mistral, gemma2, gemma3_text, gpt_neo that expresses it exactly; refuses, naming the nearest layout's first
// setting it cannot express, a model none expresses.
std::string hf_layout_for(const TransformerLM& model);
// Refuses, naming the setting, a model the `model_type` layout cannot express (the config written
// must read back as the model's own: every setting that changes its computation compared).
void check_hf_model_exportable(const TransformerLM& model, const std::string& model_type);
// The tokenizer files of today's models (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, and the vocab.json / merges.txt / tokenizer.model some also ship).
const std::vector<std::string>& hf_tokenizer_files();
// Writes `model` as a `model_type` directory: config.json and model.safetensors (F32) under
// that architecture's names, through hf_tensor_map (NeoX's query_key_value fused per head). The
// unembedding is tied when head.weight equals tok_emb.weight bit for bit. With `tokenizer_dir`,
// the hf_tokenizer_files() found there are copied byte for byte (own_tokenizer_files). `dir` is
// written all or nothing: it must be new or empty. Returns whether the unembedding was tied.
bool write_hf_model(const TransformerLM& model, const std::string& model_type, const std::string& dir,
                    const std::string& tokenizer_dir = "");

}  // namespace hl
