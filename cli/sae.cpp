// headlab sae: a sparse autoencoder trained on a checkpoint's activations at one hook point,
// streamed from the model over its task's sequences: flags -> SaeTrainer -> the SAE in
// SAELens's layout (cfg.json, sae_weights.safetensors) and metrics.json in --out.
#include <cmath>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "analysis/features.h"
#include "cli/commands.h"
#include "cli/threads_option.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/run_dir.h"
#include "train/sae_trainer.h"

namespace hl {

namespace {

struct SaeOpts {
  std::string checkpoint, hook, out, arch = "topk", task = "copy";
  int expansion = 8, k = 8, sequences = 64, batches = 16, log_every = 100, threads = 2;
  int64_t steps = 2000, batch = 1024, buffer = 16384, warmup = 100, dead_after = 100000;
  float lr = 4e-4f, l1 = 5.f, l0 = 1.f, bandwidth = 0.001f;
  uint64_t seed = 0;
};

int run_sae(const SaeOpts& o) {
  const SafetensorsFile f = read_checkpoint(o.checkpoint);
  std::unique_ptr<TransformerLM> model = load_model(f);
  set_num_threads(command_threads(o.threads));
  const std::unique_ptr<Task> task = task_for_model(model->cfg, checkpoint_task(f, TaskConfig::preset(o.task)), o.checkpoint);
  std::vector<Ids> data;
  Rng rng(o.seed);
  for (int i = 0; i < o.batches; ++i) data.push_back(task->sample(o.sequences, rng).inputs);
  // the hook's width from one forward of one sequence
  const Ids one(Shape{1, data[0].shape[1]}, std::vector<int32_t>(data[0].data.begin(), data[0].data.begin() + data[0].shape[1]));
  ActivationSource probe = model_activations(*model, o.hook, {one}, 1, 0);
  SaeConfig cfg;
  cfg.d_in = probe(1).size(1);
  cfg.d_sae = cfg.d_in * o.expansion;
  cfg.arch = parse_sae_arch(o.arch);
  cfg.k = o.k, cfg.bandwidth = o.bandwidth, cfg.hook_name = o.hook;
  cfg.initial_threshold = o.bandwidth;
  // parameters, their gradients and Adam's two moments; a step's (batch, d_sae) activations
  // (pre, f and their gradients); the shuffle buffer
  const double need = 4.0 * (4.0 * 2.0 * double(cfg.d_in) * double(cfg.d_sae) + 6.0 * double(o.batch) * double(cfg.d_sae) +
                             double(std::max(o.buffer, o.batch) + o.sequences * data[0].shape[1]) * double(cfg.d_in));
  check_fits_in_memory(need, "an SAE of " + std::to_string(cfg.d_sae) + " features (--expansion " + std::to_string(o.expansion) +
                                 ") on " + std::to_string(o.batch) + "-row batches (--batch)");
  // refuse an unusable --out before training, and write nothing until the end
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(o.out, "sae");
  SaeTrainArgs a;
  a.steps = o.steps, a.batch = o.batch, a.lr = o.lr, a.warmup = o.warmup, a.dead_after = o.dead_after;
  a.l1_coefficient = o.l1, a.l0_coefficient = o.l0, a.seed = o.seed;
  a.init_rows = std::min<int64_t>(4096, o.buffer);
  std::printf("training a %s SAE on %s: d_in %lld, %lld features, %lld steps of %lld rows\n", o.arch.c_str(), o.hook.c_str(),
              static_cast<long long>(cfg.d_in), static_cast<long long>(cfg.d_sae), static_cast<long long>(a.steps),
              static_cast<long long>(a.batch));
  SaeTrainer trainer(cfg, a, model_activations(*model, o.hook, data, o.buffer, o.seed + 1));
  trainer.train([&](const SaeStepStats& s) {
    if ((s.step + 1) % o.log_every == 0 || s.step + 1 == a.steps)
      std::printf("step %6lld  loss %.5f  mse %.5f  L0 %.2f  explained variance %.4f  dead %.3f\n",
                  static_cast<long long>(s.step + 1), s.loss, s.mse, s.l0, s.explained_variance, s.dead_fraction);
    std::fflush(stdout);
  });
  // metrics on fresh rows of the same stream
  ActivationSource eval = model_activations(*model, o.hook, data, o.buffer, o.seed + 2);
  const SaeMetrics m = sae_metrics(trainer.sae(), eval(std::min<int64_t>(o.buffer, 8192)));
  save_saelens(trainer.sae(), staged->staging());
  nlohmann::json mj = {{"l0", m.l0}, {"explained_variance", m.explained_variance}, {"mse", m.mse},
                       {"dead_fraction", m.dead_fraction}, {"dense_fraction", m.dense_fraction}, {"density", m.density}};
  write_file_atomic(staged->file("metrics.json"), mj.dump(1) + "\n");
  staged->publish();
  std::printf("L0 %.2f, explained variance %.4f, dead %.3f, dense %.3f\nwrote %s/cfg.json, sae_weights.safetensors, metrics.json\n",
              m.l0, m.explained_variance, m.dead_fraction, m.dense_fraction, o.out.c_str());
  return 0;
}

}  // namespace

void add_sae_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("sae", "Train a sparse autoencoder on a checkpoint's activations at one hook point");
  auto o = std::make_shared<SaeOpts>();
  sub->add_option("--checkpoint", o->checkpoint, "Model checkpoint (safetensors or a run directory)")->required();
  sub->add_option("--hook", o->hook, "Hook point, e.g. blocks.1.attn.hook_z (heads concatenated), blocks.0.hook_resid_post; "
                                     "`headlab hooks` lists them")->required();
  sub->add_option("--out", o->out, "Directory for cfg.json, sae_weights.safetensors (SAELens's layout) and metrics.json")->required();
  sub->add_option("--arch", o->arch, "standard, topk, batchtopk or jumprelu")->capture_default_str()
      ->check(CLI::IsMember({"standard", "topk", "batchtopk", "jumprelu"}));
  sub->add_option("--expansion", o->expansion, "Features per input dimension (d_sae = expansion * d_in)")->capture_default_str()->check(in_range(1, 1 << 24));
  sub->add_option("--k", o->k, "topk, batchtopk: active features per row")->capture_default_str()->check(in_range(1, 1 << 20));
  sub->add_option("--steps", o->steps, "Training steps")->capture_default_str()->check(in_range(0, 1e12));
  sub->add_option("--batch", o->batch, "Rows (tokens) per step")->capture_default_str()->check(in_range(1, 1 << 24));
  sub->add_option("--buffer", o->buffer, "Rows in the shuffle buffer")->capture_default_str()->check(in_range(1, 1 << 28));
  sub->add_option("--lr", o->lr, "Adam's learning rate")->capture_default_str()->check(in_range(1e-9, 10));
  sub->add_option("--warmup", o->warmup, "Steps of linear learning-rate warmup")->capture_default_str()->check(in_range(0, 1e12));
  sub->add_option("--l1", o->l1, "standard: weight of the decoder-norm-weighted L1")->capture_default_str()->check(in_range(0, 1e6));
  sub->add_option("--l0", o->l0, "jumprelu: weight of the L0")->capture_default_str()->check(in_range(0, 1e6));
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
