// The induction study as one call: trains --task induction in its regime (a 2-layer
// attention-only model; the task's preset) with several seeds, each in OUT/seed-S/, then finds
// what each model's heads do (detectors with intervals, patching, composition with its random
// baseline; analysis/roles.h) and how sure the numbers are across seeds (95% t-intervals).
// Resumable: a finished seed is read back, an interrupted one continues from its checkpoint;
// runs made with other settings are refused (or recomputed with force). `headlab study
// induction` writes the files and the pages.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/intervals.h"
#include "analysis/roles.h"
#include "train/trainer.h"

namespace hl {

struct InductionStudyOptions {
  int seeds = 5;  // base.seed, base.seed + 1, ...
  bool force = false;
  HeadRolesOptions roles;
};

struct InductionRun {
  uint64_t seed = 0;
  std::string dir;  // OUT/seed-S: the training run
  EvalResult final_eval;
  std::vector<std::pair<int64_t, EvalResult>> curve;
  HeadRoles roles;
  double previous_token_best = 0;  // the best previous-token score of a layer-0 head
  double induction_best = 0;       // the best induction score of a head in a later layer
  double k_composition_best = 0;   // the largest K-composition of a layer-0 head into layer 1
  int64_t phase_step = -1;         // first evaluation at >= 50% held-out token accuracy (-1: never)
  bool formed() const { return previous_token_best >= 0.5 && induction_best >= 0.4; }
};

struct InductionStudy {
  std::vector<InductionRun> runs;
  // over the seeds: mean and 95% t-interval (clipped to [0, 1])
  double previous_token_mean = 0, induction_mean = 0, token_acc_mean = 0, k_composition_mean = 0;
  Interval previous_token, induction, token_acc, k_composition;
  int formed = 0;  // seeds with the circuit (previous-token >= 0.5 and induction >= 0.4)
  std::unique_ptr<DirLock> lock;  // OUT stays locked while the result is in use
};

struct InductionObserver {
  std::function<void(int index, int total, uint64_t seed, bool already_trained)> on_run_start;
  TrainObserver training;
  std::function<void(const InductionRun&)> on_run;
};

// `base`: the training settings (its task must be induction). Throws Interrupted while a seed
// trains, after writing its checkpoint and summary (rerunning continues it).
InductionStudy run_induction_study(const TrainArgs& base, const InductionStudyOptions& o, const std::string& out,
                                   const InductionObserver& obs = {});

}  // namespace hl
