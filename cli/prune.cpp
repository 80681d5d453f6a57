// headlab prune: which heads matter (train/prune_study.h runs the study; this command prints
// its tables and writes CSV, JSON, plots and the pruned model). Resumable: rerun with --out.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/plot.h"
#include "cli/progress.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/prune_study.h"
#include "train/sweep.h"

namespace hl {

using json = nlohmann::json;

namespace {

struct PruneOpts {
  PruneStudyOptions study;
  std::string checkpoint, out, run;
  bool quiet = false;
};

std::string head_name(int l, int h) { return "L" + std::to_string(l) + "H" + std::to_string(h); }

int write_l0(const PruneStudy& r, const PruneStudyOptions& o, const std::string& out) {
  std::string csv = "lambda,heads_kept,loss,token_acc,exact_match,gates\n";
  std::vector<std::vector<std::string>> table = {{"lambda", "heads kept", "held-out loss", "token acc %", "exact %"}};
  for (const L0Result& run : r.l0_runs) {
    std::string g;
    for (auto& row : run.gates)
      for (float v : row) g += (g.empty() ? "" : " ") + fixed(v, 3);
    csv += fixed(run.lambda, 6) + "," + std::to_string(run.heads_kept) + "," + fixed(run.eval.loss, 6) + "," +
           fixed(run.eval.token_acc, 6) + "," + fixed(run.eval.exact_match, 6) + "," + g + "\n";
    table.push_back({fixed(run.lambda, 4), std::to_string(run.heads_kept), fixed(run.eval.loss, 4),
                     fixed(100 * run.eval.token_acc, 2), fixed(100 * run.eval.exact_match, 2)});
  }
  write_file_atomic(out + "/l0.csv", csv);
  std::printf("\nhard-concrete L0 gates (%d fine-tuning steps per lambda):\n\n", o.l0_steps);
  print_table(table);
  // the surviving heads against the same number of top heads by importance
  const L0Result& best = r.l0_runs[r.l0_best];
  std::string kept, top;
  int overlap = 0;
  for (int i = 0; i < best.heads_kept; ++i) {
    const auto [l, h] = r.by_importance[i];
    top += " " + head_name(l, h);
    overlap += best.gates[l][h] > 0.f;
  }
  for (int l = 0; l < r.layers; ++l)
    for (int h = 0; h < r.heads; ++h)
      if (best.gates[l][h] > 0.f) kept += " " + head_name(l, h);
  std::printf("\nlambda %g keeps %d heads:%s\ntop %d by Michel importance:%s\noverlap: %d of %d\n", best.lambda,
              best.heads_kept, kept.c_str(), best.heads_kept, top.c_str(), overlap, best.heads_kept);
  save_checkpoint(out + "/l0_model.safetensors", *r.l0_model, {}, {{"task", r.task.to_json()}});
  std::printf("wrote %s/l0.csv, l0_model.safetensors (the gated model of lambda %g)\n", out.c_str(), best.lambda);
  return 0;
}

// Per-head table, curves table, CSV, plots, prune.json and the pruned model.
int write_michel(const PruneStudy& r, const PruneStudyOptions& o, const std::string& out) {
  const int L = r.layers, H = r.heads;
  const AblationResult& abl = r.ablation;
  const HeadGrid& imp = r.importance;
  const HeadStats& st = r.stats;
  std::string csv = "layer,head,d_loss_zero,d_acc_zero,d_loss_mean,d_acc_mean,importance,entropy,entropy_norm,confidence,"
                    "argmax_distance,importance_ci95_lo,importance_ci95_hi,d_loss_zero_ci95_lo,d_loss_zero_ci95_hi,"
                    "d_loss_mean_ci95_lo,d_loss_mean_ci95_hi\n";
  std::vector<std::vector<std::string>> table = {{"layer", "head", "dloss zero", "dacc zero %", "dloss mean", "dacc mean %",
                                                  "importance", "entropy", "entropy/log n", "confidence", "argmax dist"}};
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const std::vector<double> v = {abl.d_loss[l][h], abl.d_acc[l][h], abl.d_loss_mean[l][h], abl.d_acc_mean[l][h], imp[l][h],
                                     st.entropy[l][h], st.entropy_norm[l][h], st.confidence[l][h], st.argmax_distance[l][h]};
      csv += std::to_string(l) + "," + std::to_string(h);
      for (double x : v) csv += "," + fixed(x, 6);
      csv += "," + fixed(r.importance_ci95_lo[l][h], 6) + "," + fixed(r.importance_ci95_hi[l][h], 6) + "," +
             fixed(abl.d_loss_ci95_lo[l][h], 6) + "," + fixed(abl.d_loss_ci95_hi[l][h], 6) + "," +
             fixed(abl.d_loss_mean_ci95_lo[l][h], 6) + "," + fixed(abl.d_loss_mean_ci95_hi[l][h], 6) + "\n";
      table.push_back({std::to_string(l), std::to_string(h), fixed(v[0], 4), fixed(100 * v[1], 2), fixed(v[2], 4), fixed(100 * v[3], 2),
                       fixed(v[4], 4), fixed(v[5], 3), fixed(v[6], 3), fixed(v[7], 3), fixed(v[8], 2)});
    }
  write_file_atomic(out + "/heads.csv", csv);
  std::printf("\nbase model: held-out loss %.4f, token accuracy %s\n\nper head (d = change when that head alone is removed):\n\n",
              abl.base.loss, percent(abl.base.token_acc).c_str());
  print_table(table);

  // accuracy vs fraction pruned, per order
  std::map<std::string, json> curves;
  for (auto& [name, c] : r.curves) curves[name] = prune_curve_json(c);
  std::string ccsv = "order,pruned,fraction,loss,token_acc,exact_match\n";
  for (auto& [name, c] : r.curves)
    for (const PruneStep& s : c)
      ccsv += name + "," + std::to_string(s.pruned) + "," + fixed(s.fraction, 4) + "," + fixed(s.eval.loss, 6) + "," +
              fixed(s.eval.token_acc, 6) + "," + fixed(s.eval.exact_match, 6) + "\n";
  write_file_atomic(out + "/prune_curves.csv", ccsv);
  std::vector<std::vector<std::string>> ct = {{"heads pruned", "fraction", "importance acc %", "ablation-order acc %",
                                               "random acc % (mean [95% t-interval])"}};
  Series s_imp, s_abl, s_rnd;
  s_imp.name = "importance (Michel et al.)";
  s_abl.name = "single-head ablation order";
  s_rnd.name = "random order (" + std::to_string(o.random_seeds) + " seeds)";
  const std::vector<PruneStep>& by_imp = r.curves.at("importance");
  const std::vector<PruneStep>& by_abl = r.curves.at("ablation");
  for (size_t i = 0; i < by_imp.size(); ++i) {
    const double frac = by_imp[i].fraction, ia = by_imp[i].eval.token_acc;
    const double ab = i < by_abl.size() ? by_abl[i].eval.token_acc : NAN;
    std::vector<double> rv;
    for (int s = 0; s < o.random_seeds; ++s) {
      const std::vector<PruneStep>& c = r.curves.at("random" + std::to_string(s));
      if (i < c.size()) rv.push_back(c[i].eval.token_acc);
    }
    // over the random orders: the mean and its 95% t-interval, clipped to [0, 1] (one order: the mean alone)
    const Spread sp = spread(rv, 0, 1);
    const double mean = sp.mean, lo = sp.ci95.defined() ? sp.ci95.lo : mean, hi = sp.ci95.defined() ? sp.ci95.hi : mean;
    ct.push_back({std::to_string(by_imp[i].pruned), fixed(frac, 3), fixed(100 * ia, 2), fixed(100 * ab, 2),
                  rv.empty() ? "-"
                  : sp.ci95.defined() ? fixed(100 * mean, 2) + " [" + fixed(100 * lo, 2) + ", " + fixed(100 * hi, 2) + "]"
                                      : fixed(100 * mean, 2)});
    s_imp.x.push_back(frac), s_imp.y.push_back(100 * ia);
    s_abl.x.push_back(frac), s_abl.y.push_back(100 * ab);
    if (!rv.empty()) s_rnd.x.push_back(frac), s_rnd.y.push_back(100 * mean), s_rnd.lo.push_back(100 * lo), s_rnd.hi.push_back(100 * hi);
  }
  std::printf("\nheld-out token accuracy as heads are removed (%s%s%s):\n\n",
              o.recompute ? "importance recomputed after each step" : "importance computed once",
              o.finetune_steps ? (", " + std::to_string(o.finetune_steps) + " fine-tuning steps between steps").c_str() : "",
              o.min_per_layer ? (", at least " + std::to_string(o.min_per_layer) + " heads per layer").c_str() : "");
  print_table(ct);
  std::vector<Series> plot_series = {s_imp, s_abl};
  if (!s_rnd.x.empty()) plot_series.push_back(s_rnd);
  plot_lines(out + "/prune_curves.png", "Token accuracy vs fraction of heads pruned", "fraction of heads pruned",
             "held-out token accuracy (%)", plot_series);
  auto heat = [&](const std::string& title, const HeadGrid& g) {
    Heatmap m;
    m.title = title;
    m.rows = L, m.cols = H;
    for (auto& row : g)
      for (double v : row) m.values.push_back(static_cast<float>(v));
    for (int h = 0; h < H; ++h) m.xlabels.push_back(std::to_string(h));
    for (int l = 0; l < L; ++l) m.ylabels.push_back(std::to_string(l));
    return m;
  };
  plot_heatmap_grid(out + "/head_importance.png", "Which heads matter", 3, 1,
                    {heat("importance (Michel et al.)", imp), heat("loss increase, zero-ablated", abl.d_loss),
                     heat("loss increase, mean-ablated", abl.d_loss_mean)},
                    "head", "layer");

  save_checkpoint(out + "/pruned_model.safetensors", *r.pruned, {}, {{"task", r.task.to_json()}});
  write_file_atomic(out + "/prune.json",
                    json({{"checkpoint", r.checkpoint}, {"base", {{"loss", abl.base.loss}, {"token_acc", abl.base.token_acc}}},
                          {"importance", json(imp)}, {"d_loss_zero", json(abl.d_loss)},
                          {"d_loss_mean", json(abl.d_loss_mean)}, {"entropy", json(st.entropy)},
                          {"confidence", json(st.confidence)}, {"curves", curves},
                          {"pruned_model", {{"heads_removed", r.removed}, {"gates", r.pruned->gate_values()}}}})
                            .dump(1) + "\n");
  std::printf("\nwrote %s/{heads.csv,prune_curves.csv,prune.json,head_importance.png,prune_curves.png}\n"
              "pruned model (%d of %d heads removed by importance): %s/pruned_model.safetensors\n",
              out.c_str(), r.removed, L * H, out.c_str());
  return 0;
}

int run_prune(TrainFlags& flags, const PruneOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("prune") : o.out;
  o.study.validate();  // before training flags are resolved: the flag named first is the one to fix
  const TrainArgs base = flags.resolve();
  if (!o.run.empty()) {  // Michel et al.'s importance at every snapshot, on the held-out rows prune scores on
    if (!o.checkpoint.empty()) fail("give --checkpoint (one model) or --run (every snapshot of a run), not both");
    HeadScoreOptions ho;
    ho.examples = base.eval_size;
    ho.seed = base.eval_seed;
    ho.normalize = o.study.normalize;
    ho.fallback_task = base.task;
    ho.threads = base.threads;
    return write_scores_over_training(o.run, o.out, "importance", ho);
  }
  std::unique_ptr<ProgressBar> bar;
  PruneObserver obs;
  obs.on_base_model = [&](int heads, int64_t steps, const std::string& dir, bool done) {
    if (done) {
      std::fprintf(stderr, "headlab prune: base model already trained in %s\n", dir.c_str());
      return;
    }
    std::fprintf(stderr, "headlab prune: training the base model (%d heads, %lld steps) in %s\n", heads,
                 static_cast<long long>(steps), dir.c_str());
    bar = std::make_unique<ProgressBar>("base model", steps, !o.quiet && stderr_is_terminal());
  };
  obs.base_training.on_step = [&](int64_t step, int64_t, float loss, double) { bar->update(step, "loss " + fixed(loss, 3)); };
  obs.on_model = [&](int L, int H, int eval_size) {
    if (bar) bar->finish();
    std::fprintf(stderr, "headlab prune: %d layers x %d heads, %d held-out sequences -> %s\n", L, H, eval_size, out.c_str());
  };
  obs.on_stage = [](const std::string& stage) { std::fprintf(stderr, "  %s...\n", stage.c_str()); };
  obs.on_l0_run = [](const L0Result& r, int total) {
    std::fprintf(stderr, "  lambda %-10g heads kept %3d / %d, token accuracy %s\n", r.lambda, r.heads_kept, total,
                 percent(r.eval.token_acc).c_str());
  };
  PruneStudy r;
  try {
    r = run_prune_study(base, o.study, o.checkpoint, out, obs);
  } catch (const Interrupted& e) {
    if (bar) bar->finish();
    std::fprintf(stderr, "headlab prune: interrupted while training the base model (%s); rerun the same command to continue\n",
                 e.what());
    return stop_exit_code();
  }
  return r.method == "l0" ? write_l0(r, o.study, out) : write_michel(r, o.study, out);
}

}  // namespace

void add_prune_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("prune", "Which heads matter: ablation, importance, pruning curves (trains an 8-head model first)");
  auto flags = std::make_shared<TrainFlags>();
  auto o = std::make_shared<PruneOpts>();
  set_experiment_defaults(flags->args);
  flags->add(sub, false, false);
  sub->add_option("--checkpoint", o->checkpoint, "Model to analyse (default: train one in OUT/base)");
  sub->add_option("--out", o->out, "Output directory (default: runs/prune-<date>-<time>); rerun to resume");
  sub->add_option("--run", o->run, "Only Michel et al.'s head importance, at every snapshot of this run (train "
                                   "--snapshot-every) and its final checkpoint, on --eval-size rows of --eval-seed");
  add_option_settings(sub, prune_study_settings(), o->study);
  sub->add_flag("--quiet", o->quiet, "No progress output");
  sub->callback([&runner, flags, o] { runner = [=] { return run_prune(*flags, *o); }; });
}

}  // namespace hl
