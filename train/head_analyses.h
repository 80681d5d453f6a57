// The per-head analyses as a registry (as tasks are): one row per analysis with its name, the
// command that runs it, the scores it gives, its defaults and the function. The commands' --run,
// `headlab scores`, Python's scores_over_training and head_analyses, and the page's
// over-training panel read this table instead of naming analyses one by one: adding an analysis
// is its analysis/ files and one row here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/heads.h"
#include "analysis/patching.h"
#include "datasets/task.h"
#include "lib/safetensors.h"
#include "models/transformer.h"

namespace hl {

// What every analysis's function may read; each row uses its own fields (documented on the row).
struct HeadScoreOptions {
  int examples = 200;  // sequences (patch: rows of its one batch; importance: held-out rows)
  uint64_t seed = 1234;
  // detect: probe, fixed-probe or task; patch: probe or task; empty: the command's default (detect's
  // probe, patch's task)
  std::string data = "probe";
  int length = 0;              // detect: the probe's longest block; 0 = min(16, max_seq_len / 2)
  int bos = -1;                // detect --data probe: a first token of every row; -1 = none
  bool exclude_bos = false, exclude_current = false;  // detect
  bool normalize = false;                             // importance: per layer by its l2 norm
  Corruption corruption = Corruption::Source;         // patch: which token each row's corrupted copy changes
  TaskConfig fallback_task = TaskConfig::preset("copy");  // for a checkpoint that names no task
  int threads = 2;
};

// One checkpoint's model and its task, made when a row first asks for it.
struct HeadAnalysisInput {
  TransformerLM& model;
  const std::function<const Task&()>& task;
  const std::string& source;  // the checkpoint's name in messages
  const HeadScoreOptions& o;
};

struct HeadAnalysis {
  std::string name;                 // "detect": --run's and Python's name
  std::string command;              // the command whose --run gives it ("importance": prune)
  std::vector<std::string> scores;  // the grids it returns, in order: CSV columns, Python's keys
  std::string help;                 // one line: what the scores are
  std::function<int()> default_examples;
  std::function<std::vector<HeadGrid>(const HeadAnalysisInput&)> run;  // one (layers, heads) grid per score
};

// Every row, in the order the page and the help list them.
const std::vector<HeadAnalysis>& head_analyses();
// The row called `name`; fails listing the names.
const HeadAnalysis& head_analysis(const std::string& name);
std::vector<std::string> head_analysis_names();

// detect's sequences for a model (the probe, the fixed probe or the task's held-out rows): the
// same for every checkpoint of one architecture; fails naming the flag for a bad --length / --bos.
std::vector<Batch> detector_data(const ModelConfig& cfg, const HeadScoreOptions& o, const std::function<const Task&()>& task);

// The rows patch, edges and qk run on: o.examples rows of the repeat probe (any model: blocks of up to
// o.length tokens repeated, the answer the second copy; o.data "probe") or of the task's held-out
// rows ("task"), one token of each corrupted (o.corruption). patching_sequence_length: their
// length, known before they are made (for a memory estimate). Fails naming --length / --data.
int64_t patching_sequence_length(const ModelConfig& cfg, const HeadScoreOptions& o, const std::function<const Task&()>& task);
PatchingInputs patching_inputs(const ModelConfig& cfg, const HeadScoreOptions& o, const std::function<const Task&()>& task);

// patch over training: below this difference between the clean and the corrupted run's logit
// difference the restored fraction is not computed (NaN, an empty CSV cell).
constexpr double kLeastPatchingGap = 0.05;

struct HeadScores {
  std::vector<std::string> names;
  std::vector<HeadGrid> grids;  // per name: (layers, heads)
};
// One checkpoint's scores of `analysis` (file: its checkpoint, `source` its name in messages).
HeadScores head_scores(const std::string& analysis, const SafetensorsFile& file, const std::string& source,
                       const HeadScoreOptions& o);

}  // namespace hl
