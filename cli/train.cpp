// headlab train: trains a transformer on a task, with live progress, held-out evals,
// atomic checkpoints and exact resume.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/atlas_plots.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/threads_option.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "train/atlas.h"
#include "train/distributed.h"
#include "train/run_plan.h"
#include "train/snapshots.h"

namespace hl {

using json = nlohmann::json;

namespace {

int run_train(TrainFlags& flags, RunRequest request, bool quiet) {
  if (request.out.empty()) request.out = default_out_dir("train");
  request.given = [&](const std::string& f) { return flags.given(f); };
  const RunPlan plan = plan_run(flags.resolve(), request);
  say_thread_choice(plan.threads_notice, plan.threads_wanted);
  const TrainArgs& args = plan.args;
  // under mpirun: data-parallel over the ranks; rank 0 reports and writes every file
  ProcessGroup* group = in_multi_rank_job() ? job() : nullptr;
  const bool rank0 = !group || group->rank() == 0;
  quiet = quiet || !rank0;
  Trainer trainer(args, nullptr, group);
  const TrainArgs& a = trainer.args();
  if (rank0) std::fprintf(stderr, "headlab train: %lld parameters, %d layers x %d heads (d_model %lld, d_head %lld), task %s "
               "(vocabulary %d, %d tokens per sequence), %lld steps, %d threads -> %s\n",
               static_cast<long long>(trainer.model().num_parameters()), a.model.n_layers, a.model.n_heads,
               static_cast<long long>(a.model.d_model), static_cast<long long>(a.model.head_dim()),
               a.task.name.c_str(), trainer.task().vocab_size(), trainer.task().seq_len(),
               static_cast<long long>(a.steps), a.threads, a.out.c_str());
  const std::string snapshots = snapshot_notice(trainer);
  if (rank0 && !snapshots.empty()) std::fprintf(stderr, "headlab train: %s\n", snapshots.c_str());
  if (rank0 && group)
    std::fprintf(stderr, "headlab train: data-parallel over %d ranks: %d of the %d sequences of each batch per rank\n",
                 group->size(), a.batch / group->size(), a.batch);
  ProgressBar bar("train", a.steps, !quiet && stderr_is_terminal());
  double last_acc = -1;
  TrainObserver obs;
  obs.on_step = [&](int64_t step, int64_t total, float loss, double tps) {
    char status[160];
    std::snprintf(status, sizeof status, "loss %.4f acc %s %.1fk tok/s", loss,
                  last_acc < 0 ? "-" : percent(last_acc).c_str(), tps / 1000);
    bar.update(step, status);
  };
  // language modelling (text, token files without targets) has no answers to match exactly
  const bool answers = trainer.task().rows_are_answers();
  obs.on_eval = [&](int64_t step, const EvalResult& e) {
    last_acc = e.token_acc;
    if (!bar.enabled() && !quiet)
      std::fprintf(stderr, "step %lld/%lld  held-out loss %.4f  token_acc %s%s\n", static_cast<long long>(step),
                   static_cast<long long>(a.steps), e.loss, percent(e.token_acc).c_str(),
                   answers ? ("  exact " + percent(e.exact_match)).c_str() : "");
  };
  std::unique_ptr<GradAtlas> atlas;
  if (rank0 && (a.log_grads_every > 0 || !a.dump_grads_at.empty())) {
    atlas = std::make_unique<GradAtlas>(a.out, a.log_grads_every, a.dump_grads_at, a.resume);
    atlas->set_probe(trainer.task().held_out(64, a.eval_seed, 64)[0]);
    obs.on_gradients = [&](int64_t step, TransformerLM& m) { atlas->observe(step, m); };
  }
  TrainResult r;
  try {
    r = trainer.run(obs);
  } catch (const NonFiniteError& e) {
    bar.finish();
    std::fprintf(stderr, "headlab train: %s\n", e.what());
    if (group) group->abort(3);  // the held-out loss is rank 0's alone: the others may be mid-step
    return 3;
  } catch (const Interrupted& e) {
    bar.finish();
    if (!rank0) return stop_exit_code();  // every rank stops at the same step; rank 0 writes
    write_summary(a.out, a, trainer.partial_result(), /*finished=*/false);
    if (atlas) draw_gradient_atlas(*atlas);  // after the summary: a plot that fails fails the command, not the run
    const std::string launcher = group ? "mpirun -np " + std::to_string(group->size()) + " " : "";
    std::fprintf(stderr, "headlab train: interrupted: %s; continue with: %sheadlab train --resume --out %s\n", e.what(),
                 launcher.c_str(), a.out.c_str());
    return stop_exit_code();
  }
  bar.finish();
  if (!rank0) return 0;
  write_summary(a.out, a, r);
  if (atlas) draw_gradient_atlas(*atlas);  // after the summary: a plot that fails fails the command, not the run
  const EvalResult& e = r.final_eval;
  std::printf("\n");
  std::vector<std::vector<std::string>> table = {
      {"metric", "value"},
      {"steps", std::to_string(r.steps)},
      {"train time", format_duration(r.wall_s) + " (" + fixed(r.wall_s, 1) + " s)"},
      {"held-out loss", std::to_string(e.loss)},
      {"token accuracy", percent(e.token_acc)}};
  if (answers) {
    table.push_back({"exact match (teacher-forced)", percent(e.exact_match)});
    table.push_back({"exact match (greedy)", e.ar_exact_match >= 0 ? percent(e.ar_exact_match) : "-"});
  }
  table.push_back({"first step >= 99% token acc", r.first_step_99 >= 0 ? std::to_string(r.first_step_99) : "never"});
  table.push_back({"parameters", std::to_string(r.params)});
  table.push_back({"peak RSS", std::to_string(r.peak_rss_kb / 1024) + " MiB"});
  print_table(table);
  std::printf("\nwrote %s/{model,checkpoint}.safetensors, metrics.jsonl, summary.json\n", a.out.c_str());
  std::printf("look at its heads: headlab view %s\n", a.out.c_str());
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("train", "Train a transformer on a task (copy by default; see --task)");
  auto flags = std::make_shared<TrainFlags>();
  auto request = std::make_shared<RunRequest>();
  auto quiet = std::make_shared<bool>(false);
  flags->add(sub);
  flags->task_training_defaults = true;
  flags->machine_threads = false;  // the run plan chooses them
  for (const RunSetting& s : run_settings()) {
    CLI::Option* opt = std::visit(
        [&](auto* value) -> CLI::Option* {
          if constexpr (std::is_same_v<decltype(value), bool*>) return sub->add_flag(s.flag, *value, s.help);
          else return sub->add_option(s.flag, *value, s.help);
        },
        s.field(*request));
    // the range in --help; plan_run checks it, for both doors
    if (!std::isnan(s.lo)) opt->check(CLI::Validator([](std::string&) { return std::string(); }, range_text(s.lo, s.hi)));
    if (opt->get_expected_max() > 1) opt->delimiter(',');
  }
  sub->add_flag("--quiet", *quiet, "No progress output");
  sub->callback([&runner, flags, request, quiet] { runner = [=] { return run_train(*flags, *request, *quiet); }; });
}

}  // namespace hl
