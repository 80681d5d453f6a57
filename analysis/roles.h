// What the heads of one model do, in one call: the detectors (previous-token, duplicate-token,
// induction) on the probe position cannot fool with their bootstrap intervals, activation and
// attribution patching on the task's held-out rows, and Q/K/V composition between consecutive
// layers beside its random-weights baseline. `headlab detect`, `patch` and `compose` give each
// alone; the studies (headlab study) use this.
#pragma once
#include <string>
#include <vector>

#include "analysis/circuits.h"
#include "analysis/detectors.h"
#include "analysis/patching.h"

namespace hl {

struct HeadRoles {
  std::vector<std::string> detectors;  // "previous_token", "duplicate_token", "induction"
  std::vector<HeadGrid> score, ci95_lo, ci95_hi;  // per detector: (layers, heads), 95% bootstrap interval
  int probe_rows = 0;
  PatchingResult patch;
  int patch_rows = 0;
  std::vector<CompositionScores> compose;  // [l]: layer l into layer l + 1
  CompositionBaseline baseline;
};

struct HeadRolesOptions {
  int probe_examples = 200;  // detectors: sequences of the varied probe
  int patch_examples = 64;   // patching: held-out rows of the task
  uint64_t seed = 1234;
};

// Detectors' scores with the 95% bootstrap interval over the sequences (2000 resamples), all
// from one forward per batch: score[k], lo[k], hi[k] for kinds[k] (with `pattern`, a user's
// pattern's alone).
struct DetectorIntervals {
  std::vector<HeadGrid> score, lo, hi;
};
DetectorIntervals detect_with_intervals(TransformerLM& model, const std::vector<Batch>& data,
                                        const std::vector<Detector>& kinds, const DetectorOptions& opt,
                                        const std::vector<float>& pattern = {}, int64_t pattern_T = 0);

HeadRoles head_roles(TransformerLM& model, const Task& task, const HeadRolesOptions& o = {});

}  // namespace hl
