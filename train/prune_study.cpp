#include "train/prune_study.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "analysis/intervals.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/run_dir.h"

namespace hl {

using json = nlohmann::json;

#define FIELD(member) [](PruneStudyOptions& o) -> FieldRef { return &o.member; }
const std::vector<OptionSetting<PruneStudyOptions>>& prune_study_settings() {
  // clang-format off
  static const std::vector<OptionSetting<PruneStudyOptions>> rows = {
    {"--base-heads", "Heads of the base model trained when no checkpoint is given", FIELD(base_heads), 1, 4096},
    {"--train-steps", "Steps of that base training", FIELD(train_steps), 1, 1e15},
    {"--step-fraction", "Fraction of all heads removed per step", FIELD(step_fraction), 1e-9, 1},
    {"--recompute", "Recompute importance after each pruning step", FIELD(recompute), NAN, NAN, {}, true},
    {"--normalize", "Normalise importance per layer by its l2 norm", FIELD(normalize), NAN, NAN, {}, true},
    {"--min-per-layer", "Keep at least this many heads per layer", FIELD(min_per_layer), 0, 4096},
    {"--finetune", "Fine-tuning steps between pruning steps", FIELD(finetune_steps), 0, 1e9},
    {"--finetune-lr", "Learning rate of that fine-tuning", FIELD(finetune_lr), 1e-30, 100},
    {"--random-seeds", "Random pruning orders (baseline)", FIELD(random_seeds), 0, 1000},
    {"--save-fraction", "Save the importance-pruned model at this fraction", FIELD(save_fraction), 0, 1},
    {"--force", "Recompute results in --out that were made with other settings (default: refuse)", FIELD(force), NAN, NAN, {}, true},
    {"--method", "michel: importance, ablation and random orders; l0: hard-concrete gates (Voita et al.)", FIELD(method),
     NAN, NAN, {"michel", "l0"}},
    {"--lambda", "l0: weight of the expected number of open heads (with --target-heads: the least the search starts from; "
                 "it starts where the heads' importance says they begin to close)",
     FIELD(lambda), 0, 1e6},
    {"--target-heads", "l0: search lambda until this many heads stay open; 0 = just --lambda", FIELD(target_heads), 0, 1 << 20},
    {"--l0-steps", "l0: fine-tuning steps per lambda", FIELD(l0_steps), 1, 1e9},
  };
  // clang-format on
  return rows;
}
#undef FIELD

void PruneStudyOptions::validate() const {
  check_option_settings(prune_study_settings(), *this);
  // the search for target_heads multiplies lambda until few enough heads stay open: from 0 it never moves
  if (method == "l0" && target_heads > 0 && !(lambda > 0))
    fail("--lambda ", lambda, " with --target-heads ", target_heads,
         ": the search starts at --lambda and multiplies it, so it must be above 0 (e.g. --lambda 0.05)");
}

json prune_curve_json(const std::vector<PruneStep>& curve) {
  json a = json::array();
  for (const PruneStep& s : curve) {
    json removed = json::array();
    for (auto& [l, h] : s.removed) removed.push_back({l, h});
    a.push_back({{"pruned", s.pruned}, {"fraction", s.fraction}, {"loss", s.eval.loss}, {"token_acc", s.eval.token_acc},
                 {"exact_match", s.eval.exact_match}, {"removed", removed}});
  }
  return a;
}

std::vector<PruneStep> prune_curve_from_json(const json& j) {
  std::vector<PruneStep> curve;
  for (const json& s : j) {
    PruneStep p;
    p.pruned = s.at("pruned");
    p.fraction = s.at("fraction");
    p.eval.loss = s.at("loss");
    p.eval.token_acc = s.at("token_acc");
    p.eval.exact_match = s.at("exact_match");
    for (const json& lh : s.at("removed")) p.removed.push_back({lh.at(0).get<int>(), lh.at(1).get<int>()});
    curve.push_back(p);
  }
  return curve;
}

namespace {

// Trains (or continues, or finds finished) the base model in base.out.
void train_base_model(const TrainArgs& base, const PruneStudyOptions& o, const PruneObserver& obs) {
  reuse_only_if_same_settings(base.out, base, o.force, "--force");
  const bool done = run_finished(base.out);
  if (obs.on_base_model) obs.on_base_model(o.base_heads, base.steps, base.out, done);
  if (!done) train_to_end(base, obs.base_training);
}

// Fine-tunes copies of the model with hard-concrete gates at o.lambda, or at lambdas searched
// until o.target_heads stay open.
void l0_study(PruneStudy& r, const PruneStudyOptions& o, const SafetensorsFile& file, const Task& task,
              const std::vector<Batch>& data, const TrainArgs& base, const PruneObserver& obs) {
  const int L = r.layers, H = r.heads;
  {
    std::unique_ptr<TransformerLM> reference = load_model(file);
    r.importance = head_importance(*reference, data, false);
  }
  std::vector<std::unique_ptr<TransformerLM>> models;
  auto run = [&](double lambda) {
    auto m = load_model(file);
    L0Options lo;
    lo.lambda = lambda;
    lo.steps = o.l0_steps;
    lo.lr = o.finetune_lr;
    lo.batch = base.batch;
    lo.seed = base.seed + 7;
    r.l0_runs.push_back(l0_finetune(*m, task, data, lo));
    models.push_back(std::move(m));
    if (obs.on_l0_run) obs.on_l0_run(r.l0_runs.back(), L * H);
    return r.l0_runs.back().heads_kept;
  };
  if (o.target_heads > 0) {
    // The search starts where the data says heads begin to close, not below: a gate closes
    // roughly when lambda outweighs its head's importance (both are d loss / d gate), so a
    // quarter of the importance of the most important head that must close. --lambda only
    // raises the start (from --lambda 1e-30, quadrupling alone took 55 fine-tunings).
    std::vector<double> by_importance;
    for (const auto& row : r.importance) by_importance.insert(by_importance.end(), row.begin(), row.end());
    std::sort(by_importance.begin(), by_importance.end(), std::greater<>());
    const double from_data = o.target_heads < static_cast<int>(by_importance.size()) ? by_importance[o.target_heads] / 4 : 0;
    const double start = std::isfinite(from_data) ? std::max(o.lambda, from_data) : o.lambda;
    double lo = 0, hi = start;  // kept(lo) >= target > kept(hi) once bracketed
    int kept = run(hi);
    while (kept > o.target_heads && hi < 1e3) kept = run(hi *= 4);
    if (kept < o.target_heads) {
      lo = hi / 4 > start / 2 ? hi / 4 : 0;
      for (int i = 0; i < 6 && kept != o.target_heads; ++i) {
        const double mid = lo > 0 ? std::sqrt(lo * hi) : hi / 4;
        kept = run(mid);
        (kept > o.target_heads ? lo : hi) = mid;
      }
    }
  } else {
    run(o.lambda);
  }
  const auto& runs = r.l0_runs;
  r.l0_best = runs.size() - 1;
  for (size_t i = 0; i < runs.size(); ++i)
    if (o.target_heads > 0 && runs[i].heads_kept >= o.target_heads &&
        (runs[r.l0_best].heads_kept < o.target_heads || runs[i].heads_kept < runs[r.l0_best].heads_kept))
      r.l0_best = i;
  r.l0_model = std::move(models[r.l0_best]);
  std::vector<std::pair<double, std::pair<int, int>>> ranked;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) ranked.push_back({-r.importance[l][h], {l, h}});
  std::sort(ranked.begin(), ranked.end());
  for (auto& [score, lh] : ranked) r.by_importance.push_back(lh);
}

// Per-head analyses, then the pruning curves (each read back from OUT/curves when done before).
void michel_study(PruneStudy& r, const PruneStudyOptions& o, const SafetensorsFile& file, const Task& task,
                  const std::vector<Batch>& data, const TrainArgs& base, const std::string& out,
                  const PruneObserver& obs) {
  auto stage = [&](const char* what) {
    if (obs.on_stage) obs.on_stage(what);
  };
  const int L = r.layers, H = r.heads;
  std::unique_ptr<TransformerLM> model = load_model(file);
  stage("single-head ablation (zero and mean)");
  r.ablation = single_head_ablation(*model, task, data);
  stage("importance and attention statistics");
  std::vector<HeadGrid> each;
  r.importance = head_importance(*model, data, o.normalize, &each);
  // intervals of the unnormalised means; with --normalize each layer's are scaled as its scores
  r.importance_ci95_lo = r.importance_ci95_hi = r.importance;
  for (int l = 0; l < L; ++l) {
    double raw_norm = 0;
    for (int h = 0; h < H; ++h) {
      double m = 0;
      for (const HeadGrid& g : each) m += g[l][h];
      raw_norm += (m / static_cast<double>(each.size())) * (m / static_cast<double>(each.size()));
    }
    const double scale = o.normalize && raw_norm > 0 ? 1.0 / std::sqrt(raw_norm) : 1.0;
    for (int h = 0; h < H; ++h) {
      std::vector<double> v;
      for (const HeadGrid& g : each) v.push_back(g[l][h]);
      const Interval ci = bootstrap_interval95(v, 2000, 17 + 131 * l + h);
      r.importance_ci95_lo[l][h] = ci.lo * scale, r.importance_ci95_hi[l][h] = ci.hi * scale;
    }
  }
  r.stats = attention_statistics(*model, data);

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
      {"ablation", [&](TransformerLM&) { return r.ablation.d_loss; }, false}};
  for (int s = 0; s < o.random_seeds; ++s)
    orders.push_back({"random" + std::to_string(s), [s, L, H](TransformerLM&) { return random_ranking(L, H, 1000 + s); }, false});
  for (const Order& ord : orders) {
    const std::string path = out + "/curves/" + ord.name + ".json";
    if (file_exists(path)) {
      r.curves[ord.name] = prune_curve_from_json(json::parse(read_file(path)));
      continue;
    }
    stage(("pruning in " + ord.name + " order").c_str());
    auto m = load_model(file);
    PruneOptions po = popt;
    po.recompute = ord.recompute;
    r.curves[ord.name] = prune_curve(*m, task, data, ord.rank, po);
    write_file_atomic(path, prune_curve_json(r.curves[ord.name]).dump() + "\n");
  }
  // the model pruned by importance up to save_fraction
  r.pruned = load_model(file);
  for (const PruneStep& s : r.curves["importance"]) {
    if (s.fraction > o.save_fraction + 1e-9) break;
    for (auto& [l, h] : s.removed) r.pruned->gates(l).data()[h] = 0.f;
    r.removed = s.pruned;
  }
}

}  // namespace

PruneStudy run_prune_study(TrainArgs base, const PruneStudyOptions& o, const std::string& checkpoint,
                           const std::string& out, const PruneObserver& obs) {
  o.validate();
  refuse_output_over_input("--out", out + "/pruned_model.safetensors", {{"--checkpoint", checkpoint}});
  if (checkpoint.empty()) {  // the default: train a base model on the study's regime
    base.model.n_heads = o.base_heads;
    base.steps = o.train_steps;
    base.checkpoint_every = std::max<int64_t>(1, base.steps / 5);
    base.out = out + "/base";
    check_training_resources(base);  // before any directory is made
  } else {
    base.validate();
  }
  PruneStudy r;
  r.method = o.method;
  claim_output_dir(out, "prune");
  make_dirs(out + "/curves");
  r.lock = std::make_unique<DirLock>(out);
  r.checkpoint = checkpoint;
  if (checkpoint.empty()) {
    train_base_model(base, o, obs);
    r.checkpoint = base.out + "/model.safetensors";
  }
  set_num_threads(base.threads);
  // a checkpoint file, or a directory that stands for its model (a run's, or a GPT-2 one), as
  // every command reads --checkpoint; the fingerprint notices another model under the same path
  std::string ckpt_bytes;
  SafetensorsFile file;
  if (std::filesystem::is_directory(r.checkpoint)) {
    file = read_checkpoint(r.checkpoint);
    for (const auto& [key, value] : file.metadata) ckpt_bytes += key + '\0' + value + '\0';
    for (const auto& [name, t] : file.tensors) ckpt_bytes += name + '\0' + t.shape.str() + '\0' + fingerprint(t.bytes) + '\0';
  } else {
    ckpt_bytes = read_file(r.checkpoint);
    file = parse_safetensors(ckpt_bytes, r.checkpoint);
  }
  // Curves and tables already in OUT are reused only if they were made with these settings.
  // "importance" names the definition: results of an earlier one are not reused
  const json settings = {{"checkpoint", r.checkpoint}, {"checkpoint_file", fingerprint(ckpt_bytes)},
                         {"importance", "michel_per_example"},
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
    reuse_only_if_same(out, "pruning results", first_json_difference(old, settings), o.force, "--force", [&] {
      std::error_code ec;
      std::filesystem::remove_all(out + "/curves", ec);
      make_dirs(out + "/curves");
    });
  }
  const std::unique_ptr<TransformerLM> model = load_model(file);
  r.task = checkpoint_task(file, base.task);
  const std::unique_ptr<Task> task = task_for_model(model->cfg, r.task, r.checkpoint);
  r.layers = model->cfg.n_layers, r.heads = model->cfg.n_heads;
  if (o.method == "l0" && o.target_heads > r.layers * r.heads)
    fail("--target-heads ", o.target_heads, " is more than the model's ", r.layers * r.heads, " heads");
  write_file_atomic(settings_path, settings.dump(2) + "\n");  // only once every setting is known to be usable
  const std::vector<Batch> data = task->held_out(base.eval_size, base.eval_seed, 128);
  if (obs.on_model) obs.on_model(r.layers, r.heads, base.eval_size);
  if (o.method == "l0")
    l0_study(r, o, file, *task, data, base, obs);
  else
    michel_study(r, o, file, *task, data, base, out, obs);
  return r;
}

}  // namespace hl
