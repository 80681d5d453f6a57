// Which heads matter, as one study: single-head ablation (zero and mean), Michel et al.
// importance, attention statistics, and accuracy as heads are removed in three orders
// (importance, single-head ablation, random); or, with method "l0", hard-concrete gates fine-tuned
// at one lambda or at lambdas searched for a target head count. Trains its own base model in
// OUT/base when no checkpoint is given. Resumable: the base run and each finished curve are kept
// in OUT (curves/*.json) and reused only with the same settings (OUT/prune_settings.json).
// Returns the numbers and the pruned models; `headlab prune` writes the tables, CSV, JSON, plots
// and checkpoints.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/heads.h"
#include "train/l0.h"
#include "train/settings.h"
#include "train/trainer.h"

namespace hl {

struct PruneStudyOptions {
  std::string method = "michel";  // or "l0"
  // the base model trained in OUT/base when no checkpoint is given (with the study's TrainArgs)
  int base_heads = 8;
  int64_t train_steps = 1500;
  // method michel
  double step_fraction = 0.1;  // of all heads removed per step
  bool recompute = false;      // importance recomputed after each step
  bool normalize = false;      // importance divided per layer by its l2 norm
  int min_per_layer = 0;
  int finetune_steps = 0;      // fine-tuning between pruning steps
  float finetune_lr = 1e-3f;
  int random_seeds = 3;        // random orders (the baseline)
  double save_fraction = 0.5;  // the importance-pruned model kept at this fraction
  // method l0
  double lambda = 0.05;  // weight of the expected open heads; the start of the search with target_heads
  int target_heads = 0;  // search lambda until this many heads stay open; 0 = lambda alone
  int l0_steps = 300;    // fine-tuning steps per lambda
  bool force = false;    // recompute results in OUT made with other settings (default: refuse)

  void validate() const;  // the table's ranges and choices, then what depends on two options
};
// Every option of the study, with its flag, help and range.
const std::vector<OptionSetting<PruneStudyOptions>>& prune_study_settings();

// What the study reports while it works (all optional).
struct PruneObserver {
  std::function<void(int heads, int64_t steps, const std::string& dir, bool already_trained)> on_base_model;
  TrainObserver base_training;  // steps of the base training
  std::function<void(int layers, int heads, int eval_size)> on_model;  // once the model is loaded
  std::function<void(const std::string& stage)> on_stage;              // "importance and attention statistics"
  std::function<void(const L0Result&, int total_heads)> on_l0_run;
};

struct PruneStudy {
  std::string method, checkpoint;  // the model analysed (OUT/base/model.safetensors by default)
  TaskConfig task;                 // the task it was trained on
  int layers = 0, heads = 0;

  // method michel
  AblationResult ablation;  // .base: the unpruned model's held-out loss and accuracy
  HeadGrid importance, importance_ci95_lo, importance_ci95_hi;  // 95% bootstrap interval over the examples
  HeadStats stats;
  // "importance", "ablation", "random0", "random1", ...: held-out metrics after each pruning step
  std::map<std::string, std::vector<PruneStep>> curves;
  std::unique_ptr<TransformerLM> pruned;  // heads removed by importance up to save_fraction
  int removed = 0;                        // how many

  // method l0
  std::vector<L0Result> l0_runs;  // in the order tried
  size_t l0_best = 0;             // the target's head count (or the closest above it), else the last
  std::unique_ptr<TransformerLM> l0_model;  // the gated model of l0_runs[l0_best]
  std::vector<std::pair<int, int>> by_importance;  // (layer, head), most important first

  std::unique_ptr<DirLock> lock;  // OUT stays locked while the result is in use
};

// Runs the study into `out` (made and marked "prune"). `base` holds the training and evaluation
// settings (eval_size, eval_seed, batch, seed, threads). Throws Interrupted while training the
// base model after writing its checkpoint and summary (rerunning continues it).
PruneStudy run_prune_study(TrainArgs base, const PruneStudyOptions& o, const std::string& checkpoint,
                           const std::string& out, const PruneObserver& obs = {});

// A pruning curve as stored in OUT/curves/NAME.json and prune.json, and back.
nlohmann::json prune_curve_json(const std::vector<PruneStep>& curve);
std::vector<PruneStep> prune_curve_from_json(const nlohmann::json& j);

}  // namespace hl
