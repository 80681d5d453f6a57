// Heads over training: one analysis's per-head scores (a row of train/head_analyses.h) at every
// snapshot of a run (and its final checkpoint), on the same inputs at every step. `headlab
// detect|patch|dla|compose|prune|scores --run RUN` and Python's scores_over_training come here, and
// write what `headlab view RUN`'s over-training panel reads with write_scores_over_training_files.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/head_analyses.h"

namespace hl {

struct ScoresOverTraining {
  std::string run, analysis;
  std::vector<int64_t> steps;             // ascending: every snapshot, then the final checkpoint's step
  std::vector<std::string> checkpoints;   // the file read at each step
  std::vector<std::string> score_names;
  int layers = 0, heads = 0;
  std::vector<std::vector<double>> values;  // [score]: (steps, layers, heads), row-major
  double at(size_t score, size_t step_index, int layer, int head) const {
    return values[score][(step_index * static_cast<size_t>(layers) + static_cast<size_t>(layer)) * static_cast<size_t>(heads) +
                         static_cast<size_t>(head)];
  }
};
// The models of a run over training: a headlab run's snapshots and its final checkpoint
// (checkpoint.safetensors, unless a snapshot holds its step), or a directory of a model's revisions
// (stepN subdirectories, the steps their names'). Fails for a directory with neither, saying how
// to keep snapshots.
struct RunSteps {
  std::vector<int64_t> steps;            // ascending
  std::vector<std::string> checkpoints;  // the file or directory of each step
  bool revisions = false;                // a revisions directory (no train state: a step is its name)
};
RunSteps run_steps(const std::string& run);

// The scores at every snapshot of `run` and at its final checkpoint (checkpoint.safetensors,
// unless a snapshot holds its step). Fails for a run without snapshots, saying how to keep them.
// progress(done, total, step) after each checkpoint.
ScoresOverTraining scores_over_training(const std::string& run, const std::string& analysis, const HeadScoreOptions& o,
                                        const std::function<void(size_t, size_t, int64_t)>& progress = {});
// step,layer,head,<one column per score> (full float precision; NaN as an empty field)
std::string scores_over_training_csv(const ScoresOverTraining& s);
// {run, analysis, steps, checkpoints, layers, heads, examples, seed, scores: {name: [step][layer][head]}}
// (NaN as null)
std::string scores_over_training_json(const ScoresOverTraining& s, const HeadScoreOptions& o);
// Where `headlab view RUN` looks for an analysis's scores over training: RUN/over_training/ANALYSIS.
std::string over_training_dir(const std::string& run, const std::string& analysis);
// dir/ANALYSIS_over_training.csv and .json, what the page's over-training panel reads (written
// atomically, each; `dir` must exist).
void write_scores_over_training_files(const std::string& dir, const ScoresOverTraining& s, const HeadScoreOptions& o);

}  // namespace hl
