// Heads over training: one analysis's per-head scores (a row of train/head_analyses.h) at every
// snapshot of a run (and its final checkpoint), on the same inputs at every step. `headlab
// detect|patch|dla|compose|prune|scores --run RUN` and Python's scores_over_training come here, and
// write what `headlab view RUN`'s over-training panel reads with write_scores_over_training_files.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/safetensors.h"
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
// The checkpoints of a run directory in step order: its snapshots and its final checkpoint (unless
// a snapshot holds its step), or a model's downloaded revisions (stepN subdirectories, each a
// Hugging Face directory). Fails for a directory with neither, saying how to keep snapshots.
struct RunCheckpoints {
  std::string run;
  std::vector<int64_t> steps;       // ascending
  std::vector<std::string> files;   // the checkpoint (or revision directory) of each step
  bool revisions = false;           // stepN subdirectories: no train state to check
  std::string run_args;             // the run's stored arguments, what each snapshot must match
};
RunCheckpoints run_checkpoints(const std::string& run);
// The checkpoint of step r.steps[i], read and checked to hold that step of this run (a snapshot
// copied in from another run or renamed is refused).
SafetensorsFile read_run_checkpoint(const RunCheckpoints& r, size_t i);

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
