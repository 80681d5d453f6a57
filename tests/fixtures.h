// What the tests build, in one place: model and attention configs (a test names only what
// differs from the small defaults), scratch paths. Every field not named keeps ModelConfig's
// or AttentionConfig's own default.
#pragma once
#include <filesystem>
#include <functional>
#include <string>

#include "analysis/patching.h"
#include "lib/core.h"
#include "models/attention.h"
#include "models/transformer.h"
#include "train/settings.h"

namespace hl::test {

// 2 layers, d_model 8, 2 heads of 4, d_ff 12, 6 positions, vocabulary 7, biases on attention.
struct TestModel {
  int64_t vocab = 7;
  int64_t d_model = 8;
  int layers = 2;
  int heads = 2;
  int kv_heads = 0;  // 0 = heads
  int64_t d_ff = 12;
  int64_t max_seq_len = 6;
  Norm norm = Norm::Pre;
  bool attn_bias = true;
};
inline ModelConfig test_model(const TestModel& t = {}) {
  ModelConfig c;
  c.vocab_size = t.vocab;
  c.d_model = t.d_model;
  c.n_layers = t.layers;
  c.n_heads = t.heads;
  c.n_kv_heads = t.kv_heads;
  c.d_ff = t.d_ff;
  c.max_seq_len = t.max_seq_len;
  c.norm = t.norm;
  c.attn_bias = t.attn_bias;
  return c;
}

// `base` with the options of the --arch preset `arch` (as `headlab train --arch` gives them when
// no other flag is given), its sizes kept.
inline ModelConfig preset_model(const std::string& arch, const ModelConfig& base) {
  const ArchPreset* p = find_arch_preset(arch);
  if (!p) fail("no preset ", arch);
  TrainFlagValues v;
  v.args.model = base;
  v.args.model.arch = arch;
  // the fields kept as text until resolved
  v.norm = to_string(base.norm), v.activation = to_string(base.activation), v.positions = to_string(base.positions);
  v.normalization = to_string(base.normalization), v.mlp = to_string(base.mlp);
  return resolve_train_flags(v, [p](const std::string& f) {
           for (const auto& s : p->settings)
             if (s.first == f) return false;
           // the activation as a user leaves it out (a SwiGLU preset refuses an explicit non-silu one)
           return f != "--activation";  // every other setting as `base` has it
         }).model;
}

// Every parameter of m redrawn from N(0, scale^2), norm weights around 1: effects of order 1, so a
// wrong index moves results far above round-off.
inline void randomise(TransformerLM& m, uint64_t seed, float scale = 0.5f) {
  Rng rng(seed);
  for (auto& [name, p] : m.named_parameters()) {
    const bool norm_weight = name.find("ln") != std::string::npos && name.ends_with(".weight");
    for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] = (norm_weight ? 1.f : 0.f) + scale * rng.normal();
  }
}

// Patching inputs of a test_model (vocabulary 7): 3 rows of 6 tokens, one token changed per row,
// answers (row, position, clean, corrupted) at later positions, row 2 twice.
inline PatchingInputs three_rows_one_token_changed() {
  PatchingInputs in;
  in.clean = Ids(Shape{3, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 0, 3, 6, 5, 4, 3, 2, 1});
  in.corrupted = in.clean;
  in.corrupted.at(0, 1) = 0;
  in.corrupted.at(1, 3) = 5;
  in.corrupted.at(2, 0) = 1;
  in.answers = {{0, 4, 3, 0}, {1, 5, 2, 5}, {2, 3, 6, 1}, {2, 5, 4, 2}};
  in.source_pos = {1, 3, 0};
  return in;
}

// d_model 8, 2 heads, no biases.
struct TestAttention {
  int64_t d_model = 8;
  int heads = 2;
  int kv_heads = 0;   // 0 = heads
  int64_t d_head = 0; // 0 = d_model / heads
  bool bias = false;
};
inline AttentionConfig test_attention(const TestAttention& t = {}) {
  AttentionConfig c;
  c.d_model = t.d_model;
  c.n_heads = t.heads;
  c.n_kv_heads = t.kv_heads;
  c.d_head = t.d_head;
  c.bias = t.bias;
  return c;
}

// A path in the temporary directory: headlab-test-NAME.
inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("headlab-test-" + name)).string();
}
// The same, emptied first (a directory a test may fill).
inline std::string fresh_dir(const std::string& name) {
  const std::string d = temp_path(name);
  std::filesystem::remove_all(d);
  return d;
}

// The message of the hl::Error that f throws, or "(no error)" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace hl::test
