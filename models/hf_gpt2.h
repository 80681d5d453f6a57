// Hugging Face GPT-2 checkpoints (docs/formats.md, "GPT-2 layout"): a directory with config.json
// and model.safetensors, or shards model-0000k-of-0000n.safetensors listed in
// model.safetensors.index.json. GPT-2 is a pre-norm transformer with learned positions, biases
// everywhere and a tied unembedding, which headlab's TransformerLM represents exactly.
#pragma once
#include <map>
#include <string>

#include "lib/safetensors.h"
#include "models/transformer.h"

namespace hl {

// The headlab config of a GPT-2 config.json (its text); refuses, naming the field, what headlab
// cannot represent (scale_attn_by_inverse_layer_idx, add_cross_attention, an unknown
// activation_function, ...). `source` names the file in messages.
ModelConfig hf_gpt2_config(const std::string& config_text, const std::string& source);
// Reads a GPT-2 directory as a headlab checkpoint held in memory: parameters under headlab's
// names (Conv1D (in, out) weights transposed, c_attn split into W_Q, W_K, W_V), the lm_head a
// copy of wte when tied, and the metadata of a headlab checkpoint. The causal-mask buffers
// (attn.bias, attn.masked_bias) are skipped unread. Every tensor is checked against the config
// (name and shape) before any model is built.
SafetensorsFile read_hf_gpt2(const std::string& dir);
// Writes `model` as a GPT-2 directory: config.json and model.safetensors with
// GPT2LMHeadModel's keys ("transformer.h.0.attn.c_attn.weight", ...). A model GPT-2 cannot
// express is refused, naming the setting, before anything is written. The unembedding is tied
// (no lm_head.weight) when head.weight equals tok_emb.weight bit for bit, else the config says
// "tie_word_embeddings": false and lm_head.weight is written. Missing biases are written as
// zeros and head gates are folded into c_proj's rows: both exact. With `tokenizer_dir`, the
// tokenizer files found there (vocab.json, merges.txt, encoder.json, vocab.bpe) are copied
// byte for byte (a symbolic link to a file outside tokenizer_dir is refused: never copied out of
// its place). `dir` is written all or nothing (StagedDir): it must be new or empty, since the
// export never replaces a file it did not write. Returns whether the unembedding was tied.
bool write_hf_gpt2(const TransformerLM& model, const std::string& dir, const std::string& tokenizer_dir = "");
// Refuses, naming the setting, a model write_hf_gpt2 cannot express.
void check_hf_gpt2_exportable(const TransformerLM& model);
// The tensors of a Hugging Face directory's weight files: model.safetensors, or the shards
// model.safetensors.index.json lists (each tensor checked against the index), under their HF
// names, in their stored dtype (F32, BF16 or F16; SafetensorsFile::f32_into widens them exactly);
// tensors whose names pass `skip` are left out unread.
// `origin` gets each tensor's file, for messages. Shared by every HF reader.
std::map<std::string, StTensor> read_hf_weights(const std::string& dir, const SkipTensor& skip,
                                                std::map<std::string, std::string>& origin);
// The tokenizer file names copied beside a GPT-2 model.
const std::vector<std::string>& gpt2_tokenizer_files();
// The files among `names` that `dir` holds, as (name, bytes), to copy beside an exported model.
// Only the directory's own files: a symbolic link to a file outside `dir` is refused (it could
// carry any file of the user's into the export; a hub-cache snapshot's links to its blobs are its own).
std::vector<std::pair<std::string, std::string>> own_tokenizer_files(const std::string& dir, const std::vector<std::string>& names);

}  // namespace hl
