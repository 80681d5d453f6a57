// headlab grads: the loss, every parameter's gradient and the attention maps of one batch, in
// one safetensors file.
#include <cstdio>

#include "cli/model_input.h"
#include "lib/safetensors.h"
#include "train/run_dir.h"

namespace hl {

namespace {

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
  for (int l = 0; l < model->cfg.n_layers; ++l) w.add("attn." + std::to_string(l), cache[attn_hook(l, "pattern")]);
  w.add_ids("input_ids", batch.inputs, DType::I64);
  w.add_ids("targets", batch.targets, DType::I64);
  w.set_meta("format", "headlab-grads");
  w.set_meta("checkpoint", s.checkpoint);
  w.write(out);
  std::printf("loss %.6f; wrote %zu gradients and %d attention maps to %s\n", loss.item(),
              model->named_parameters().size(), model->cfg.n_layers, out.c_str());
  return 0;
}

}  // namespace

void add_grads_command(CLI::App& app, CommandRunner& runner) {
  add_model_input_command(app, runner, "grads", "Loss, every parameter gradient and attention maps of one batch (safetensors)",
                          false, "Output file (safetensors: loss, grad.<name>, attn.<layer>)", run_grads);
}

}  // namespace hl
