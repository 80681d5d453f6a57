// headlab hooks: the named hook points of a model (from the model flags or a checkpoint), with
// their shapes and meanings as the modules that make them declare them (describe_hook_points).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "models/checkpoint.h"

namespace hl {

namespace {

int run_hooks(TrainFlags& flags, const std::string& checkpoint) {
  ModelConfig cfg;
  if (!checkpoint.empty()) {
    cfg = checkpoint_config(read_checkpoint(checkpoint));
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
  for (const HookPointInfo& p : describe_hook_points(cfg)) rows.push_back({p.name, p.shape, p.what});
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
