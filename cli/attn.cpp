// headlab attn: the attention weights of every layer and head for one sequence
// (attn.safetensors) and a PNG grid of them.
#include <cstdio>

#include "cli/model_input.h"
#include "cli/plot.h"
#include "lib/safetensors.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/run_dir.h"

namespace hl {

namespace {

int run_attn(const Source& s, const std::string& out) {
  refuse_output_over_input("--out", out, {{"--checkpoint", s.checkpoint}});
  refuse_output_over_input("--out", out + "/attn.safetensors", {{"--checkpoint", s.checkpoint}});
  auto [model, one] = load_inputs(s);
  if (one.size() > 1) fail("attn: one sequence at a time");
  NoGradGuard ng;
  model->eval();
  const ActivationCache cache =
      model->run_with_cache(one.inputs, names_ending_with("attn.hook_pattern"), false, one.key_padding).second;
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "attn");
  SafetensorsWriter w;
  for (int l = 0; l < model->cfg.n_layers; ++l) w.add("attn." + std::to_string(l), cache[attn_hook(l, "pattern")]);
  w.add_ids("input_ids", one.inputs, DType::I64);
  w.set_meta("format", "headlab-attention");
  w.write(staged->staging() + "/attn.safetensors");
  SafetensorsFile f = read_checkpoint(s.checkpoint);
  const std::unique_ptr<Task> task = make_task(checkpoint_task(f, TaskConfig::preset(s.task.name)));
  const bool task_names_tokens = task->vocab_size() == model->cfg.vocab_size;  // else (a GPT-2 model's tokens) the ids
  const int64_t T = one.inputs.shape[1];
  std::vector<std::string> labels;
  for (int64_t t = 0; t < T; ++t)
    labels.push_back(task_names_tokens ? task->token_text(one.inputs.at(0, t)) : std::to_string(one.inputs.at(0, t)));
  std::vector<Heatmap> maps;
  const int H = model->cfg.n_heads;
  for (int l = 0; l < model->cfg.n_layers; ++l)
    for (int h = 0; h < H; ++h) {
      Heatmap m;
      m.title = "layer " + std::to_string(l) + " head " + std::to_string(h);
      m.rows = m.cols = static_cast<int>(T);
      const float* p = cache[attn_hook(l, "pattern")].data() + static_cast<int64_t>(h) * T * T;
      m.values.assign(p, p + T * T);
      m.xlabels = m.ylabels = labels;
      maps.push_back(m);
    }
  plot_heatmap_grid(staged->staging() + "/attn.png", "Attention weights (rows: queries, columns: keys)", model->cfg.n_layers,
                    H, maps, "key", "query", 0.f, 1.f);
  staged->publish();
  std::printf("wrote %s/attn.safetensors and %s/attn.png (%d layers x %d heads, %lld tokens)\n", out.c_str(), out.c_str(),
              model->cfg.n_layers, H, static_cast<long long>(T));
  return 0;
}

}  // namespace

void add_attn_command(CLI::App& app, CommandRunner& runner) {
  add_model_input_command(app, runner, "attn",
                          "Attention weights of every layer and head for one sequence (safetensors + PNG grid)", true,
                          "Output directory", run_attn);
}

}  // namespace hl
