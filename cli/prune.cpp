// headlab prune: which heads matter. Single-head ablation (zero and mean), Michel et al.
// importance, attention statistics, and accuracy as heads are removed in three orders
// (importance, single-head ablation, random). Trains its own 8-head model first unless given
// a checkpoint. Resumable: the base run and each finished curve are kept in --out.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "analysis/heads.h"
#include "cli/commands.h"
#include "cli/plot.h"
#include "cli/progress.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/l0.h"
#include "train/run_dir.h"

namespace hl {

using json = nlohmann::json;

namespace {

struct PruneOpts {
  std::string checkpoint, out;
  int heads = 8;
  int64_t train_steps = 1500;
  double step_fraction = 0.1;
  bool recompute = false, normalize = false, quiet = false;
  int min_per_layer = 0;
  int finetune_steps = 0;
  float finetune_lr = 1e-3f;
  int random_seeds = 3;
  double save_fraction = 0.5;
  bool force = false;  // recompute results in --out made with other settings instead of refusing
  std::string method = "michel";  // or l0
  double lambda = 0.05;
  int target_heads = 0;  // l0: search lambda for this many heads; 0 = use --lambda
  int l0_steps = 300;
};

// --method l0: fine-tune copies of the model with hard-concrete gates, at --lambda or at lambdas
// searched for --target-heads; compare the heads kept with the top heads by Michel importance.
int run_l0(const PruneOpts& o, const std::string& out, const SafetensorsFile& file, const Task& task,
           const std::vector<Batch>& data, const TrainArgs& base) {
  std::unique_ptr<TransformerLM> reference = load_model(file);
  const int L = reference->cfg.n_layers, H = reference->cfg.n_heads;
  const HeadGrid imp = head_importance(*reference, data, false);
  auto run = [&](double lambda) {
    auto m = load_model(file);
    L0Options lo;
    lo.lambda = lambda;
    lo.steps = o.l0_steps;
    lo.lr = o.finetune_lr;
    lo.batch = base.batch;
    lo.seed = base.seed + 7;
    L0Result r = l0_finetune(*m, task, data, lo);
    std::fprintf(stderr, "  lambda %-10g heads kept %3d / %d, token accuracy %s\n", lambda, r.heads_kept, L * H,
                 percent(r.eval.token_acc).c_str());
    return std::make_pair(r, std::move(m));
  };
  std::vector<std::pair<L0Result, std::unique_ptr<TransformerLM>>> runs;
  if (o.target_heads > 0) {
    double lo = 0, hi = o.lambda;  // kept(lo) >= target > kept(hi) once bracketed
    runs.push_back(run(hi));
    while (runs.back().first.heads_kept > o.target_heads && hi < 1e3) runs.push_back(run(hi *= 4));
    if (runs.back().first.heads_kept < o.target_heads) {
      lo = hi / 4 > o.lambda / 2 ? hi / 4 : 0;
      for (int i = 0; i < 6 && runs.back().first.heads_kept != o.target_heads; ++i) {
        const double mid = lo > 0 ? std::sqrt(lo * hi) : hi / 4;
        runs.push_back(run(mid));
        (runs.back().first.heads_kept > o.target_heads ? lo : hi) = mid;
      }
    }
  } else {
    runs.push_back(run(o.lambda));
  }
  // the run to keep: the target's head count (or the closest above it), else the last
  size_t best = runs.size() - 1;
  for (size_t i = 0; i < runs.size(); ++i)
    if (o.target_heads > 0 && runs[i].first.heads_kept >= o.target_heads &&
        (runs[best].first.heads_kept < o.target_heads || runs[i].first.heads_kept < runs[best].first.heads_kept))
      best = i;
  std::string csv = "lambda,heads_kept,loss,token_acc,exact_match,gates\n";
  std::vector<std::vector<std::string>> table = {{"lambda", "heads kept", "held-out loss", "token acc %", "exact %"}};
  for (auto& [r, m] : runs) {
    std::string g;
    for (auto& row : r.gates)
      for (float v : row) g += (g.empty() ? "" : " ") + fixed(v, 3);
    csv += fixed(r.lambda, 6) + "," + std::to_string(r.heads_kept) + "," + fixed(r.eval.loss, 6) + "," + fixed(r.eval.token_acc, 6) +
           "," + fixed(r.eval.exact_match, 6) + "," + g + "\n";
    table.push_back({fixed(r.lambda, 4), std::to_string(r.heads_kept), fixed(r.eval.loss, 4), fixed(100 * r.eval.token_acc, 2),
                     fixed(100 * r.eval.exact_match, 2)});
  }
  write_file_atomic(out + "/l0.csv", csv);
  std::printf("\nhard-concrete L0 gates (%d fine-tuning steps per lambda):\n\n", o.l0_steps);
  print_table(table);
  // the surviving heads against the same number of top heads by importance
  const L0Result& r = runs[best].first;
  std::vector<std::pair<double, std::pair<int, int>>> ranked;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) ranked.push_back({-imp[l][h], {l, h}});
  std::sort(ranked.begin(), ranked.end());
  std::string kept, top;
  int overlap = 0;
  for (int i = 0; i < r.heads_kept; ++i) {
    const auto [l, h] = ranked[i].second;
    top += " L" + std::to_string(l) + "H" + std::to_string(h);
    overlap += r.gates[l][h] > 0.f;
  }
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      if (r.gates[l][h] > 0.f) kept += " L" + std::to_string(l) + "H" + std::to_string(h);
  std::printf("\nlambda %g keeps %d heads:%s\ntop %d by Michel importance:%s\noverlap: %d of %d\n", r.lambda, r.heads_kept,
              kept.c_str(), r.heads_kept, top.c_str(), overlap, r.heads_kept);
  save_checkpoint(out + "/l0_model.safetensors", *runs[best].second, {}, {{"task", task.config().to_json()}});
  std::printf("wrote %s/l0.csv, l0_model.safetensors (the gated model of lambda %g)\n", out.c_str(), r.lambda);
  return 0;
}

// FNV-1a of a file's bytes: a rerun with another checkpoint under the same path is noticed.
std::string fingerprint(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%zu bytes, fnv1a %016llx", bytes.size(), static_cast<unsigned long long>(h));
  return buf;
}


json curve_json(const std::vector<PruneStep>& c) {
  json a = json::array();
  for (const PruneStep& s : c) {
    json removed = json::array();
    for (auto& [l, h] : s.removed) removed.push_back({l, h});
    a.push_back({{"pruned", s.pruned}, {"fraction", s.fraction}, {"loss", s.eval.loss}, {"token_acc", s.eval.token_acc},
                 {"exact_match", s.eval.exact_match}, {"removed", removed}});
  }
  return a;
}

json grid_json(const HeadGrid& g) { return json(g); }

int run_prune(TrainFlags& flags, const PruneOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("prune") : o.out;
  if (!(o.step_fraction > 0 && o.step_fraction <= 1)) fail("--step-fraction must be in (0, 1], got ", o.step_fraction);
  if (!(o.save_fraction >= 0 && o.save_fraction <= 1)) fail("--save-fraction must be in [0, 1], got ", o.save_fraction);
  if (o.random_seeds < 0) fail("--random-seeds must not be negative, got ", o.random_seeds);
  if (o.min_per_layer < 0) fail("--min-per-layer must not be negative, got ", o.min_per_layer);
  if (o.finetune_steps < 0) fail("--finetune must not be negative, got ", o.finetune_steps);
  if (!(o.finetune_lr > 0 && o.finetune_lr <= 100)) fail("--finetune-lr must be in (0, 100], got ", o.finetune_lr);
  // the search for --target-heads multiplies --lambda until few enough heads stay open: from 0 it never moves
  if (o.method == "l0" && o.target_heads > 0 && !(o.lambda > 0))
    fail("--lambda ", o.lambda, " with --target-heads ", o.target_heads,
         ": the search starts at --lambda and multiplies it, so it must be above 0 (e.g. --lambda 0.05)");
  std::string ckpt = o.checkpoint;
  TrainArgs base = flags.resolve();
  refuse_output_over_input("--out", out + "/pruned_model.safetensors", {{"--checkpoint", ckpt}});
  if (ckpt.empty()) {  // the default: train an 8-head model on the experiment regime
    base.model.n_heads = o.heads;
    base.steps = o.train_steps;
    base.checkpoint_every = std::max<int64_t>(1, base.steps / 5);
    base.out = out + "/base";
    check_training_resources(base);  // before any directory is made
  } else {
    base.validate();
  }
  claim_output_dir(out, "prune");
  make_dirs(out + "/curves");
  const DirLock lock(out);
  if (ckpt.empty()) {
    ckpt = base.out + "/model.safetensors";
    reuse_only_if_same_settings(base.out, base, o.force, "--force");
    if (!run_finished(base.out)) {
      base.resume = file_exists(base.out + "/checkpoint.safetensors");
      std::fprintf(stderr, "headlab prune: training the base model (%d heads, %lld steps) in %s\n", o.heads,
                   static_cast<long long>(base.steps), base.out.c_str());
      Trainer t(base);
      ProgressBar bar("base model", base.steps, !o.quiet && stderr_is_terminal());
      TrainObserver obs;
      obs.on_step = [&](int64_t step, int64_t, float loss, double) { bar.update(step, "loss " + fixed(loss, 3)); };
      try {
        const TrainResult r = t.run(obs);
        bar.finish();
        write_summary(base.out, t.args(), r);
      } catch (const Interrupted& e) {
        bar.finish();
        write_summary(base.out, t.args(), t.partial_result(), /*finished=*/false);
        std::fprintf(stderr, "headlab prune: interrupted while training the base model (%s); rerun the same command to continue\n",
                     e.what());
        return stop_exit_code();
      }
    } else {
      std::fprintf(stderr, "headlab prune: base model already trained in %s\n", base.out.c_str());
    }
  }
  set_num_threads(base.threads);
  const std::string ckpt_bytes = read_file(ckpt);
  const SafetensorsFile file = parse_safetensors(ckpt_bytes, ckpt);
  // Curves and tables already in --out are reused only if they were made with these settings.
  const json settings = {{"checkpoint", ckpt}, {"checkpoint_file", fingerprint(ckpt_bytes)},
                         {"step_fraction", o.step_fraction}, {"recompute", o.recompute}, {"normalize", o.normalize},
                         {"min_per_layer", o.min_per_layer}, {"finetune", o.finetune_steps}, {"finetune_lr", o.finetune_lr},
                         {"random_seeds", o.random_seeds}, {"eval_size", base.eval_size}, {"eval_seed", base.eval_seed},
                         {"batch", base.batch}, {"seed", base.seed}};
  const std::string settings_path = out + "/prune_settings.json";
  if (file_exists(settings_path)) {
    json old;
    try {
      old = json::parse(read_file(settings_path));
    } catch (const json::exception& e) {
      fail(settings_path, ": unreadable (", e.what(), "); pass --force to recompute");
    }
    for (auto it = settings.begin(); it != settings.end() && old != settings; ++it) {
      if (old.value(it.key(), json()) == it.value()) continue;
      if (!o.force)
        fail(out, " holds pruning results made with other settings (", it.key(), " was ", old.value(it.key(), json()).dump(),
             ", now ", it.value().dump(), "): rerun with the same flags, choose another --out, or pass --force to recompute");
      std::error_code ec;
      std::filesystem::remove_all(out + "/curves", ec);
      make_dirs(out + "/curves");
      break;
    }
  }
  auto fresh_model = [&] { return load_model(file); };
  std::unique_ptr<TransformerLM> model = fresh_model();
  const TaskConfig tc = checkpoint_task(file, base.task);
  const std::unique_ptr<Task> task_ptr = task_for_model(model->cfg, tc, ckpt);
  const Task& task = *task_ptr;
  const int L = model->cfg.n_layers, H = model->cfg.n_heads;
  if (o.method == "l0" && o.target_heads > L * H)
    fail("--target-heads ", o.target_heads, " is more than the model's ", L * H, " heads");
  write_file_atomic(settings_path, settings.dump(2) + "\n");  // only once every flag is known to be usable
  const std::vector<Batch> data = task.held_out(base.eval_size, base.eval_seed, 128);
  std::fprintf(stderr, "headlab prune: %d layers x %d heads, %d held-out sequences -> %s\n", L, H, base.eval_size, out.c_str());
  if (o.method == "l0") return run_l0(o, out, file, task, data, base);

  // ---- per-head analyses ----------------------------------------------------------------------
  std::fprintf(stderr, "  single-head ablation (zero and mean)...\n");
  const AblationResult abl = single_head_ablation(*model, task, data);
  std::fprintf(stderr, "  importance and attention statistics...\n");
  const HeadGrid imp = head_importance(*model, data, o.normalize);
  const HeadStats st = attention_statistics(*model, data);
  std::string csv = "layer,head,d_loss_zero,d_acc_zero,d_loss_mean,d_acc_mean,importance,entropy,entropy_norm,confidence,argmax_distance\n";
  std::vector<std::vector<std::string>> table = {{"layer", "head", "dloss zero", "dacc zero %", "dloss mean", "dacc mean %",
                                                  "importance", "entropy", "entropy/log n", "confidence", "argmax dist"}};
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const std::vector<double> v = {abl.d_loss[l][h], abl.d_acc[l][h], abl.d_loss_mean[l][h], abl.d_acc_mean[l][h], imp[l][h],
                                     st.entropy[l][h], st.entropy_norm[l][h], st.confidence[l][h], st.argmax_distance[l][h]};
      csv += std::to_string(l) + "," + std::to_string(h);
      for (double x : v) csv += "," + fixed(x, 6);
      csv += "\n";
      table.push_back({std::to_string(l), std::to_string(h), fixed(v[0], 4), fixed(100 * v[1], 2), fixed(v[2], 4), fixed(100 * v[3], 2),
                       fixed(v[4], 4), fixed(v[5], 3), fixed(v[6], 3), fixed(v[7], 3), fixed(v[8], 2)});
    }
  write_file_atomic(out + "/heads.csv", csv);
  std::printf("\nbase model: held-out loss %.4f, token accuracy %s\n\nper head (d = change when that head alone is removed):\n\n",
              abl.base.loss, percent(abl.base.token_acc).c_str());
  print_table(table);

  // ---- pruning curves -----------------------------------------------------------------------
  PruneOptions popt;
  popt.step_fraction = o.step_fraction;
  popt.min_per_layer = o.min_per_layer;
  popt.finetune_steps = o.finetune_steps;
  popt.finetune = [&](TransformerLM& m, int steps) { finetune(m, task, steps, o.finetune_lr, base.batch, base.seed + 99); };
  struct Order {
    std::string name;
    std::function<HeadGrid(TransformerLM&)> rank;
    bool recompute;
  };
  std::vector<Order> orders = {
      {"importance", [&](TransformerLM& m) { return head_importance(m, data, o.normalize); }, o.recompute},
      {"ablation", [&](TransformerLM&) { return abl.d_loss; }, false}};
  for (int s = 0; s < o.random_seeds; ++s)
    orders.push_back({"random" + std::to_string(s), [s, L, H](TransformerLM&) { return random_ranking(L, H, 1000 + s); }, false});
  std::map<std::string, json> curves;
  for (const Order& ord : orders) {
    const std::string path = out + "/curves/" + ord.name + ".json";
    if (file_exists(path)) {
      curves[ord.name] = json::parse(read_file(path));
      continue;
    }
    std::fprintf(stderr, "  pruning in %s order...\n", ord.name.c_str());
    auto m = fresh_model();
    PruneOptions po = popt;
    po.recompute = ord.recompute;
    curves[ord.name] = curve_json(prune_curve(*m, task, data, ord.rank, po));
    write_file_atomic(path, curves[ord.name].dump() + "\n");
  }
  // table and CSV: accuracy vs fraction pruned
  std::string ccsv = "order,pruned,fraction,loss,token_acc,exact_match\n";
  for (auto& [name, c] : curves)
    for (const json& s : c)
      ccsv += name + "," + std::to_string(s["pruned"].get<int>()) + "," + fixed(s["fraction"], 4) + "," + fixed(s["loss"], 6) +
              "," + fixed(s["token_acc"], 6) + "," + fixed(s["exact_match"], 6) + "\n";
  write_file_atomic(out + "/prune_curves.csv", ccsv);
  std::vector<std::vector<std::string>> ct = {{"heads pruned", "fraction", "importance acc %", "ablation-order acc %",
                                               "random acc % (mean [min-max])"}};
  Series s_imp, s_abl, s_rnd;
  s_imp.name = "importance (Michel et al.)";
  s_abl.name = "single-head ablation order";
  s_rnd.name = "random order (" + std::to_string(o.random_seeds) + " seeds)";
  const size_t n_steps = curves["importance"].size();
  for (size_t i = 0; i < n_steps; ++i) {
    const json& a = curves["importance"][i];
    const double frac = a["fraction"];
    const double ia = a["token_acc"];
    const double ab = i < curves["ablation"].size() ? curves["ablation"][i]["token_acc"].get<double>() : NAN;
    std::vector<double> rv;
    for (int s = 0; s < o.random_seeds; ++s) {
      const json& c = curves["random" + std::to_string(s)];
      if (i < c.size()) rv.push_back(c[i]["token_acc"]);
    }
    double mean = 0, lo = 1, hi = 0;
    for (double v : rv) mean += v, lo = std::min(lo, v), hi = std::max(hi, v);
    if (!rv.empty()) mean /= rv.size();
    ct.push_back({std::to_string(a["pruned"].get<int>()), fixed(frac, 3), fixed(100 * ia, 2), fixed(100 * ab, 2),
                  rv.empty() ? "-" : fixed(100 * mean, 2) + " [" + fixed(100 * lo, 2) + "-" + fixed(100 * hi, 2) + "]"});
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

  // ---- the pruned model --------------------------------------------------------------------
  auto pruned = fresh_model();
  int removed = 0;
  for (const json& s : curves["importance"]) {
    if (s["fraction"].get<double>() > o.save_fraction + 1e-9) break;
    for (const json& lh : s["removed"]) pruned->gates(lh[0].get<int>()).data()[lh[1].get<int>()] = 0.f;
    removed = s["pruned"];
  }
  save_checkpoint(out + "/pruned_model.safetensors", *pruned, {}, {{"task", tc.to_json()}});
  write_file_atomic(out + "/prune.json",
                    json({{"checkpoint", ckpt}, {"base", {{"loss", abl.base.loss}, {"token_acc", abl.base.token_acc}}},
                          {"importance", grid_json(imp)}, {"d_loss_zero", grid_json(abl.d_loss)},
                          {"d_loss_mean", grid_json(abl.d_loss_mean)}, {"entropy", grid_json(st.entropy)},
                          {"confidence", grid_json(st.confidence)}, {"curves", curves},
                          {"pruned_model", {{"heads_removed", removed}, {"gates", pruned->gate_values()}}}})
                            .dump(1) + "\n");
  std::printf("\nwrote %s/{heads.csv,prune_curves.csv,prune.json,head_importance.png,prune_curves.png}\n"
              "pruned model (%d of %d heads removed by importance): %s/pruned_model.safetensors\n",
              out.c_str(), removed, L * H, out.c_str());
  return 0;
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
  sub->add_option("--base-heads", o->heads, "Heads of the base model trained when no checkpoint is given")->capture_default_str()->check(in_range(1, 4096));
  sub->add_option("--train-steps", o->train_steps, "Steps of that base training")->capture_default_str()->check(in_range(1, 1e15));
  sub->add_option("--step-fraction", o->step_fraction, "Fraction of all heads removed per step")->capture_default_str()->check(in_range(1e-9, 1));
  sub->add_flag("--recompute", o->recompute, "Recompute importance after each pruning step");
  sub->add_flag("--normalize", o->normalize, "Normalise importance per layer by its l2 norm");
  sub->add_option("--min-per-layer", o->min_per_layer, "Keep at least this many heads per layer")->capture_default_str()->check(in_range(0, 4096));
  sub->add_option("--finetune", o->finetune_steps, "Fine-tuning steps between pruning steps")->capture_default_str()->check(in_range(0, 1e9));
  sub->add_option("--finetune-lr", o->finetune_lr, "Learning rate of that fine-tuning")->capture_default_str()->check(in_range(1e-30, 100));
  sub->add_option("--random-seeds", o->random_seeds, "Random pruning orders (baseline)")->capture_default_str()->check(in_range(0, 1000));
  sub->add_option("--save-fraction", o->save_fraction, "Save the importance-pruned model at this fraction")->capture_default_str()->check(in_range(0, 1));
  sub->add_flag("--quiet", o->quiet, "No progress output");
  sub->add_flag("--force", o->force, "Recompute results in --out that were made with other settings (default: refuse)");
  sub->add_option("--method", o->method, "michel: importance, ablation and random orders; l0: hard-concrete gates (Voita et al.)")
      ->capture_default_str()->check(CLI::IsMember({"michel", "l0"}));
  sub->add_option("--lambda", o->lambda, "l0: weight of the expected number of open heads (the start of the search with --target-heads)")
      ->capture_default_str()->check(in_range(0, 1e6));
  sub->add_option("--target-heads", o->target_heads, "l0: search lambda until this many heads stay open; 0 = just --lambda")
      ->capture_default_str()->check(in_range(0, 1 << 20));
  sub->add_option("--l0-steps", o->l0_steps, "l0: fine-tuning steps per lambda")->capture_default_str()->check(in_range(1, 1e9));
  sub->callback([&runner, flags, o] { runner = [=] { return run_prune(*flags, *o); }; });
}

}  // namespace hl
