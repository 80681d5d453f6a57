// headlab sae: a sparse autoencoder trained on a checkpoint's activations at one hook point,
// streamed from the model over its task's sequences: flags -> SaeTrainer -> the SAE in
// SAELens's layout (cfg.json, sae_weights.safetensors) and metrics.json in --out.
#include <cmath>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "analysis/features.h"
#include "cli/commands.h"
#include "cli/table.h"
#include "cli/threads_option.h"
#include "lib/fileutil.h"
#include "lib/stop.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/run_dir.h"
#include "train/sae_trainer.h"

namespace hl {

namespace {

struct SaeOpts {
  std::string checkpoint, hook, hook_out, out, arch = "topk", task = "copy";
  int expansion = 8, k = 8, sequences = 64, batches = 16, log_every = 100, threads = 2;
  int64_t steps = 2000, batch = 1024, buffer = 16384, warmup = 100, dead_after = 100000, sparsity_warmup = 0, snapshot_every = 0;
  int64_t lr_decay_steps = 0;
  bool resume = false;
  float lr = 4e-4f, l1 = 5.f, l0 = 1.f, bandwidth = 0.001f, tanh_scale = 4.f, pre_act = 0.f;
  std::string jumprelu_sparsity = "step";
  std::string normalize_activations;  // empty: the architecture's (sae_config_for_model)
  uint64_t seed = 0;
};

int run_sae(const SaeOpts& o) {
  const SafetensorsFile f = read_checkpoint(o.checkpoint);
  std::unique_ptr<TransformerLM> model = load_model(f);
  set_num_threads(command_threads(o.threads));
  const std::unique_ptr<Task> task = task_for_model(model->cfg, checkpoint_task(f, TaskConfig::preset(o.task)), o.checkpoint);
  std::vector<Batch> data;
  Rng rng(o.seed);
  for (int i = 0; i < o.batches; ++i) data.push_back(task->sample(o.sequences, rng));
  // held-out sequences for the metrics and the loss recovered
  std::vector<Batch> held_out;
  Rng held_rng(o.seed + 3);
  for (int i = 0; i < std::max(1, o.batches / 4); ++i) held_out.push_back(task->sample(o.sequences, held_rng));
  SaeConfig cfg = sae_config_for_model(*model, data[0].inputs, o.hook, o.hook_out, o.arch, o.expansion);
  cfg.k = o.k, cfg.bandwidth = o.bandwidth, cfg.initial_threshold = o.bandwidth;
  if (!o.normalize_activations.empty()) cfg.normalize_activations = o.normalize_activations;
  const double need = sae_training_bytes(cfg, o.batch, std::max(o.buffer, o.batch) + o.sequences * data[0].inputs.shape[1]);
  check_fits_in_memory(need, "an SAE of " + std::to_string(cfg.d_sae) + " features (--expansion " + std::to_string(o.expansion) +
                                 ") on " + std::to_string(o.batch) + "-row batches (--batch)");
  SaeTrainArgs a;
  a.steps = o.steps, a.batch = o.batch, a.lr = o.lr, a.warmup = o.warmup, a.dead_after = o.dead_after;
  a.l1_coefficient = o.l1, a.l0_coefficient = o.l0, a.sparsity_warmup = o.sparsity_warmup, a.seed = o.seed;
  a.lr_decay_steps = o.lr_decay_steps, a.jumprelu_sparsity = o.jumprelu_sparsity, a.tanh_scale = o.tanh_scale;
  a.pre_act_coefficient = o.pre_act;
  a.init_rows = std::min<int64_t>(4096, o.buffer);
  SaeRunOptions run_opt;
  run_opt.out = o.out, run_opt.resume = o.resume, run_opt.snapshot_every = o.snapshot_every;
  check_sae_run_dir(run_opt);
  std::printf("training a %s %s on %s%s: d_in %lld, %lld features, %lld steps of %lld rows\n", o.arch.c_str(),
              cfg.transcoder() ? "transcoder" : "SAE", o.hook.c_str(), cfg.transcoder() ? (" -> " + o.hook_out).c_str() : "",
              static_cast<long long>(cfg.d_in), static_cast<long long>(cfg.d_sae), static_cast<long long>(a.steps),
              static_cast<long long>(a.batch));
  run_opt.on_resumed = [](int64_t step) { std::printf("resumed at step %lld\n", static_cast<long long>(step)); };
  run_opt.on_step = [&](const SaeStepStats& s) {
    const int64_t done = s.step + 1;
    if (done % o.log_every == 0 || done == a.steps)
      std::printf("step %6lld  loss %.5f  mse %.5f  L0 %.2f  explained variance %.4f  dead %.3f\n", static_cast<long long>(done),
                  s.loss, s.mse, s.l0, s.explained_variance, s.dead_fraction);
    std::fflush(stdout);
  };
  try {
    const SaeRun run = train_sae_in_dir(*model, cfg, a, model_activation_stream(*model, sae_source_hooks(cfg), data, o.buffer, o.seed + 1),
                                        held_out, run_opt);
    const SaeEvaluation& ev = run.evaluation;
    const SaeMetrics& m = ev.metrics;
    const LossRecovered& lr = ev.loss;
    Table t(4);
    auto row = [&](const std::string& what, double v) { t.row().text("metric", what).number("value", v); };
    row("L0", m.l0), row("explained variance", m.explained_variance), row("mse", m.mse);
    row("loss clean", lr.clean), row("loss with the SAE spliced in", lr.spliced), row("loss zero-ablated", lr.zero_ablated);
    row("loss recovered", lr.recovered), row("dead fraction", m.dead_fraction), row("dense fraction", m.dense_fraction);
    t.print();
    Table h;
    for (const DensityBucket& b : ev.histogram)
      h.row().text("log10 density", (std::isinf(b.lo) ? std::string("dead or below") : std::to_string(int(b.lo))) + " .. " +
                                        std::to_string(int(b.hi))).integer("features", b.features);
    h.print();
    std::printf("wrote %s/cfg.json, sae_weights.safetensors, metrics.json\n", o.out.c_str());
  } catch (const Stopped& e) {  // the state is saved: say how to go on
    std::fprintf(stderr, "headlab sae: interrupted: %s; the state is in %s/sae_state.safetensors; continue with the same command and --resume\n",
                 e.what(), o.out.c_str());
    return stop_exit_code();
  }
  return 0;
}

}  // namespace

void add_sae_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("sae", "Train a sparse autoencoder on a checkpoint's activations at one hook point");
  auto o = std::make_shared<SaeOpts>();
  sub->add_option("--checkpoint", o->checkpoint, "Model checkpoint (safetensors or a run directory)")->required();
  sub->add_option("--hook", o->hook, "Hook point, e.g. blocks.1.attn.hook_z (heads concatenated), blocks.0.hook_resid_post; "
                                     "`headlab hooks` lists them")->required();
  sub->add_option("--hook-out", o->hook_out, "A transcoder: the hook point it reconstructs from --hook's activation, e.g. "
                                             "--hook blocks.0.ln2.hook_normalized --hook-out blocks.0.hook_mlp_out (the MLP)");
  sub->add_option("--out", o->out, "Run directory: sae_state.safetensors (resumable), snapshots/, and at the end cfg.json, "
                                   "sae_weights.safetensors (SAELens's layout) and metrics.json")->required();
  sub->add_option("--arch", o->arch, "standard, topk, batchtopk or jumprelu")->capture_default_str()
      ->check(CLI::IsMember({"standard", "topk", "batchtopk", "jumprelu"}));
  sub->add_option("--normalize-activations", o->normalize_activations,
                  "none, or layer_norm (each row centred and scaled to unit std before the encoder, scaled back after "
                  "the decoder); default layer_norm for batchtopk, none for the others")
      ->check(CLI::IsMember({"none", "layer_norm"}));
  sub->add_option("--expansion", o->expansion, "Features per input dimension (d_sae = expansion * d_in)")->capture_default_str()->check(in_range(1, 1 << 24));
  sub->add_option("--k", o->k, "topk, batchtopk: active features per row")->capture_default_str()->check(in_range(1, 1 << 20));
  sub->add_option("--steps", o->steps, "Training steps")->capture_default_str()->check(in_range(0, 1e12));
  sub->add_option("--batch", o->batch, "Rows (tokens) per step")->capture_default_str()->check(in_range(1, 1 << 24));
  sub->add_option("--buffer", o->buffer, "Rows in the shuffle buffer")->capture_default_str()->check(in_range(1, 1 << 28));
  sub->add_option("--lr", o->lr, "Adam's learning rate")->capture_default_str()->check(in_range(1e-9, 10));
  sub->add_option("--warmup", o->warmup, "Steps of linear learning-rate warmup")->capture_default_str()->check(in_range(0, 1e12));
  sub->add_option("--l1", o->l1, "standard: weight of the decoder-norm-weighted L1")->capture_default_str()->check(in_range(0, 1e6));
  sub->add_option("--l0", o->l0, "jumprelu: weight of the L0")->capture_default_str()->check(in_range(0, 1e6));
  sub->add_option("--sparsity-warmup", o->sparsity_warmup, "standard, jumprelu: steps over which the L1 / L0 weight rises from 0")
      ->capture_default_str()->check(in_range(0, 1e12));
  sub->add_option("--jumprelu-sparsity", o->jumprelu_sparsity, "jumprelu: the L0 term, step (the count through a straight-through "
                                                                 "step) or tanh (sum of tanh(c f |W_dec|), which also shapes the encoder)")
      ->capture_default_str()->check(CLI::IsMember({"step", "tanh"}));
  sub->add_option("--tanh-scale", o->tanh_scale, "jumprelu with --jumprelu-sparsity tanh: c above")->capture_default_str()->check(in_range(1e-9, 1e6));
  sub->add_option("--pre-act", o->pre_act, "jumprelu: weight of the dead features' pre-activation loss, relu(threshold - pre) |W_dec| (0: off)")
      ->capture_default_str()->check(in_range(0, 1e6));
  sub->add_option("--lr-decay-steps", o->lr_decay_steps, "Final steps over which the learning rate falls linearly to 0")
      ->capture_default_str()->check(in_range(0, 1e12));
  sub->add_option("--snapshot-every", o->snapshot_every, "Every N steps: the SAE in --out/snapshots/stepN and the resumable state "
                                                         "(0: only at the end and on Ctrl-C)")->capture_default_str()->check(in_range(0, 1e12));
  sub->add_flag("--resume", o->resume, "Continue the run in --out from its sae_state.safetensors (same settings; --steps may grow)");
  sub->add_option("--bandwidth", o->bandwidth, "jumprelu: width of the threshold gradient's kernel (and the initial threshold)")
      ->capture_default_str()->check(in_range(1e-9, 1e6));
  sub->add_option("--dead-after", o->dead_after, "Rows without firing after which a feature is dead (AuxK trains it)")
      ->capture_default_str()->check(in_range(1, 1e15));
  sub->add_option("--task", o->task, "Task to draw sequences from when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--sequences", o->sequences, "Sequences per model forward")->capture_default_str()->check(in_range(1, 1 << 20));
  sub->add_option("--batches", o->batches, "Distinct batches of sequences drawn from the task (cycled)")->capture_default_str()->check(in_range(1, 1 << 20));
  sub->add_option("--seed", o->seed, "Seed of the SAE and of the drawn sequences")->capture_default_str()->check(in_range(0, 1.8e19));
  sub->add_option("--log-every", o->log_every, "Print a progress line every N steps")->capture_default_str()->check(in_range(1, 1 << 30));
  add_threads_option(sub, o->threads);
  sub->callback([&runner, o] { runner = [=] { return run_sae(*o); }; });
}

}  // namespace hl
