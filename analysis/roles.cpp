#include "analysis/roles.h"

#include <algorithm>

#include "analysis/intervals.h"
#include "lib/fileutil.h"
#include "lib/stop.h"

namespace hl {

DetectorIntervals detect_with_intervals(TransformerLM& model, const std::vector<Batch>& data,
                                        const std::vector<Detector>& kinds, const DetectorOptions& opt,
                                        const std::vector<float>& pattern, int64_t pattern_T) {
  std::vector<std::vector<HeadGrid>> each;
  DetectorIntervals r;
  r.score = detect_heads(model, data, kinds, opt, pattern, pattern_T, &each);
  r.lo = r.hi = r.score;
  for (size_t k = 0; k < r.score.size(); ++k)
    for (size_t l = 0; l < r.score[k].size(); ++l)
      for (size_t h = 0; h < r.score[k][l].size(); ++h) {
        throw_if_stopped();  // 2000 resamples of every sequence's score: seconds for many sequences
        std::vector<double> v;
        for (const HeadGrid& g : each[k]) v.push_back(g[l][h]);
        const Interval ci = bootstrap_interval95(v, 2000, 1 + 131 * l + h);
        r.lo[k][l][h] = ci.lo, r.hi[k][l][h] = ci.hi;
      }
  return r;
}

HeadRoles head_roles(TransformerLM& model, const Task& task, const HeadRolesOptions& o) {
  HeadRoles r;
  const ModelConfig& cfg = model.cfg;
  // probe rows no longer than the task's: positions the model never trained on stay out
  const int k = static_cast<int>(std::min<int64_t>({16, cfg.max_seq_len / 2, task.seq_len() / 2}));
  const std::vector<Batch> probe = varied_repeat_probe(o.probe_examples, k, static_cast<int>(cfg.vocab_size), o.seed);
  r.probe_rows = o.probe_examples;
  const std::vector<Detector> kinds = {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction};
  for (Detector d : kinds) r.detectors.push_back(to_string(d));
  DetectorIntervals scores = detect_with_intervals(model, probe, kinds, {});
  r.score = std::move(scores.score), r.ci95_lo = std::move(scores.lo), r.ci95_hi = std::move(scores.hi);
  check_fits_in_memory(patching_memory_bytes(cfg, o.patch_examples, task.seq_len()),
                       std::to_string(o.patch_examples) + " patching rows of " + std::to_string(task.seq_len()) + " tokens");
  const std::vector<Batch> held = task.held_out(o.patch_examples, o.seed, o.patch_examples);
  const PatchingInputs in = corrupt_one_symbol(held[0], task.symbols(), o.seed);
  r.patch = activation_patching(model, in);
  r.patch_rows = static_cast<int>(in.answers.size());
  for (int l = 0; l + 1 < cfg.n_layers; ++l) r.compose.push_back(composition_scores(model, l, l + 1));
  r.baseline = composition_baseline(cfg);
  return r;
}

}  // namespace hl
