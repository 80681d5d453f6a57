#include "cli/model_input.h"

#include <sstream>

#include "cli/threads_option.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"

namespace hl {

namespace {

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

}  // namespace


void add_model_input_command(CLI::App& app, CommandRunner& runner, const std::string& name, const std::string& help,
                             bool tokens, const std::string& out_help, ModelInputRun run) {
  CLI::App* sub = app.add_subcommand(name, help);
  auto source = std::make_shared<Source>();
  auto out = std::make_shared<std::string>();
  Source& s = *source;
  if (tokens) s.batch_size = 1;
  s.takes_tokens = tokens;
  sub->add_option("--checkpoint", s.checkpoint, "Model checkpoint (safetensors, a run directory, or a Hugging Face model directory)")->required();
  if (tokens)
    sub->add_option("--tokens", s.tokens, "Token ids of one sequence, e.g. \"11 3 4 12 3 4\" (else drawn from the task)");
  else
    sub->add_option("--batch", s.batch_file, "Batch file (input_ids, targets) instead of drawing one from the task");
  sub->add_option("--task", s.task.name, "Task to draw from when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--seed", s.seed, "Seed of the drawn batch")->capture_default_str()->check(in_range(0, 1.8e19));
  if (!tokens)
    sub->add_option("--batch-size", s.batch_size, "Sequences in the drawn batch")->capture_default_str()->check(in_range(1, 1 << 30));
  add_threads_option(sub, s.threads);
  sub->add_option("--out", *out, out_help)->required();
  sub->callback([&runner, source, out, run] { runner = [=] { return run(*source, *out); }; });
}

// Loads the model and the batch a command works on.
std::pair<std::unique_ptr<TransformerLM>, Batch> load_inputs(const Source& s) {
  SafetensorsFile f = read_checkpoint(s.checkpoint);
  auto model = load_model_releasing(f);
  set_num_threads(command_threads(s.threads));
  if (!s.batch_file.empty()) return {std::move(model), load_batch_file(s.batch_file, model->cfg)};
  // Given tokens need only the model's vocabulary: the task matters only when a batch is drawn
  // from it (a GPT-2 model fits no task's vocabulary).
  if (!s.tokens.empty()) {
    const std::vector<int32_t> ids = parse_token_ids(s.tokens, model->cfg.vocab_size);
    Batch b;
    b.inputs = Ids(Shape{1, static_cast<int64_t>(ids.size())}, ids);
    b.targets = Ids(Shape{1, static_cast<int64_t>(ids.size())});
    std::fill(b.targets.data.begin(), b.targets.data.end(), -1);
    if (static_cast<int64_t>(ids.size()) > model->cfg.max_seq_len)
      fail("--tokens: ", ids.size(), " tokens exceed the model's max_seq_len ", model->cfg.max_seq_len);
    return {std::move(model), b};
  }
  const std::unique_ptr<Task> task =
      task_for_model(model->cfg, checkpoint_task(f, TaskConfig::preset(s.task.name)), s.checkpoint,
                     s.takes_tokens ? "--tokens" : "--batch FILE");
  const double need = estimate_step_bytes(model->cfg, s.batch_size, task->seq_len(), true), have = available_memory_bytes();
  if (need > have)
    fail("--batch-size ", s.batch_size, ": a forward and backward of that batch needs about ", format_bytes(need),
         " of memory, more than the ", format_bytes(have), " available");
  Rng rng(s.seed);
  return {std::move(model), task->sample(s.batch_size, rng)};
}

}  // namespace hl
