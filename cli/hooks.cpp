// headlab hooks: the named hook points of a model (from the model flags or a checkpoint), with
// their shapes, for writing hooks and reading caches from C++ or Python.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "models/checkpoint.h"

namespace hl {

namespace {

// What each hook point holds, by the last part of its name.
const char* describe(const std::string& name) {
  static const std::pair<const char*, const char*> kinds[] = {
      {"hook_embed", "token embeddings"},
      {"hook_pos_embed", "position embeddings (broadcast over the batch)"},
      {"hook_resid_pre", "residual stream into the block"},
      {"ln1.hook_normalized", "layer norm before attention"},
      {"attn.hook_q", "queries per head"},
      {"attn.hook_k", "keys per kv head"},
      {"attn.hook_v", "values per kv head"},
      {"attn.hook_attn_scores", "scaled, masked scores before softmax (-inf where masked)"},
      {"attn.hook_pattern", "attention weights (rows: queries, columns: keys)"},
      {"attn.hook_z", "head outputs (gated) before W_O"},
      {"attn.hook_result", "each head's contribution to the residual stream (computed only when hooked)"},
      {"hook_attn_out", "attention output added to the residual stream"},
      {"hook_resid_mid", "residual stream after attention"},
      {"ln2.hook_normalized", "layer norm before the MLP"},
      {"mlp.hook_pre", "MLP pre-activation (fc1 output)"},
      {"mlp.hook_post", "MLP activation"},
      {"hook_mlp_out", "MLP output added to the residual stream"},
      {"hook_resid_post", "residual stream out of the block"},
      {"ln_final.hook_normalized", "final layer norm (into the unembedding)"}};
  for (auto& [suffix, what] : kinds) {
    const std::string s = suffix;
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return what;
  }
  return "";
}

int run_hooks(TrainFlags& flags, const std::string& checkpoint) {
  ModelConfig cfg;
  if (!checkpoint.empty()) {
    cfg = checkpoint_config(read_safetensors(checkpoint));
  } else {
    const TrainArgs a = flags.resolve();
    a.validate();
    cfg = a.model;
    cfg.vocab_size = make_task(a.task)->vocab_size();
  }
  std::printf("hook points of a %d-layer, %d-head model (d_model %lld, d_head %lld, %s-norm); B = batch, T = tokens\n\n",
              cfg.n_layers, cfg.n_heads, static_cast<long long>(cfg.d_model), static_cast<long long>(cfg.head_dim()),
              to_string(cfg.norm).c_str());
  std::vector<std::vector<std::string>> rows = {{"name", "shape", "what"}};
  for (auto& [name, shape] : hook_points(cfg)) rows.push_back({name, shape, describe(name)});
  print_table(rows);
  return 0;
}

}  // namespace

void add_hooks_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("hooks", "List the named hook points (activations) of a model and their shapes");
  auto flags = std::make_shared<TrainFlags>();
  auto checkpoint = std::make_shared<std::string>();
  flags->add(sub, false);
  sub->add_option("--checkpoint", *checkpoint, "Take the model's config from this checkpoint instead of the flags");
  sub->callback([&runner, flags, checkpoint] { runner = [=] { return run_hooks(*flags, *checkpoint); }; });
}

}  // namespace hl
