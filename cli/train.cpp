// headlab train: trains a transformer on a task, with live progress, held-out evals,
// atomic checkpoints and exact resume.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/atlas_plots.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "train/atlas.h"
#include "train/distributed.h"
#include "train/snapshots.h"

namespace hl {

using json = nlohmann::json;

namespace {

// The stored run's arguments with the flags given now; under mpirun this rank's share of threads.
TrainArgs args_to_resume(TrainFlags& flags, const std::string& out) {
  TrainArgs r = resume_args(out, flags.resolve(), [&](const std::string& f) { return flags.given(f); });
  if (!flags.given("--threads")) r.threads = default_threads(r.threads);
  return r;
}

// train --fork-from FILE (or --fork RUN --at STEP) with --gate/--freeze/--reinit.
struct ForkFlags {
  std::string run, from;  // --fork RUN (with --at STEP), or --fork-from FILE
  int64_t at = -1;
  std::vector<std::string> gate, freeze, reinit;
  bool given() const { return !from.empty() || !run.empty(); }
  // the file the fork starts from
  std::string state_file() const {
    if (!run.empty() && !from.empty()) fail("--fork and --fork-from both name the state to fork from: choose one");
    if (!run.empty() && at < 0) fail("--fork ", run, ": give the step of its snapshot to start from (--at STEP)");
    if (run.empty() && at >= 0) fail("--at ", at, " goes with --fork RUN");
    return run.empty() ? from : require_snapshot(run, at);
  }
};

int run_train(TrainFlags& flags, const std::string& out_flag, bool resume, bool quiet, int64_t log_grads,
              const std::vector<int64_t>& dump_at, const std::vector<int64_t>& snapshot_at, bool snapshot_at_given,
              const ForkFlags& fork) {
  const std::string out = out_flag.empty() ? default_out_dir("train") : out_flag;
  if (!fork.given() && !(fork.gate.empty() && fork.freeze.empty() && fork.reinit.empty()))
    fail("--gate, --freeze and --reinit apply to a fork: give --fork RUN --at STEP (or --fork-from FILE)");
  if (fork.at >= 0 && !fork.given()) fail("--at ", fork.at, " goes with --fork RUN");
  if (fork.given() && resume) fail("--resume continues a run (a fork too) from its own checkpoint: leave out --fork");
  if (fork.given() && flags.given("--init")) fail("--init and --fork both give the starting weights: choose one");
  TrainArgs args = resume ? args_to_resume(flags, out) : flags.resolve();
  if (fork.given()) {
    TrainArgs given = args;
    given.out = out;
    given.gate_heads = fork.gate, given.freeze_heads = fork.freeze, given.reinit_heads = fork.reinit;
    given.log_grads_every = log_grads;
    given.dump_grads_at = dump_at;
    args = fork_args(fork.state_file(), given, [&](const std::string& f) { return flags.given(f); });
    if (!flags.given("--threads")) args.threads = default_threads(args.threads);
  } else if (!resume) {
    args = init_args(args, [&](const std::string& f) { return flags.given(f); });
    refuse_output_over_input("--out", out + "/model.safetensors", {{"--init", args.init}});
    refuse_output_over_input("--out", out + "/checkpoint.safetensors", {{"--init", args.init}});
    args.out = out;
    args.log_grads_every = log_grads;
    args.dump_grads_at = dump_at;
  }
  // a resumed run, or a fork, keeps the run's own snapshot steps unless given
  if ((!resume && !fork.given()) || snapshot_at_given) args.snapshot_at = snapshot_at;  // a resumed run keeps its own unless given
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
  if (rank0 && !trainer.snapshot_plan().steps.empty()) {
    const auto& plan = trainer.snapshot_plan();
    const size_t n = plan.steps.size();
    std::string at;
    for (size_t i = 0; i < n; ++i) {
      if (n > 8 && i == 5) i = n - 1, at += ", ...";  // a long list: its ends
      at += (i ? ", " : "") + std::to_string(plan.steps[i]);
    }
    std::fprintf(stderr, "headlab train: %zu snapshot%s (step%s %s) of %s each: %s of disk in %s/snapshots\n", n,
                 n == 1 ? "" : "s", n == 1 ? "" : "s", at.c_str(),
                 format_bytes(plan.bytes_each).c_str(), format_bytes(plan.bytes_each * static_cast<double>(n)).c_str(),
                 a.out.c_str());
  }
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
  auto out = std::make_shared<std::string>();
  auto resume = std::make_shared<bool>(false);
  auto quiet = std::make_shared<bool>(false);
  auto log_grads = std::make_shared<int64_t>(0);
  auto dump_at = std::make_shared<std::vector<int64_t>>();
  auto snapshot_at = std::make_shared<std::vector<int64_t>>();
  auto fork = std::make_shared<ForkFlags>();
  flags->add(sub);
  flags->task_training_defaults = true;
  sub->add_option("--out", *out, "Output directory (default: runs/train-<date>-<time>)");
  sub->add_flag("--resume", *resume, "Continue the run in --out from its last checkpoint");
  sub->add_option("--init", flags->args.init, "Start from the weights in this checkpoint, e.g. made in PyTorch; the model's architecture comes from it");
  sub->add_flag("--quiet", *quiet, "No progress output");
  sub->add_option("--log-grads", *log_grads,
                  "Gradient atlas: every N steps log per-head gradient and weight norms of W_Q/W_K/W_V/W_O "
                  "(grad_atlas.csv) and attention entropy; 0 = off")->capture_default_str()->check(in_range(0, 1e15));
  sub->add_option("--dump-grads-at", *dump_at, "Steps at which to dump every gradient (grads/step_N.safetensors) "
                                               "and per-head W_QK / W_OV singular values")->delimiter(',')->check(in_range(1, 1e15));
  CLI::Option* snapshot_at_opt =
      sub->add_option("--snapshot-at", *snapshot_at, "Steps at which to keep the run's full resume state "
                                                     "(RUN/snapshots/step_NNNNNNNN.safetensors); 0 = the initial weights")
          ->delimiter(',')->check(in_range(0, 1e15));
  sub->add_option("--fork", fork->run,
                  "Counterfactual fork of this run (its directory) from its snapshot at --at, into --out: the same data "
                  "order and RNG, settings from the snapshot; with --gate/--freeze/--reinit");
  sub->add_option("--at", fork->at, "The step of the snapshot --fork starts from")->check(in_range(0, 1e15));
  sub->add_option("--fork-from", fork->from,
                  "Like --fork RUN --at STEP, from a file with the training state (a snapshot or checkpoint.safetensors)");
  sub->add_option("--gate", fork->gate, "Fork: set a head's gate, LAYER.HEAD=VALUE (0 = the head's output removed); repeatable")
      ->delimiter(',');
  sub->add_option("--freeze", fork->freeze, "Fork: keep a head's W_Q/W_K/W_V rows and W_O columns exactly, LAYER.HEAD; repeatable")
      ->delimiter(',');
  sub->add_option("--reinit", fork->reinit, "Fork: draw a head's weights again as at construction and reset their optimizer "
                                            "moments, LAYER.HEAD; repeatable")->delimiter(',');
  sub->callback([&runner, flags, out, resume, quiet, log_grads, dump_at, snapshot_at, snapshot_at_opt, fork] {
    const bool at_given = snapshot_at_opt->count() > 0;
    runner = [=] { return run_train(*flags, *out, *resume, *quiet, *log_grads, *dump_at, *snapshot_at, at_given, *fork); };
  });
}

}  // namespace hl
