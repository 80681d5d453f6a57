// headlab features: what an SAE's features (an `headlab sae` or SAELens directory) mean for a
// checkpoint: flags -> feature_study (analysis/feature_study.h), and with --run the SAE over the
// run's snapshots, with --compare on another checkpoint (a fork), with --match matched to
// another SAE -> CSV tables and the feature page in --out.
#include <cmath>
#include <cstdio>
#include <memory>

#include "analysis/feature_study.h"
#include "analysis/features_over_training.h"
#include "cli/commands.h"
#include "cli/threads_option.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/run_dir.h"
#include "train/over_training.h"
#include "views/feature_page.h"

namespace hl {

namespace {

struct FeaturesOpts {
  std::string sae, checkpoint, out, features, run, compare, match, task = "copy";
  int top_features = 8, examples = 5, before = 8, after = 2, logit_tokens = 5, sequences = 32, batches = 2, threads = 2;
  bool no_ablate = false;
  uint64_t seed = 0;
};

std::string g9(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

int run_features(const FeaturesOpts& o) {
  const Sae sae = load_saelens(o.sae);
  const SafetensorsFile f = read_checkpoint(o.checkpoint);
  std::unique_ptr<TransformerLM> model = load_model(f);
  set_num_threads(command_threads(o.threads));
  const std::unique_ptr<Task> task = task_for_model(model->cfg, checkpoint_task(f, TaskConfig::preset(o.task)), o.checkpoint);
  FeatureStudyOptions so;
  if (!o.features.empty()) {  // "3,17 40": features of the SAE
    size_t at = 0;
    while ((at = o.features.find_first_not_of(", ", at)) != std::string::npos) {
      const size_t end = std::min(o.features.find_first_of(", ", at), o.features.size());
      so.features.push_back(static_cast<int>(parse_int(o.features.substr(at, end - at), 0, sae.cfg.d_sae - 1,
                                                       "--features (features of the SAE)")));
      at = end;
    }
    if (so.features.empty()) fail("--features: no features given");
  }
  so.top_features = o.top_features, so.examples = o.examples, so.before = o.before, so.after = o.after;
  so.logit_tokens = o.logit_tokens, so.ablate = !o.no_ablate;
  std::vector<Batch> data;
  Rng rng(o.seed);
  for (int i = 0; i < o.batches; ++i) data.push_back(task->sample(o.sequences, rng));
  // one batch's hook rows, their codes (several copies while encoding) and logits
  const double T = static_cast<double>(data[0].inputs.shape[1]);
  announce_memory("features", 4.0 * o.sequences * T * (4.0 * double(sae.cfg.d_sae) + double(sae.cfg.d_in) + double(model->cfg.vocab_size)),
                  "the SAE's activations of " + std::to_string(o.sequences) + " sequences", "--sequences");
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(o.out, "features");
  std::printf("studying %s features of an SAE on %s over %d x %d sequences\n",
              so.features.empty() ? ("the " + std::to_string(so.top_features) + " most frequent").c_str() : "the chosen",
              sae.cfg.hook_name.c_str(), o.batches, o.sequences);
  std::fflush(stdout);
  const FeatureStudy s = feature_study(*model, sae, data, so);
  write_file_atomic(staged->file("features.csv"), feature_study_csv(s));
  write_file_atomic(staged->file("features.html"),
                    views::feature_page(s, "Features of " + o.sae, [&](int32_t t) { return task->token_text(t); }));
  // every feature's presence, and with --compare the same on the other checkpoint
  std::string presence = "feature,firing_frequency,mean_activation";
  FeaturePresence other;
  if (!o.compare.empty()) {
    std::unique_ptr<TransformerLM> fork = load_model(o.compare);
    other = feature_presence(*fork, sae, data);
    presence += ",compare_firing_frequency,compare_mean_activation";
  }
  presence += "\n";
  for (int64_t j = 0; j < sae.cfg.d_sae; ++j) {
    presence += std::to_string(j) + "," + g9(s.presence.firing_frequency[j]) + "," + g9(s.presence.mean_activation[j]);
    if (!o.compare.empty()) presence += "," + g9(other.firing_frequency[j]) + "," + g9(other.mean_activation[j]);
    presence += "\n";
  }
  write_file_atomic(staged->file("presence.csv"), presence);
  if (!o.run.empty()) {
    const RunCheckpoints run = run_checkpoints(o.run);
    const FeaturesOverTraining ot = features_over_training(
        run.steps, [&](size_t i) { return load_model(read_run_checkpoint(run, i)); }, sae, data,
        [](size_t done, size_t total, int64_t step) {
          std::printf("  step %lld (%zu of %zu)\n", static_cast<long long>(step), done, total);
          std::fflush(stdout);
        });
    write_file_atomic(staged->file("over_training.csv"), features_over_training_csv(ot));
  }
  if (!o.match.empty()) {
    const FeatureMatch m = match_sae_features(sae, load_saelens(o.match));
    write_file_atomic(staged->file("match.csv"), feature_match_csv(m));
    std::printf("matched to %s: mean decoder cosine %.4f\n", o.match.c_str(), m.mean_cosine);
  }
  staged->publish();
  std::vector<std::vector<std::string>> rows = {{"feature", "fires", "mean act", "heads (decoder norm)", "ablated: loss change"}};
  for (const FeatureCard& c : s.cards) {
    std::string heads;
    for (size_t h = 0; h < c.head_fraction.size(); ++h)
      if (c.head_fraction[h] >= 0.1) heads += (heads.empty() ? "H" : " H") + std::to_string(h) + " " + fixed(c.head_fraction[h], 2);
    rows.push_back({std::to_string(c.feature), percent(c.firing_frequency), fixed(c.mean_activation, 4), heads,
                    std::isfinite(c.ablation_loss_change) ? fixed(c.ablation_loss_change, 5) : "-"});
  }
  print_table(rows);
  std::printf("wrote %s/features.csv, features.html, presence.csv%s%s\n", o.out.c_str(), o.run.empty() ? "" : ", over_training.csv",
              o.match.empty() ? "" : ", match.csv");
  return 0;
}

}  // namespace

void add_features_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("features", "What an SAE's features mean: heads, source positions, logits, top examples, "
                                                 "ablation, and over a run's snapshots");
  auto o = std::make_shared<FeaturesOpts>();
  sub->add_option("--sae", o->sae, "SAE directory (cfg.json + sae_weights.safetensors: `headlab sae --out` or SAELens's)")->required();
  sub->add_option("--checkpoint", o->checkpoint, "Model checkpoint the SAE reads (safetensors or a run directory)")->required();
  sub->add_option("--out", o->out, "Directory for features.csv, features.html, presence.csv (and over_training.csv, match.csv)")->required();
  sub->add_option("--features", o->features, "Features to study, e.g. \"3,17,40\" (default: the --top-features most frequent)");
  sub->add_option("--top-features", o->top_features, "Without --features: how many of the most frequent")->capture_default_str()->check(in_range(1, 1 << 20));
  sub->add_option("--examples", o->examples, "Top-activating examples per feature")->capture_default_str()->check(in_range(1, 1000));
  sub->add_option("--before", o->before, "Tokens shown before an example's largest activation")->capture_default_str()->check(in_range(0, 1 << 20));
  sub->add_option("--after", o->after, "Tokens shown after it")->capture_default_str()->check(in_range(0, 1 << 20));
  sub->add_option("--logit-tokens", o->logit_tokens, "Tokens listed as promoted / suppressed")->capture_default_str()->check(in_range(0, 1000));
  sub->add_flag("--no-ablate", o->no_ablate, "Skip the ablation effects (one pass over the data per feature)");
  sub->add_option("--run", o->run, "A run directory (or a directory of a model's revisions): the SAE applied at each of its snapshots (over_training.csv)");
  sub->add_option("--compare", o->compare, "Another checkpoint (a fork, another seed): the features' presence on it too (presence.csv)");
  sub->add_option("--match", o->match, "Another SAE directory: its features matched one to one by decoder cosine (match.csv)");
  sub->add_option("--task", o->task, "Task to draw sequences from when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--sequences", o->sequences, "Sequences per batch")->capture_default_str()->check(in_range(1, 1 << 20));
  sub->add_option("--batches", o->batches, "Batches of sequences drawn from the task")->capture_default_str()->check(in_range(1, 1 << 20));
  sub->add_option("--seed", o->seed, "Seed of the drawn sequences")->capture_default_str()->check(in_range(0, 1.8e19));
  add_threads_option(sub, o->threads);
  sub->callback([&runner, o] { runner = [=] { return run_features(*o); }; });
}

}  // namespace hl
