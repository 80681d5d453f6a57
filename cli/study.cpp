// headlab study induction: the named study in one command. Trains --task induction in its
// regime with several seeds (train/induction_study.h), and writes, per seed, the run, what its
// heads do (detect/, patch/, compose/) and its page (view.html); then the table over the seeds
// with 95% t-intervals (study.csv, study.json). Rerun the same command to continue.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/induction_study.h"
#include "train/run_dir.h"

namespace hl {

using json = nlohmann::json;

namespace {

struct StudyOpts {
  InductionStudyOptions study;
  std::string out;
  bool quiet = false;
};

std::string with_interval(double mean, const Interval& ci, int prec, double k = 1) {
  if (!ci.defined()) return fixed(k * mean, prec);
  return fixed(k * mean, prec) + " [" + fixed(k * ci.lo, prec) + ", " + fixed(k * ci.hi, prec) + "]";
}

// detect/, patch/ and compose/ of one seed's run, and its page
void write_seed(const InductionRun& r, int threads) {
  const HeadRoles& h = r.roles;
  std::vector<std::string> names;
  std::vector<HeadGrid> grids;
  for (size_t d = 0; d < h.detectors.size(); ++d)
    add_detector_columns(names, grids, h.detectors[d], h.score[d], h.ci95_lo[d], h.ci95_hi[d]);
  claim_output_dir(r.dir + "/detect", "detect");
  write_detect_files(r.dir + "/detect", names, grids, /*quiet=*/true);
  claim_output_dir(r.dir + "/patch", "patch");
  write_patch_files(r.dir + "/patch", h.patch, /*quiet=*/true);
  claim_output_dir(r.dir + "/compose", "compose");
  write_compose_files(r.dir + "/compose", h.compose, h.baseline, /*quiet=*/true);
  write_view_page(r.dir, threads);
}

int run_study(TrainFlags& flags, const StudyOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("study-induction") : o.out;
  const TrainArgs base = flags.resolve();
  std::unique_ptr<ProgressBar> bar;
  InductionObserver obs;
  obs.on_run_start = [&](int index, int total, uint64_t seed, bool done) {
    if (done) {
      std::fprintf(stderr, "headlab study: seed %llu (%d/%d) already trained\n", static_cast<unsigned long long>(seed), index, total);
      return;
    }
    bar = std::make_unique<ProgressBar>("seed " + std::to_string(seed) + " (" + std::to_string(index) + "/" + std::to_string(total) + ")",
                                        base.steps, !o.quiet && stderr_is_terminal());
  };
  obs.training.on_step = [&](int64_t step, int64_t, float loss, double) { bar->update(step, "loss " + fixed(loss, 3)); };
  obs.on_run = [&](const InductionRun& r) {
    if (bar) bar->finish(), bar.reset();
    write_seed(r, base.threads);
    if (!o.quiet)
      std::fprintf(stderr, "seed %llu: previous-token %.3f, induction %.3f, K-composition %.3f, token accuracy %s%s\n",
                   static_cast<unsigned long long>(r.seed), r.previous_token_best, r.induction_best, r.k_composition_best,
                   percent(r.final_eval.token_acc).c_str(), r.formed() ? "" : " (no circuit)");
  };
  std::fprintf(stderr, "headlab study induction: %d seed%s of %lld steps (%d layers x %d heads, d_ff %lld) -> %s\n",
               o.study.seeds, o.study.seeds > 1 ? "s" : "", static_cast<long long>(base.steps), base.model.n_layers,
               base.model.n_heads, static_cast<long long>(base.model.d_ff), out.c_str());
  InductionStudy st;
  try {
    st = run_induction_study(base, o.study, out, obs);
  } catch (const Interrupted& e) {
    if (bar) bar->finish();
    std::fprintf(stderr, "headlab study: interrupted (%s); rerun the same command to continue\n", e.what());
    return stop_exit_code();
  }
  std::string csv = "seed,previous_token_best,induction_best,k_composition_best,token_acc,loss,phase_step,formed\n";
  std::vector<std::vector<std::string>> table = {
      {"seed", "previous-token (L0)", "induction (L1+)", "K-comp L0->L1", "token acc %", "50% at step", "circuit"}};
  json runs = json::array();
  for (const InductionRun& r : st.runs) {
    csv += std::to_string(r.seed) + "," + fixed(r.previous_token_best, 6) + "," + fixed(r.induction_best, 6) + "," +
           fixed(r.k_composition_best, 6) + "," + fixed(r.final_eval.token_acc, 6) + "," + fixed(r.final_eval.loss, 6) + "," +
           std::to_string(r.phase_step) + "," + (r.formed() ? "1" : "0") + "\n";
    table.push_back({std::to_string(r.seed), fixed(r.previous_token_best, 3), fixed(r.induction_best, 3),
                     fixed(r.k_composition_best, 3), fixed(100 * r.final_eval.token_acc, 1),
                     r.phase_step >= 0 ? std::to_string(r.phase_step) : "never", r.formed() ? "yes" : "no"});
    runs.push_back({{"seed", r.seed}, {"dir", r.dir}, {"previous_token_best", r.previous_token_best},
                    {"induction_best", r.induction_best}, {"k_composition_best", r.k_composition_best},
                    {"token_acc", r.final_eval.token_acc}, {"loss", r.final_eval.loss}, {"phase_step", r.phase_step},
                    {"formed", r.formed()}});
  }
  const double kc_random = st.runs[0].roles.baseline.mean[1];
  table.push_back({"mean [95% CI]", with_interval(st.previous_token_mean, st.previous_token, 3),
                   with_interval(st.induction_mean, st.induction, 3), with_interval(st.k_composition_mean, st.k_composition, 3),
                   with_interval(st.token_acc_mean, st.token_acc, 1, 100), "", std::to_string(st.formed) + "/" + std::to_string(st.runs.size())});
  auto ci = [](const Interval& i) { return i.defined() ? json{i.lo, i.hi} : json(nullptr); };
  write_file_atomic(out + "/study.csv", csv);
  write_file_atomic(out + "/study.json",
                    json({{"study", "induction"}, {"config", json::parse(base.to_json())}, {"runs", runs},
                          {"formed", st.formed},
                          {"mean", {{"previous_token_best", st.previous_token_mean}, {"induction_best", st.induction_mean},
                                    {"k_composition_best", st.k_composition_mean}, {"token_acc", st.token_acc_mean}}},
                          {"ci95", {{"previous_token_best", ci(st.previous_token)}, {"induction_best", ci(st.induction)},
                                    {"k_composition_best", ci(st.k_composition)}, {"token_acc", ci(st.token_acc)}}},
                          {"k_composition_random", kc_random}})
                        .dump(2) + "\n");
  std::printf("\ninduction study: %zu seed%s; best detector scores per model (detect's probe), K-composition of layer 0\n"
              "into layer 1 (random weights: %.3f), held-out token accuracy; mean and 95%% t-interval over the seeds\n\n",
              st.runs.size(), st.runs.size() > 1 ? "s" : "", kc_random);
  print_table(table);
  std::printf("\nthe circuit (a previous-token head >= 0.5 and an induction head >= 0.4) formed in %d of %zu seeds\n"
              "wrote %s/study.csv, study.json; per seed %s/seed-S/: the run, detect/, patch/, compose/, view.html\n",
              st.formed, st.runs.size(), out.c_str(), out.c_str());
  return 0;
}

}  // namespace

void add_study_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* study = app.add_subcommand("study", "Named studies in one command: train, find what the heads do, intervals over seeds");
  study->require_subcommand(1);
  CLI::App* sub = study->add_subcommand(
      "induction", "Induction heads: train --task induction with several seeds, then detect, patch, compose and a page per seed");
  auto flags = std::make_shared<TrainFlags>();
  auto o = std::make_shared<StudyOpts>();
  flags->args.task = TaskConfig::preset("induction");
  flags->add(sub);
  flags->task_training_defaults = true;
  sub->add_option("--seeds", o->study.seeds, "Seeds (from --seed on), each trained in OUT/seed-S")->capture_default_str()
      ->check(in_range(1, 1000));
  sub->add_option("--out", o->out, "Output directory (default: runs/study-induction-<date>-<time>); rerun to resume");
  sub->add_flag("--quiet", o->quiet, "No progress output");
  sub->add_flag("--force", o->study.force, "Recompute seeds in --out that were trained with other settings (default: refuse)");
  sub->callback([&runner, flags, o] { runner = [=] { return run_study(*flags, *o); }; });
}

}  // namespace hl
