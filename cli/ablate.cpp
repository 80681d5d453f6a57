// headlab ablate: head-count ablation. The sweep (train/sweep.h) trains one model per (head
// count, seed) with everything else fixed; this command prints its table and writes CSV, JSON
// and plots. Interrupted sweeps resume: finished runs are read back, an unfinished one
// continues from its checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/plot.h"
#include "cli/progress.h"
#include "lib/fileutil.h"
#include "train/distributed.h"
#include "train/sweep.h"

namespace hl {

using json = nlohmann::json;

namespace {

struct Stat {
  double mean = 0, lo = 0, hi = 0;
};
Stat stat(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  s.lo = *std::min_element(v.begin(), v.end());
  s.hi = *std::max_element(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  return s;
}
// mean [min-max] over the seeds; one value alone has no range to show
std::string with_range(const Stat& s, int prec, bool pct = false) {
  const double k = pct ? 100.0 : 1.0;
  if (s.lo == s.hi) return fixed(k * s.mean, prec);
  return fixed(k * s.mean, prec) + " [" + fixed(k * s.lo, prec) + "-" + fixed(k * s.hi, prec) + "]";
}

struct AblateOpts {
  SweepOptions sweep;
  bool quick = false;
  std::string out;
  bool quiet = false;
};

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

  // ---- per head count ---------------------------------------------------------------------
  std::map<int, std::vector<const SweepRun*>> by_h;
  for (const SweepRun& r : runs) by_h[r.heads].push_back(&r);
  auto col = [&](int h, auto f) {
    std::vector<double> v;
    for (const SweepRun* r : by_h[h]) v.push_back(f(*r));
    return stat(v);
  };
  const int h1 = o.sweep.head_counts.front();
  const double t1 = col(h1, [](const SweepRun& r) { return r.train_s; }).mean;
  const double m1 = col(h1, [](const SweepRun& r) { return r.peak_bytes; }).mean;
  std::vector<std::vector<std::string>> table = {{"heads", "d_head", "params", "loss", "perplexity", "token acc %",
                                                  "exact (tf) %", "exact (greedy) %", "step to 99%",
                                                  "time vs H=" + std::to_string(h1), "memory vs H=" + std::to_string(h1)}};
  json summary = json::array();
  std::string csv = "heads,d_head,params,seeds,loss_mean,loss_min,loss_max,perplexity_mean,token_acc_mean,token_acc_min,"
                    "token_acc_max,exact_tf_mean,exact_tf_min,exact_tf_max,exact_ar_mean,exact_ar_min,exact_ar_max,"
                    "first_step_99_mean,runs_reaching_99,train_s_mean,time_rel,peak_tensor_mib_mean,memory_rel\n";
  for (int h : o.sweep.head_counts) {
    const auto& rs = by_h[h];
    const Stat loss = col(h, [](const SweepRun& r) { return r.loss; });
    const Stat ppl = col(h, [](const SweepRun& r) { return std::exp(r.loss); });
    const Stat acc = col(h, [](const SweepRun& r) { return r.token_acc; });
    const Stat ex = col(h, [](const SweepRun& r) { return r.exact; });
    const Stat ar = col(h, [](const SweepRun& r) { return r.ar_exact; });
    const Stat ts = col(h, [](const SweepRun& r) { return r.train_s; });
    const Stat mem = col(h, [](const SweepRun& r) { return r.peak_bytes; });
    std::vector<double> reach;
    for (const SweepRun* r : rs)
      if (r->first_99 >= 0) reach.push_back(static_cast<double>(r->first_99));
    const Stat f99 = stat(reach);
    const std::string f99s = reach.empty() ? "never"
                                           : fixed(f99.mean, 0) + (reach.size() < rs.size()
                                                                     ? " (" + std::to_string(reach.size()) + "/" + std::to_string(rs.size()) + ")"
                                                                     : "");
    table.push_back({std::to_string(h), std::to_string(rs[0]->d_head), std::to_string(rs[0]->params), with_range(loss, 3),
                     fixed(ppl.mean, 3), with_range(acc, 1, true), with_range(ex, 1, true), with_range(ar, 1, true), f99s,
                     fixed(t1 > 0 ? ts.mean / t1 : 0, 2) + "x", fixed(m1 > 0 ? mem.mean / m1 : 0, 2) + "x"});
    csv += std::to_string(h) + "," + std::to_string(rs[0]->d_head) + "," + std::to_string(rs[0]->params) + "," +
           std::to_string(rs.size()) + "," + fixed(loss.mean, 6) + "," + fixed(loss.lo, 6) + "," + fixed(loss.hi, 6) + "," +
           fixed(ppl.mean, 6) + "," + fixed(acc.mean, 6) + "," + fixed(acc.lo, 6) + "," + fixed(acc.hi, 6) + "," +
           fixed(ex.mean, 6) + "," + fixed(ex.lo, 6) + "," + fixed(ex.hi, 6) + "," + fixed(ar.mean, 6) + "," + fixed(ar.lo, 6) +
           "," + fixed(ar.hi, 6) + "," + (reach.empty() ? "" : fixed(f99.mean, 1)) + "," + std::to_string(reach.size()) +
           "," + fixed(ts.mean, 4) + "," + fixed(t1 > 0 ? ts.mean / t1 : 0, 4) + "," + fixed(mem.mean / 1048576.0, 4) + "," +
           fixed(m1 > 0 ? mem.mean / m1 : 0, 4) + "\n";
    summary.push_back({{"heads", h}, {"d_head", rs[0]->d_head}, {"params", rs[0]->params},
                       {"loss", {loss.mean, loss.lo, loss.hi}}, {"token_acc", {acc.mean, acc.lo, acc.hi}},
                       {"exact_match", {ex.mean, ex.lo, ex.hi}}, {"ar_exact_match", {ar.mean, ar.lo, ar.hi}},
                       {"first_step_99", reach.empty() ? json(nullptr) : json(f99.mean)},
                       {"runs_reaching_99", reach.size()}, {"train_s", ts.mean}, {"peak_tensor_bytes", mem.mean}});
  }
  std::string runs_csv = "heads,seed,d_head,params,loss,token_acc,exact_tf,exact_ar,first_step_99,train_s,peak_tensor_bytes\n";
  for (const SweepRun& r : runs)
    runs_csv += std::to_string(r.heads) + "," + std::to_string(r.seed) + "," + std::to_string(r.d_head) + "," +
                std::to_string(r.params) + "," + fixed(r.loss, 6) + "," + fixed(r.token_acc, 6) + "," + fixed(r.exact, 6) +
                "," + fixed(r.ar_exact, 6) + "," + (r.first_99 >= 0 ? std::to_string(r.first_99) : "") + "," +
                fixed(r.train_s, 4) + "," + fixed(r.peak_bytes, 0) + "\n";
  write_file_atomic(out + "/ablation.csv", csv);
  write_file_atomic(out + "/ablation_runs.csv", runs_csv);
  write_file_atomic(out + "/ablation.json",
                    json({{"config", json::parse(base.to_json())}, {"policy", o.sweep.policy}, {"seeds", o.sweep.seeds},
                          {"by_heads", summary}}).dump(2) + "\n");
  std::printf("\nhead-count ablation: task %s, %lld steps, %d seed%s, %s (mean [min-max] over seeds)\n\n",
              base.task.name.c_str(), static_cast<long long>(base.steps), o.sweep.seeds, o.sweep.seeds > 1 ? "s" : "",
              o.sweep.policy.c_str());
  print_table(table);

  // ---- plots -----------------------------------------------------------------------------
  std::vector<Series> loss_curves, acc_curves;
  for (int h : o.sweep.head_counts) {
    Series ls, as;
    ls.name = as.name = "H=" + std::to_string(h);
    const auto& rs = by_h[h];
    for (size_t i = 0; i < rs[0]->curve.size(); ++i) {
      std::vector<double> lv, av;
      for (const SweepRun* r : rs)
        if (i < r->curve.size()) lv.push_back(r->curve[i].second.loss), av.push_back(r->curve[i].second.token_acc);
      const Stat l = stat(lv), a = stat(av);
      const double step = static_cast<double>(rs[0]->curve[i].first);
      ls.x.push_back(step), ls.y.push_back(l.mean), ls.lo.push_back(l.lo), ls.hi.push_back(l.hi);
      as.x.push_back(step), as.y.push_back(100 * a.mean), as.lo.push_back(100 * a.lo), as.hi.push_back(100 * a.hi);
    }
    loss_curves.push_back(ls);
    acc_curves.push_back(as);
  }
  plot_lines(out + "/loss_curves.png", "Held-out loss over training (mean, min-max band)", "step", "loss", loss_curves, true);
  plot_lines(out + "/accuracy_curves.png", "Held-out token accuracy over training", "step", "token accuracy (%)", acc_curves);
  Series acc, ex, tm, mem;
  acc.name = "token accuracy";
  ex.name = "exact match (greedy)";
  tm.name = "training time vs H=" + std::to_string(h1);
  mem.name = "peak tensor memory vs H=" + std::to_string(h1);
  for (int h : o.sweep.head_counts) {
    const Stat a = col(h, [](const SweepRun& r) { return r.token_acc; });
    const Stat e = col(h, [](const SweepRun& r) { return r.ar_exact; });
    acc.x.push_back(h), acc.y.push_back(100 * a.mean), acc.lo.push_back(100 * a.lo), acc.hi.push_back(100 * a.hi);
    ex.x.push_back(h), ex.y.push_back(100 * e.mean), ex.lo.push_back(100 * e.lo), ex.hi.push_back(100 * e.hi);
    tm.x.push_back(h), tm.y.push_back(col(h, [](const SweepRun& r) { return r.train_s; }).mean / std::max(t1, 1e-9));
    mem.x.push_back(h), mem.y.push_back(col(h, [](const SweepRun& r) { return r.peak_bytes; }).mean / std::max(m1, 1.0));
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

// The regime that separates head counts: variable-length copy, small model.
void set_experiment_defaults(TrainArgs& a) {
  a.task = TaskConfig::preset("varcopy");
  a.model.d_model = 32;
  a.model.n_layers = 2;
  a.model.d_ff = 128;
  a.batch = 64;
  a.lr = 3e-3f;
  a.warmup = 100;
  a.schedule = "cosine";
  a.min_lr_ratio = 0.1f;
  a.steps = 600;
  a.eval_every = 50;
}

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
  sub->add_flag("--force", o->sweep.force, "Recompute runs in --out that were made with other settings (default: refuse)");
  sub->callback([&runner, flags, o] { runner = [=] { return run_ablate(*flags, *o); }; });
}

}  // namespace hl
