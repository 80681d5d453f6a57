// Heads over training: one analysis's per-head scores at every snapshot of a run (and its final
// checkpoint), on the same inputs at every step. `headlab detect|patch|dla|compose|prune --run RUN`
// and Python's scores_over_training come here; the single-checkpoint commands compute each
// checkpoint's scores with the same head_scores.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/heads.h"
#include "datasets/task.h"
#include "lib/safetensors.h"

namespace hl {

// The analyses with per-head scores, and the scores each gives (in this order):
//   detect:     previous_token, duplicate_token, induction (share of attention on the pattern, detect's probe)
//   patch:      exact, attribution (activation / attribution patching of hook_z, restored fraction)
//   importance: importance (Michel et al.'s head importance on the task's held-out rows)
//   dla:        dla (mean direct logit attribution of the answer token)
//   compose:    q_composition, k_composition, v_composition (the largest score into the head from a head
//               of the layer before; NaN in layer 0, which has none)
const std::vector<std::string>& over_training_analyses();
std::vector<std::string> head_score_names(const std::string& analysis);

// The command's default number of sequences: detect, dla and compose 200, patch 64, importance
// prune's --eval-size.
int default_examples(const std::string& analysis);

struct HeadScoreOptions {
  int examples = 200;  // sequences (patch: rows of its one batch; importance: held-out rows)
  uint64_t seed = 1234;
  std::string data = "probe";  // detect: probe, fixed-probe or task
  int length = 0;              // detect: the probe's longest block; 0 = min(16, max_seq_len / 2)
  int bos = -1;                // detect --data probe: a first token of every row; -1 = none
  bool exclude_bos = false, exclude_current = false;  // detect
  bool normalize = false;                             // importance: per layer by its l2 norm
  TaskConfig fallback_task = TaskConfig::preset("copy");  // for a checkpoint that names no task
  int threads = 2;
};

// detect's sequences for a model (the probe, the fixed probe or the task's held-out rows): the
// same for every checkpoint of one architecture; fails naming the flag for a bad --length / --bos.
std::vector<Batch> detector_data(const ModelConfig& cfg, const HeadScoreOptions& o, const std::function<const Task&()>& task);

struct HeadScores {
  std::vector<std::string> names;
  std::vector<HeadGrid> grids;  // per name: (layers, heads)
};
// One checkpoint's scores of `analysis` (file: its checkpoint, `source` its name in messages).
HeadScores head_scores(const std::string& analysis, const SafetensorsFile& file, const std::string& source,
                       const HeadScoreOptions& o);

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
// The scores at every snapshot of `run` and at its final checkpoint (checkpoint.safetensors,
// unless a snapshot holds its step). Fails for a run without snapshots, saying how to keep them.
// progress(done, total, step) after each checkpoint.
ScoresOverTraining scores_over_training(const std::string& run, const std::string& analysis, const HeadScoreOptions& o,
                                        const std::function<void(size_t, size_t, int64_t)>& progress = {});
// step,layer,head,<one column per score> (full float precision; NaN as an empty field)
std::string scores_over_training_csv(const ScoresOverTraining& s);

}  // namespace hl
