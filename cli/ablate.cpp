// headlab ablate: head-count ablation. The sweep (train/sweep.h) trains one model per (head
// count, seed) with everything else fixed; this command prints its table and writes CSV, JSON
// and plots. Interrupted sweeps resume: finished runs are read back, an unfinished one
// continues from its checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/plot.h"
#include "cli/progress.h"
#include "cli/table.h"
#include "lib/fileutil.h"
#include "train/distributed.h"
#include "train/sweep.h"

namespace hl {

using json = nlohmann::json;

namespace {

// mean [95% t-interval] over the seeds; one seed has no interval to show
std::string with_range(const Spread& s, int prec, bool pct = false) {
  const double k = pct ? 100.0 : 1.0;
  if (!s.ci95.defined()) return fixed(k * s.mean, prec);
  return fixed(k * s.mean, prec) + " [" + fixed(k * s.ci95.lo, prec) + ", " + fixed(k * s.ci95.hi, prec) + "]";
}
// the interval's ends (empty for one seed)
void ci_cells(Table::Row& row, const std::string& name, const Spread& s) {
  if (s.ci95.defined()) row.number(name + "_ci95_lo", s.ci95.lo).number(name + "_ci95_hi", s.ci95.hi);
  else row.empty(name + "_ci95_lo").empty(name + "_ci95_hi");
}
// mean, min and max over the seeds
void spread_cells(Table::Row& row, const std::string& name, const Spread& s) {
  row.number(name + "_mean", s.mean).number(name + "_min", s.lo).number(name + "_max", s.hi);
}

struct AblateOpts {
  SweepOptions sweep;
  bool quick = false;
  std::string out;
  bool quiet = false;
};

json ci_json(const Spread& s) { return s.ci95.defined() ? json{s.ci95.lo, s.ci95.hi} : json(nullptr); }
// the plots' bands: the 95% t-interval, or the mean alone for one seed
double band_lo(const Spread& s) { return s.ci95.defined() ? s.ci95.lo : s.mean; }
double band_hi(const Spread& s) { return s.ci95.defined() ? s.ci95.hi : s.mean; }

int run_ablate(TrainFlags& flags, AblateOpts o) {
  TrainArgs base = flags.resolve();
  if (o.quick) {
    if (!flags.given("--seeds")) o.sweep.seeds = 1;
    if (!flags.given("--steps")) base.steps = 300;
    if (!flags.given("--eval-size")) base.eval_size = 500;
  }
  const std::string out = o.out.empty() ? default_out_dir("ablate") : o.out;
  check_sweep(base, o.sweep, out);  // before the first line of output or any directory
  // under mpirun the ranks share the runs; rank 0 reports and writes the tables
  ProcessGroup* group = in_multi_rank_job() ? job() : nullptr;
  if (group && group->rank() != 0) {
    run_head_count_sweep(base, o.sweep, out, {}, group);
    return 0;
  }
  const int64_t total_steps = static_cast<int64_t>(o.sweep.head_counts.size()) * o.sweep.seeds * base.steps;
  std::fprintf(stderr, "headlab ablate: heads %s x %d seeds, %s, task %s, %lld steps each -> %s\n",
               [&] { std::string s; for (int h : o.sweep.head_counts) s += (s.empty() ? "" : ",") + std::to_string(h); return s; }().c_str(),
               o.sweep.seeds, o.sweep.policy.c_str(), base.task.name.c_str(), static_cast<long long>(base.steps), out.c_str());
  if (group)
    std::fprintf(stderr, "headlab ablate: %d ranks take the runs as they become free, %d threads each\n", group->size(),
                 base.threads);
  ProgressBar bar("ablate", total_steps, !o.quiet && stderr_is_terminal());
  SweepObserver obs;
  obs.on_step = [&](int index, int total, const TrainArgs& run, int64_t step, float loss) {
    char status[128];
    std::snprintf(status, sizeof status, "run %d/%d H=%d seed %llu loss %.3f", index, total, run.model.n_heads,
                  static_cast<unsigned long long>(run.seed), loss);
    bar.update((index - 1) * base.steps + step, status);
  };
  obs.on_run = [&](int index, int total, const SweepRun& rr) {
    if (!bar.enabled() && !o.quiet)
      std::fprintf(stderr, "run %d/%d H=%d seed %llu: token_acc %s, exact (greedy) %s%s\n", index, total, rr.heads,
                   static_cast<unsigned long long>(rr.seed), percent(rr.token_acc).c_str(), percent(rr.ar_exact).c_str(),
                   rr.reused ? " (already done)" : "");
  };
  std::vector<SweepRun> runs;
  try {
    runs = run_head_count_sweep(base, o.sweep, out, obs, group);
  } catch (const Interrupted& e) {
    bar.finish();
    std::fprintf(stderr, "headlab ablate: interrupted (%s); rerun the same command to continue\n", e.what());
    return stop_exit_code();
  }
  bar.finish();

  const std::vector<HeadCountSummary> by_heads = summarize_sweep(runs, o.sweep.head_counts);
  const int h1 = o.sweep.head_counts.front();
  std::vector<std::vector<std::string>> table = {{"heads", "d_head", "params", "loss", "perplexity", "token acc %",
                                                  "exact (tf) %", "exact (greedy) %", "step to 99%",
                                                  "time vs H=" + std::to_string(h1), "memory vs H=" + std::to_string(h1)}};
  json summary = json::array();
  Table csv;  // ablation.csv: a row per head count, its columns defined once below
  const std::vector<std::string>& detectors = by_heads.front().detectors;
  // mechanisms: which circuit formed in how many seeds, and how alike the seeds' heads are
  std::vector<std::string> mech_header = {"heads"};
  for (const std::string& d : detectors) mech_header.push_back(d + " head formed");
  mech_header.push_back("heads matched to seed " + std::to_string(base.seed) + ": similarity");
  mech_header.push_back("matched pairs sharing a role");
  std::vector<std::vector<std::string>> mech = {mech_header};
  for (const HeadCountSummary& s : by_heads) {
    const Spread f99 = spread(s.first_99);
    const size_t reached = s.first_99.size();
    const std::string f99s = reached == 0 ? "never"
                                          : fixed(f99.mean, 0) + (reached < static_cast<size_t>(s.runs)
                                                                     ? " (" + std::to_string(reached) + "/" + std::to_string(s.runs) + ")"
                                                                     : "");
    table.push_back({std::to_string(s.heads), std::to_string(s.d_head), std::to_string(s.params), with_range(s.loss, 3),
                     fixed(s.perplexity.mean, 3), with_range(s.token_acc, 1, true), with_range(s.exact, 1, true),
                     with_range(s.ar_exact, 1, true), f99s, fixed(s.time_rel, 2) + "x", fixed(s.memory_rel, 2) + "x"});
    Table::Row row = csv.row();
    row.integer("heads", s.heads).integer("d_head", s.d_head).integer("params", s.params).integer("seeds", s.runs);
    spread_cells(row, "loss", s.loss);
    row.number("perplexity_mean", s.perplexity.mean);
    spread_cells(row, "token_acc", s.token_acc);
    spread_cells(row, "exact_tf", s.exact);
    spread_cells(row, "exact_ar", s.ar_exact);
    row.number("first_step_99_mean", reached == 0 ? std::nullopt : std::optional<double>(f99.mean), 1)
        .integer("runs_reaching_99", static_cast<int64_t>(reached))
        .number("train_s_mean", s.train_s.mean, 4).number("time_rel", s.time_rel, 4)
        .number("peak_tensor_mib_mean", s.peak_bytes.mean / 1048576.0, 4).number("memory_rel", s.memory_rel, 4);
    ci_cells(row, "loss", s.loss);
    ci_cells(row, "token_acc", s.token_acc);
    ci_cells(row, "exact_tf", s.exact);
    ci_cells(row, "exact_ar", s.ar_exact);
    std::vector<std::string> mrow = {std::to_string(s.heads)};
    json formed = json::object();
    for (size_t d = 0; d < s.detectors.size(); ++d) {
      row.integer("runs_with_" + detectors[d], s.runs_with_role[d]).integer("heads_with_" + detectors[d], s.heads_with_role[d]);
      mrow.push_back(std::to_string(s.runs_with_role[d]) + "/" + std::to_string(s.runs) + " seeds (" +
                     std::to_string(s.heads_with_role[d]) + " heads)");
      formed[s.detectors[d]] = {{"runs", s.runs_with_role[d]}, {"heads", s.heads_with_role[d]}};
    }
    const bool matched = s.match_pairs > 0;
    row.number("seed_match_similarity_mean", matched ? std::optional<double>(s.match_similarity.mean) : std::nullopt)
        .integer("seed_match_pairs", s.match_pairs).integer("seed_match_same_role", s.match_same_role);
    mrow.push_back(matched ? with_range(s.match_similarity, 3) : "-");
    mrow.push_back(matched ? std::to_string(s.match_same_role) + "/" + std::to_string(s.match_pairs) : "-");
    mech.push_back(mrow);
    summary.push_back({{"heads", s.heads}, {"d_head", s.d_head}, {"params", s.params},
                       {"loss", {s.loss.mean, s.loss.lo, s.loss.hi}},
                       {"token_acc", {s.token_acc.mean, s.token_acc.lo, s.token_acc.hi}},
                       {"exact_match", {s.exact.mean, s.exact.lo, s.exact.hi}},
                       {"ar_exact_match", {s.ar_exact.mean, s.ar_exact.lo, s.ar_exact.hi}},
                       {"first_step_99", reached == 0 ? json(nullptr) : json(f99.mean)},
                       {"runs_reaching_99", reached}, {"train_s", s.train_s.mean}, {"peak_tensor_bytes", s.peak_bytes.mean},
                       {"ci95", {{"loss", ci_json(s.loss)}, {"token_acc", ci_json(s.token_acc)},
                                 {"exact_match", ci_json(s.exact)}, {"ar_exact_match", ci_json(s.ar_exact)}}},
                       {"mechanisms", {{"formed", formed},
                                       {"seed_match", {{"similarity", matched ? json(s.match_similarity.mean) : json(nullptr)},
                                                       {"pairs", s.match_pairs}, {"same_role", s.match_same_role}}}}}});
  }
  Table runs_csv;  // ablation_runs.csv: a row per run
  json runs_json = json::array();
  for (const SweepRun& r : runs) {
    Table::Row row = runs_csv.row();
    row.integer("heads", r.heads).integer("seed", static_cast<int64_t>(r.seed)).integer("d_head", r.d_head)
        .integer("params", r.params).number("loss", r.loss).number("token_acc", r.token_acc).number("exact_tf", r.exact)
        .number("exact_ar", r.ar_exact);
    if (r.first_99 >= 0) row.integer("first_step_99", r.first_99);
    else row.empty("first_step_99");
    row.number("train_s", r.train_s, 4).number("peak_tensor_bytes", r.peak_bytes, 0);
    for (const std::string& d : detectors) row.integer("heads_" + d, r.heads_with_role(d));
    std::string roles;  // "0.1:induction 1.0:previous_token": the heads with a role
    json heads = json::array();
    for (size_t l = 0; l < r.role.size(); ++l)
      for (size_t h = 0; h < r.role[l].size(); ++h) {
        if (r.role[l][h] != "none") roles += (roles.empty() ? "" : " ") + std::to_string(l) + "." + std::to_string(h) + ":" + r.role[l][h];
        json scores = json::object();
        for (size_t d = 0; d < r.roles.detectors.size(); ++d) scores[r.roles.detectors[d]] = r.roles.scores[d][l][h];
        heads.push_back({{"layer", l}, {"head", h}, {"role", r.role[l][h]}, {"scores", scores}});
      }
    row.text("roles", roles).number("seed_match_similarity", r.matched ? std::optional<double>(r.match_similarity) : std::nullopt);
    if (r.matched) row.integer("seed_match_same_role", r.match_same_role);
    else row.empty("seed_match_same_role");
    runs_json.push_back({{"heads", r.heads}, {"seed", r.seed}, {"head_roles", heads},
                         {"seed_match", r.matched ? json{{"similarity", r.match_similarity}, {"pairs", r.match_pairs},
                                                         {"same_role", r.match_same_role}}
                                                  : json(nullptr)}});
  }
  write_file_atomic(out + "/ablation.csv", csv.csv());
  write_file_atomic(out + "/ablation_runs.csv", runs_csv.csv());
  write_file_atomic(out + "/ablation.json",
                    json({{"config", json::parse(base.to_json())}, {"policy", o.sweep.policy}, {"seeds", o.sweep.seeds},
                          {"role_threshold", o.sweep.role_threshold}, {"role_examples", o.sweep.role_examples},
                          {"by_heads", summary}, {"runs", runs_json}}).dump(2) + "\n");
  std::printf("\nhead-count ablation: task %s, %lld steps, %d seed%s, %s (mean [95%% t-interval] over seeds)\n\n",
              base.task.name.c_str(), static_cast<long long>(base.steps), o.sweep.seeds, o.sweep.seeds > 1 ? "s" : "",
              o.sweep.policy.c_str());
  print_table(table);
  std::printf("\nmechanisms: a head takes a detector's role when it scores >= %.2f on the probe; each later seed's heads "
              "matched to seed %llu's by attention pattern (1 - Jensen-Shannon divergence)\n\n",
              o.sweep.role_threshold, static_cast<unsigned long long>(base.seed));
  print_table(mech);

  // ---- plots -----------------------------------------------------------------------------
  std::vector<Series> loss_curves, acc_curves;
  for (const HeadCountSummary& s : by_heads) {
    Series ls, as;
    ls.name = as.name = "H=" + std::to_string(s.heads);
    for (size_t i = 0; i < s.curve_steps.size(); ++i) {
      const Spread& l = s.curve_loss[i];
      const Spread& a = s.curve_acc[i];
      const double step = static_cast<double>(s.curve_steps[i]);
      ls.x.push_back(step), ls.y.push_back(l.mean), ls.lo.push_back(band_lo(l)), ls.hi.push_back(band_hi(l));
      as.x.push_back(step), as.y.push_back(100 * a.mean), as.lo.push_back(100 * band_lo(a)), as.hi.push_back(100 * band_hi(a));
    }
    loss_curves.push_back(ls);
    acc_curves.push_back(as);
  }
  plot_lines(out + "/loss_curves.png", "Held-out loss over training (mean, 95% t-interval band over seeds)", "step", "loss", loss_curves, true);
  plot_lines(out + "/accuracy_curves.png", "Held-out token accuracy over training", "step", "token accuracy (%)", acc_curves);
  Series acc, ex, tm, mem;
  acc.name = "token accuracy";
  ex.name = "exact match (greedy)";
  tm.name = "training time vs H=" + std::to_string(h1);
  mem.name = "peak tensor memory vs H=" + std::to_string(h1);
  for (const HeadCountSummary& s : by_heads) {
    const Spread& a = s.token_acc;
    const Spread& e = s.ar_exact;
    acc.x.push_back(s.heads), acc.y.push_back(100 * a.mean), acc.lo.push_back(100 * band_lo(a)), acc.hi.push_back(100 * band_hi(a));
    ex.x.push_back(s.heads), ex.y.push_back(100 * e.mean), ex.lo.push_back(100 * band_lo(e)), ex.hi.push_back(100 * band_hi(e));
    tm.x.push_back(s.heads), tm.y.push_back(s.time_rel);
    mem.x.push_back(s.heads), mem.y.push_back(s.memory_rel);
  }
  plot_lines(out + "/accuracy_vs_heads.png", "Accuracy at the end of training vs number of heads", "heads",
             "accuracy (%)", {acc, ex}, false, true);
  plot_lines(out + "/cost_vs_heads.png", "Training time and memory vs number of heads", "heads", "relative to H=" + std::to_string(h1),
             {tm, mem}, false, true);
  std::printf("\nwrote %s/{ablation.csv,ablation_runs.csv,ablation.json,loss_curves.png,accuracy_curves.png,"
              "accuracy_vs_heads.png,cost_vs_heads.png}\n", out.c_str());
  return 0;
}

}  // namespace

void add_ablate_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("ablate", "Head-count ablation: train per head count x seed, compare (tables, CSV, plots)");
  auto flags = std::make_shared<TrainFlags>();
  auto o = std::make_shared<AblateOpts>();
  set_experiment_defaults(flags->args);
  flags->add(sub, false, false);
  sub->add_option("--head-counts", o->sweep.head_counts, "Head counts to compare")->delimiter(',')->capture_default_str()
      ->check(in_range(1, 4096));
  sub->add_option("--seeds", o->sweep.seeds, "Seeds per head count")->capture_default_str()->check(in_range(1, 1e6));
  sub->add_option("--policy", o->sweep.policy, "fixed-d-model (d_head = d_model/H) or fixed-d-head (d_model = H*d_head)")
      ->capture_default_str()->check(CLI::IsMember({"fixed-d-model", "fixed-d-head"}));
  sub->add_option("--fixed-d-head", o->sweep.fixed_d_head, "d_head for --policy fixed-d-head")->capture_default_str()
      ->check(in_range(1, 1 << 16));
  sub->add_flag("--quick", o->quick, "1 seed, 300 steps, 500 held-out sequences (unless given)");
  sub->add_option("--out", o->out, "Output directory (default: runs/ablate-<date>-<time>); rerun to resume");
  sub->add_flag("--quiet", o->quiet, "No progress output");
  sub->add_option("--role-examples", o->sweep.role_examples, "Probe sequences for each run's head detectors (mechanisms)")
      ->capture_default_str()->check(in_range(1, 1e6));
  sub->add_option("--role-threshold", o->sweep.role_threshold, "A head takes a detector's role when it scores at least this")
      ->capture_default_str()->check(in_range(0, 1));
  sub->add_flag("--force", o->sweep.force, "Recompute runs in --out that were made with other settings (default: refuse)");
  sub->callback([&runner, flags, o] { runner = [=] { return run_ablate(*flags, *o); }; });
}

}  // namespace hl
