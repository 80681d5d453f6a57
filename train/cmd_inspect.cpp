// headlab grads / headlab attn: look inside a trained model.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/run_dir.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/commands.h"
#include "train/plot.h"

namespace hl {

using json = nlohmann::json;

namespace {

}  // namespace

// The task a checkpoint was trained on (from its "task" metadata), else the flags' task.
TaskConfig task_for(const SafetensorsFile& f, const TaskConfig& fallback) {
  auto it = f.metadata.find("task");
  return it == f.metadata.end() ? fallback : TaskConfig::from_json(it->second, f.source);
}

namespace {

std::string pattern_hook(int layer) { return "blocks." + std::to_string(layer) + ".attn.hook_pattern"; }

// input_ids and targets from a batch file, checked against the model.
Batch load_batch_file(const std::string& path, const ModelConfig& cfg) {
  SafetensorsFile f = read_safetensors(path);
  Batch b;
  b.inputs = f.ids("input_ids");
  b.targets = f.ids("targets");
  if (b.inputs.shape.ndim != 2) fail(path, ": input_ids must be (B, T), got ", b.inputs.shape.str());
  if (b.inputs.numel() == 0) fail(path, ": input_ids ", b.inputs.shape.str(), " holds no tokens");
  if (b.targets.shape != b.inputs.shape)
    fail(path, ": targets ", b.targets.shape.str(), " must have the shape of input_ids ", b.inputs.shape.str());
  if (b.inputs.shape[1] > cfg.max_seq_len)
    fail(path, ": sequences of length ", b.inputs.shape[1], " exceed the model's max_seq_len ", cfg.max_seq_len);
  for (int32_t v : b.inputs.data)
    if (v < 0 || v >= cfg.vocab_size) fail(path, ": input id ", v, " outside the vocabulary 0..", cfg.vocab_size - 1);
  for (int32_t v : b.targets.data)
    if (v < -1 || v >= cfg.vocab_size) fail(path, ": target ", v, " outside -1..", cfg.vocab_size - 1);
  return b;
}

struct Source {
  std::string checkpoint, batch_file, tokens;
  TaskConfig task = TaskConfig::preset("copy");
  uint64_t seed = 0;
  int batch_size = 8;
  int threads = 2;
};

void add_source_flags(CLI::App* sub, Source& s, bool tokens) {
  sub->add_option("--checkpoint", s.checkpoint, "Model checkpoint (safetensors)")->required();
  if (tokens)
    sub->add_option("--tokens", s.tokens, "Token ids of one sequence, e.g. \"11 3 4 12 3 4\" (else drawn from the task)");
  else
    sub->add_option("--batch", s.batch_file, "Batch file (input_ids, targets) instead of drawing one from the task");
  sub->add_option("--task", s.task.name, "Task to draw from when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--seed", s.seed, "Seed of the drawn batch")->capture_default_str()->check(in_range(0, 1.8e19));
  if (!tokens)
    sub->add_option("--batch-size", s.batch_size, "Sequences in the drawn batch")->capture_default_str()->check(in_range(1, 1 << 30));
  sub->add_option("--threads", s.threads, "Threads")->capture_default_str()->check(in_range(1, 1024));
}

// Loads the model and the batch a command works on.
std::pair<std::unique_ptr<TransformerLM>, Batch> load_inputs(const Source& s) {
  SafetensorsFile f = read_safetensors(s.checkpoint);
  auto model = load_model(f);
  set_num_threads(s.threads);
  if (!s.batch_file.empty()) return {std::move(model), load_batch_file(s.batch_file, model->cfg)};
  TaskConfig tc = task_for(f, TaskConfig::preset(s.task.name));
  const std::unique_ptr<Task> task = make_task(tc);
  if (task->vocab_size() != model->cfg.vocab_size)
    fail(s.checkpoint, ": the model's vocabulary (", model->cfg.vocab_size, ") does not fit task ", tc.name,
         " with alphabet ", tc.alphabet, " (", task->vocab_size(), ")");
  if (!s.tokens.empty()) {
    std::vector<int32_t> ids;
    std::string text = s.tokens;
    std::replace(text.begin(), text.end(), ',', ' ');
    std::stringstream ss(text);
    std::string tok;
    while (ss >> tok)
      ids.push_back(static_cast<int32_t>(parse_int(tok, 0, model->cfg.vocab_size - 1, "--tokens (ids of the vocabulary)")));
    if (ids.empty()) fail("--tokens: no token ids given");
    Batch b;
    b.inputs = Ids(Shape{1, static_cast<int64_t>(ids.size())}, ids);
    b.targets = Ids(Shape{1, static_cast<int64_t>(ids.size())});
    std::fill(b.targets.data.begin(), b.targets.data.end(), -1);
    for (int32_t v : ids)
      if (v < 0 || v >= model->cfg.vocab_size) fail("--tokens: id ", v, " outside the vocabulary 0..", model->cfg.vocab_size - 1);
    if (static_cast<int64_t>(ids.size()) > model->cfg.max_seq_len)
      fail("--tokens: ", ids.size(), " tokens exceed the model's max_seq_len ", model->cfg.max_seq_len);
    return {std::move(model), b};
  }
  const double need = estimate_step_bytes(model->cfg, s.batch_size, task->seq_len(), true), have = available_memory_bytes();
  if (need > have)
    fail("--batch-size ", s.batch_size, ": a forward and backward of that batch needs about ", format_bytes(need),
         " of memory, more than the ", format_bytes(have), " available");
  Rng rng(s.seed);
  return {std::move(model), task->sample(s.batch_size, rng)};
}

int run_grads(const Source& s, const std::string& out) {
  refuse_output_over_input("--out", out, {{"--checkpoint", s.checkpoint}, {"--batch", s.batch_file}});
  refuse_replacing_run_file("--out", out);
  auto [model, batch] = load_inputs(s);
  if (batch.counted_targets() == 0)
    fail(s.batch_file.empty() ? std::string("the batch") : s.batch_file, ": no target counts in the loss (every target is -1)");
  model->eval();  // dropout off
  auto [logits, cache] = model->run_with_cache(batch.inputs, names_ending_with("attn.hook_pattern"), false, batch.key_padding);
  Tensor loss = cross_entropy(logits, batch.targets);
  loss.backward();
  SafetensorsWriter w;
  w.add("loss", loss);
  for (auto& [name, t] : model->named_parameters())
    w.add("grad." + name, t.grad().defined() ? t.grad() : Tensor::zeros(t.shape()));
  for (int l = 0; l < model->cfg.n_layers; ++l) w.add("attn." + std::to_string(l), cache[pattern_hook(l)]);
  w.add_ids("input_ids", batch.inputs, DType::I64);
  w.add_ids("targets", batch.targets, DType::I64);
  w.set_meta("format", "headlab-grads");
  w.set_meta("checkpoint", s.checkpoint);
  w.write(out);
  std::printf("loss %.6f; wrote %zu gradients and %d attention maps to %s\n", loss.item(),
              model->named_parameters().size(), model->cfg.n_layers, out.c_str());
  return 0;
}

int run_attn(const Source& s, const std::string& out) {
  refuse_output_over_input("--out", out, {{"--checkpoint", s.checkpoint}});
  refuse_output_over_input("--out", out + "/attn.safetensors", {{"--checkpoint", s.checkpoint}});
  auto [model, one] = load_inputs(s);
  if (one.size() > 1) fail("attn: one sequence at a time");
  NoGradGuard ng;
  model->eval();
  const ActivationCache cache =
      model->run_with_cache(one.inputs, names_ending_with("attn.hook_pattern"), false, one.key_padding).second;
  claim_output_dir(out, "attn");
  SafetensorsWriter w;
  for (int l = 0; l < model->cfg.n_layers; ++l) w.add("attn." + std::to_string(l), cache[pattern_hook(l)]);
  w.add_ids("input_ids", one.inputs, DType::I64);
  w.set_meta("format", "headlab-attention");
  w.write(out + "/attn.safetensors");
  SafetensorsFile f = read_safetensors(s.checkpoint);
  const std::unique_ptr<Task> task = make_task(task_for(f, TaskConfig::preset(s.task.name)));
  const int64_t T = one.inputs.shape[1];
  std::vector<std::string> labels;
  for (int64_t t = 0; t < T; ++t) labels.push_back(task->token_text(one.inputs.at(0, t)));
  std::vector<Heatmap> maps;
  const int H = model->cfg.n_heads;
  for (int l = 0; l < model->cfg.n_layers; ++l)
    for (int h = 0; h < H; ++h) {
      Heatmap m;
      m.title = "layer " + std::to_string(l) + " head " + std::to_string(h);
      m.rows = m.cols = static_cast<int>(T);
      const float* p = cache[pattern_hook(l)].data() + static_cast<int64_t>(h) * T * T;
      m.values.assign(p, p + T * T);
      m.xlabels = m.ylabels = labels;
      maps.push_back(m);
    }
  const bool drawn = plot_heatmap_grid(out + "/attn.png", "Attention weights (rows: queries, columns: keys)",
                                       model->cfg.n_layers, H, maps, "key", "query", 0.f, 1.f);
  std::printf("wrote %s/attn.safetensors%s (%d layers x %d heads, %lld tokens)\n", out.c_str(),
              drawn ? (" and " + out + "/attn.png").c_str() : "", model->cfg.n_layers, H, static_cast<long long>(T));
  return 0;
}

}  // namespace

void add_grads_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("grads", "Loss, every parameter gradient and attention maps of one batch (safetensors)");
  auto s = std::make_shared<Source>();
  auto out = std::make_shared<std::string>();
  add_source_flags(sub, *s, false);
  sub->add_option("--out", *out, "Output file (safetensors: loss, grad.<name>, attn.<layer>)")->required();
  sub->callback([&runner, s, out] { runner = [=] { return run_grads(*s, *out); }; });
}

void add_attn_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("attn", "Attention weights of every layer and head for one sequence (safetensors + PNG grid)");
  auto s = std::make_shared<Source>();
  auto out = std::make_shared<std::string>();
  s->batch_size = 1;
  add_source_flags(sub, *s, true);
  sub->add_option("--out", *out, "Output directory")->required();
  sub->callback([&runner, s, out] { runner = [=] { return run_attn(*s, *out); }; });
}

}  // namespace hl
