#include "train/over_training.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "analysis/circuits.h"
#include "analysis/decompose.h"
#include "analysis/detectors.h"
#include "analysis/patching.h"
#include "analysis/roles.h"
#include "lib/fileutil.h"
#include "lib/parallel.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/snapshots.h"
#include "train/trainer.h"
#include "train/sweep.h"

namespace hl {

const std::vector<std::string>& over_training_analyses() {
  static const std::vector<std::string> names = {"detect", "patch", "importance", "dla", "compose"};
  return names;
}

std::vector<std::string> head_score_names(const std::string& analysis) {
  if (analysis == "detect") return {"previous_token", "duplicate_token", "induction"};
  if (analysis == "patch") return {"exact", "attribution"};
  if (analysis == "importance") return {"importance"};
  if (analysis == "dla") return {"dla"};
  if (analysis == "compose") return {"q_composition", "k_composition", "v_composition"};
  std::string list;
  for (const std::string& a : over_training_analyses()) list += (list.empty() ? "" : ", ") + a;
  fail("analysis '", analysis, "' is not one of ", list);
}

int default_examples(const std::string& analysis) {
  (void)head_score_names(analysis);  // a bad name fails here
  if (analysis == "patch") return 64;
  if (analysis == "importance") {
    TrainArgs a;
    set_experiment_defaults(a);  // prune's regime
    return a.eval_size;
  }
  return 200;
}

std::vector<Batch> detector_data(const ModelConfig& cfg, const HeadScoreOptions& o, const std::function<const Task&()>& task) {
  if (o.data != "probe" && o.data != "fixed-probe" && o.data != "task")
    fail("--data must be probe, fixed-probe or task, got '", o.data, "'");
  if (o.bos >= 0 && o.data != "probe") fail("--bos applies to --data probe (the default), not --data ", o.data);
  if (o.data == "task") return task().held_out(o.examples, o.seed, 64);
  const int lead = o.bos >= 0 && o.data == "probe" ? 1 : 0;
  const int k = o.length > 0 ? o.length : static_cast<int>(std::min<int64_t>(16, (cfg.max_seq_len - lead) / 2));
  if (2 * k + lead > cfg.max_seq_len)
    fail("--length ", k, ": the probe's ", 2 * k + lead, " tokens exceed the model's max_seq_len ", cfg.max_seq_len);
  if (o.bos >= cfg.vocab_size) fail("--bos ", o.bos, " is outside the model's vocabulary of ", cfg.vocab_size);
  if (o.data == "probe") return varied_repeat_probe(o.examples, k, static_cast<int>(cfg.vocab_size), o.seed, o.bos);
  return repeated_random_tokens(o.examples, k, static_cast<int>(cfg.vocab_size), o.seed);
}

HeadScores head_scores(const std::string& analysis, const SafetensorsFile& file, const std::string& source,
                       const HeadScoreOptions& o) {
  HeadScores r;
  r.names = head_score_names(analysis);
  set_num_threads(o.threads);
  std::unique_ptr<TransformerLM> model = load_model(file);
  const ModelConfig& cfg = model->cfg;
  const TaskConfig tc = checkpoint_task(file, o.fallback_task);
  std::unique_ptr<Task> task_store;
  auto task = [&]() -> const Task& {  // made when an analysis needs the task's rows
    if (!task_store) task_store = task_for_model(cfg, tc, source);
    return *task_store;
  };
  const size_t L = static_cast<size_t>(cfg.n_layers), H = static_cast<size_t>(cfg.n_heads);
  if (analysis == "detect") {
    const std::vector<Batch> data = detector_data(cfg, o, task);
    const DetectorOptions opt{o.exclude_bos, o.exclude_current};
    // the scores detect gives (all three detectors from one forward per batch)
    r.grids = detect_heads(*model, data, {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction}, opt);
  } else if (analysis == "patch") {
    check_fits_in_memory(patching_memory_bytes(cfg, o.examples, task().seq_len()),
                         "--examples " + std::to_string(o.examples) + " of " + std::to_string(task().seq_len()) + " tokens");
    const std::vector<Batch> held = task().held_out(o.examples, o.seed, o.examples);
    const PatchingResult p = activation_patching(*model, corrupt_one_symbol(held[0], task().symbols(), o.seed, o.corruption));
    r.grids = {p.z_exact, p.z_attribution};
    // The restored fraction divides by the corruption's effect; before the model has learnt the
    // task that effect is ~0 (step 0: 0.0255 vs 0.0250) and the fraction is noise: left empty.
    if (std::fabs(p.clean_metric - p.corrupted_metric) < kLeastPatchingGap)
      for (HeadGrid& g : r.grids)
        for (auto& row : g) std::fill(row.begin(), row.end(), std::numeric_limits<double>::quiet_NaN());
  } else if (analysis == "importance") {
    const std::vector<Batch> data = task().held_out(o.examples, o.seed, 128);
    std::vector<HeadGrid> each;  // as prune computes it (with each example's, for its intervals)
    r.grids = {head_importance(*model, data, o.normalize, &each)};
  } else if (analysis == "dla") {
    if (cfg.norm != Norm::Pre)
      fail("dla needs a pre-norm model: ", source, " is post-norm (its residual stream is normalised after each block, "
           "so it is not a sum of components)");
    const DlaResult d = direct_logit_attribution(*model, task().held_out(o.examples, o.seed, 64));
    HeadGrid g(L, std::vector<double>(H, 0.0));
    for (size_t c = 0; c < d.labels.size(); ++c) {
      if (d.head[c] < 0) continue;
      double s = 0;  // the mean over the rows, as dla's table gives it
      for (double x : d.per_row[c]) s += x;
      g[static_cast<size_t>(d.layer[c])][static_cast<size_t>(d.head[c])] =
          d.per_row[c].empty() ? 0.0 : s / static_cast<double>(d.per_row[c].size());
    }
    r.grids = {g};
  } else if (analysis == "compose") {
    if (L < 2) fail(source, ": composition needs at least 2 layers, the model has ", L);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    r.grids.assign(3, HeadGrid(L, std::vector<double>(H, nan)));
    for (size_t l = 1; l < L; ++l) {
      const CompositionScores c = composition_scores(*model, static_cast<int>(l - 1), static_cast<int>(l));
      const std::vector<std::vector<double>>* qkv[3] = {&c.q, &c.k, &c.v};
      for (size_t k = 0; k < 3; ++k)
        for (size_t b = 0; b < H; ++b) {  // [a][b]: head a of layer l - 1 into head b of layer l
          double best = -std::numeric_limits<double>::infinity();
          for (size_t a = 0; a < H; ++a) best = std::max(best, (*qkv[k])[a][b]);
          r.grids[k][l][b] = best;
        }
    }
  }
  return r;
}

namespace {
int64_t checkpoint_step(const SafetensorsFile& f, const std::string& path) {
  try {
    return nlohmann::json::parse(f.meta("train_state")).at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": its train_state metadata is unreadable (", e.what(), ")");
  }
}
int64_t checkpoint_step(const std::string& path) { return checkpoint_step(read_safetensors(path), path); }
// A file dropped into a run's snapshots from another run (another seed, model or task) would be
// scored as this run's step: its stored arguments must define the same run as the run's own.
void check_same_run(const SafetensorsFile& f, const std::string& path, const std::string& run_args,
                    const std::string& run_source) {
  if (run_args == "null") return;  // neither summary nor checkpoint: nothing to compare with
  std::string args;
  try {
    args = nlohmann::json::parse(f.meta("train_state")).at("args").dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": its train_state metadata is unreadable (", e.what(), ")");
  }
  // both read back and written again: a setting one side predates compares as its default
  const std::string difference = first_identity_difference(TrainArgs::from_json(run_args, run_source).to_json(),
                                                           TrainArgs::from_json(args, path).to_json(), "in the run", "in this file");
  if (!difference.empty())
    fail(path, ": a snapshot of another run (", difference, "): remove it, or analyse the run it belongs to");
}
}  // namespace

ScoresOverTraining scores_over_training(const std::string& run, const std::string& analysis, const HeadScoreOptions& o,
                                        const std::function<void(size_t, size_t, int64_t)>& progress) {
  ScoresOverTraining s;
  s.run = run;
  s.analysis = analysis;
  s.score_names = head_score_names(analysis);  // a bad name fails before anything is read
  if (!std::filesystem::is_directory(run)) fail("--run ", run, ": no such run directory");
  for (int64_t step : snapshot_steps(run)) {
    s.steps.push_back(step);
    s.checkpoints.push_back(snapshot_path(run, step));
  }
  if (s.steps.empty()) fail(run, " has no snapshots (", how_to_make_snapshots(), ")");
  const std::string final_path = run + "/checkpoint.safetensors";
  if (file_exists(final_path)) {
    const int64_t last = checkpoint_step(final_path);
    if (std::find(s.steps.begin(), s.steps.end(), last) == s.steps.end()) {
      // a run stopped early may hold snapshots written after its checkpoint: keep the steps in order
      const auto at = std::upper_bound(s.steps.begin(), s.steps.end(), last) - s.steps.begin();
      s.steps.insert(s.steps.begin() + at, last);
      s.checkpoints.insert(s.checkpoints.begin() + at, final_path);
    }
  }
  s.values.assign(s.score_names.size(), {});
  const std::string run_args = stored_run_args(run);
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const SafetensorsFile f = read_checkpoint(s.checkpoints[i]);
    if (const int64_t stored = checkpoint_step(f, s.checkpoints[i]); stored != s.steps[i])
      fail(s.checkpoints[i], ": holds the weights of step ", stored, ", not of step ", s.steps[i], " (a renamed or copied file)");
    check_same_run(f, s.checkpoints[i], run_args, run);
    const HeadScores h = head_scores(analysis, f, s.checkpoints[i], o);
    const int L = static_cast<int>(h.grids[0].size()), H = L ? static_cast<int>(h.grids[0][0].size()) : 0;
    if (i == 0) s.layers = L, s.heads = H;
    if (L != s.layers || H != s.heads)
      fail(s.checkpoints[i], ": ", L, " layers x ", H, " heads, but ", s.checkpoints[0], " has ", s.layers, " x ", s.heads);
    for (size_t k = 0; k < h.grids.size(); ++k)
      for (const auto& row : h.grids[k]) s.values[k].insert(s.values[k].end(), row.begin(), row.end());
    if (progress) progress(i + 1, s.steps.size(), s.steps[i]);
  }
  return s;
}

std::string scores_over_training_csv(const ScoresOverTraining& s) {
  std::string csv = "step,layer,head";
  for (const std::string& n : s.score_names) csv += "," + n;
  csv += "\n";
  char v[40];
  for (size_t i = 0; i < s.steps.size(); ++i)
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.heads; ++h) {
        csv += std::to_string(s.steps[i]) + "," + std::to_string(l) + "," + std::to_string(h);
        for (size_t k = 0; k < s.score_names.size(); ++k) {
          const double x = s.at(k, i, l, h);
          if (std::isnan(x)) v[0] = '\0';
          else std::snprintf(v, sizeof v, "%.17g", x);
          csv += std::string(",") + v;
        }
        csv += "\n";
      }
  return csv;
}

}  // namespace hl
