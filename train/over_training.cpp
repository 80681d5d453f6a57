#include "train/over_training.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/snapshots.h"
#include "train/trainer.h"
#include "train/sweep.h"

namespace hl {

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

RunSteps run_steps(const std::string& run) {
  RunSteps s;
  if (!std::filesystem::is_directory(run)) fail("--run ", run, ": no such run directory");
  for (int64_t step : snapshot_steps(run)) {
    s.steps.push_back(step);
    s.checkpoints.push_back(snapshot_path(run, step));
  }
  // a model's downloaded revisions (stepN subdirectories): their steps are their names'
  s.revisions = s.steps.empty() && !(s.steps = revision_steps(run)).empty();
  if (s.revisions)
    for (int64_t step : s.steps) s.checkpoints.push_back(revision_path(run, step));
  if (s.steps.empty())
    fail(run, " has no snapshots (", how_to_make_snapshots(), ") and no revision subdirectories (step0, step1000, ... each with a config.json)");
  const std::string final_path = run + "/checkpoint.safetensors";
  if (!s.revisions && file_exists(final_path)) {
    const int64_t last = checkpoint_step(final_path);
    if (std::find(s.steps.begin(), s.steps.end(), last) == s.steps.end()) {
      // a run stopped early may hold snapshots written after its checkpoint: keep the steps in order
      const auto at = std::upper_bound(s.steps.begin(), s.steps.end(), last) - s.steps.begin();
      s.steps.insert(s.steps.begin() + at, last);
      s.checkpoints.insert(s.checkpoints.begin() + at, final_path);
    }
  }
  return s;
}

ScoresOverTraining scores_over_training(const std::string& run, const std::string& analysis, const HeadScoreOptions& o,
                                        const std::function<void(size_t, size_t, int64_t)>& progress) {
  ScoresOverTraining s;
  s.run = run;
  s.analysis = analysis;
  s.score_names = head_analysis(analysis).scores;  // a bad name fails before anything is read
  RunSteps rs = run_steps(run);
  const bool revisions = rs.revisions;
  s.steps = std::move(rs.steps);
  s.checkpoints = std::move(rs.checkpoints);
  s.values.assign(s.score_names.size(), {});
  const std::string run_args = stored_run_args(run);
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const SafetensorsFile f = read_checkpoint(s.checkpoints[i]);
    if (!revisions) {  // a revision holds no train state: its step is its name
      if (const int64_t stored = checkpoint_step(f, s.checkpoints[i]); stored != s.steps[i])
        fail(s.checkpoints[i], ": holds the weights of step ", stored, ", not of step ", s.steps[i], " (a renamed or copied file)");
      check_same_run(f, s.checkpoints[i], run_args, run);
    }
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

std::string scores_over_training_json(const ScoresOverTraining& s, const HeadScoreOptions& o) {
  nlohmann::json j = {{"run", s.run}, {"analysis", s.analysis}, {"steps", s.steps}, {"checkpoints", s.checkpoints},
                      {"layers", s.layers}, {"heads", s.heads}, {"examples", o.examples}, {"seed", o.seed}};
  for (size_t k = 0; k < s.score_names.size(); ++k) {
    nlohmann::json per_step = nlohmann::json::array();  // [step][layer][head], NaN as null
    for (size_t i = 0; i < s.steps.size(); ++i) {
      nlohmann::json grid = nlohmann::json::array();
      for (int l = 0; l < s.layers; ++l) {
        nlohmann::json row = nlohmann::json::array();
        for (int h = 0; h < s.heads; ++h) {
          const double v = s.at(k, i, l, h);
          row.push_back(std::isnan(v) ? nlohmann::json() : nlohmann::json(v));
        }
        grid.push_back(row);
      }
      per_step.push_back(grid);
    }
    j["scores"][s.score_names[k]] = per_step;
  }
  return j.dump(1) + "\n";
}

std::string over_training_dir(const std::string& run, const std::string& analysis) {
  return run + "/over_training/" + analysis;
}

void write_scores_over_training_files(const std::string& dir, const ScoresOverTraining& s, const HeadScoreOptions& o) {
  const std::string stem = dir + "/" + s.analysis + "_over_training";
  write_file_atomic(stem + ".csv", scores_over_training_csv(s));
  write_file_atomic(stem + ".json", scores_over_training_json(s, o));
}

}  // namespace hl
