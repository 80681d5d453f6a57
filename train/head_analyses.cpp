#include "train/head_analyses.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "analysis/circuits.h"
#include "analysis/decompose.h"
#include "analysis/detectors.h"
#include "lib/fileutil.h"
#include "lib/parallel.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/sweep.h"
#include "train/trainer.h"

namespace hl {

namespace {

std::vector<HeadGrid> detect_scores(const HeadAnalysisInput& in) {
  const std::vector<Batch> data = detector_data(in.model.cfg, in.o, in.task);
  const DetectorOptions opt{in.o.exclude_bos, in.o.exclude_current};
  // all three detectors from one forward per batch
  return detect_heads(in.model, data, {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction}, opt);
}

std::vector<HeadGrid> patch_scores(const HeadAnalysisInput& in) {
  const HeadScoreOptions& o = in.o;
  const int64_t T = patching_sequence_length(in.model.cfg, o, in.task);
  check_fits_in_memory(patching_memory_bytes(in.model.cfg, o.examples, T),
                       "--examples " + std::to_string(o.examples) + " of " + std::to_string(T) + " tokens");
  const PatchingResult p = activation_patching(in.model, patching_inputs(in.model.cfg, o, in.task));
  std::vector<HeadGrid> grids = {p.z_exact, p.z_attribution};
  // The restored fraction divides by the corruption's effect; before the model has learnt the
  // task that effect is ~0 (step 0: 0.0255 vs 0.0250) and the fraction is noise: left empty.
  if (std::fabs(p.clean_metric - p.corrupted_metric) < kLeastPatchingGap)
    for (HeadGrid& g : grids)
      for (auto& row : g) std::fill(row.begin(), row.end(), std::numeric_limits<double>::quiet_NaN());
  return grids;
}

std::vector<HeadGrid> importance_scores(const HeadAnalysisInput& in) {
  const std::vector<Batch> data = in.task().held_out(in.o.examples, in.o.seed, 128);
  std::vector<HeadGrid> each;  // as prune computes it (with each example's, for its intervals)
  return {head_importance(in.model, data, in.o.normalize, &each)};
}

std::vector<HeadGrid> dla_scores(const HeadAnalysisInput& in) {
  const ModelConfig& cfg = in.model.cfg;
  if (cfg.norm != Norm::Pre)
    fail("dla needs a pre-norm model: ", in.source, " is post-norm (its residual stream is normalised after each block, "
         "so it is not a sum of components)");
  const DlaResult d = direct_logit_attribution(in.model, in.task().held_out(in.o.examples, in.o.seed, 64));
  HeadGrid g(static_cast<size_t>(cfg.n_layers), std::vector<double>(static_cast<size_t>(cfg.n_heads), 0.0));
  for (size_t c = 0; c < d.labels.size(); ++c) {
    if (d.head[c] < 0) continue;
    double s = 0;  // the mean over the rows, as dla's table gives it
    for (double x : d.per_row[c]) s += x;
    g[static_cast<size_t>(d.layer[c])][static_cast<size_t>(d.head[c])] =
        d.per_row[c].empty() ? 0.0 : s / static_cast<double>(d.per_row[c].size());
  }
  return {g};
}

std::vector<HeadGrid> compose_scores(const HeadAnalysisInput& in) {
  const size_t L = static_cast<size_t>(in.model.cfg.n_layers), H = static_cast<size_t>(in.model.cfg.n_heads);
  if (L < 2) fail(in.source, ": composition needs at least 2 layers, the model has ", L);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<HeadGrid> grids(3, HeadGrid(L, std::vector<double>(H, nan)));
  for (size_t l = 1; l < L; ++l) {
    const CompositionScores c = composition_scores(in.model, static_cast<int>(l - 1), static_cast<int>(l));
    const std::vector<std::vector<double>>* qkv[3] = {&c.q, &c.k, &c.v};
    for (size_t k = 0; k < 3; ++k)
      for (size_t b = 0; b < H; ++b) {  // [a][b]: head a of layer l - 1 into head b of layer l
        double best = -std::numeric_limits<double>::infinity();
        for (size_t a = 0; a < H; ++a) best = std::max(best, (*qkv[k])[a][b]);
        grids[k][l][b] = best;
      }
  }
  return grids;
}

}  // namespace

const std::vector<HeadAnalysis>& head_analyses() {
  static const std::vector<HeadAnalysis> rows = {
      {"detect", "detect", {"previous_token", "duplicate_token", "induction"},
       "share of attention on the pattern, detect's probe", [] { return 200; }, detect_scores},
      {"patch", "patch", {"exact", "attribution"},
       "activation / attribution patching of hook_z, restored fraction", [] { return 64; }, patch_scores},
      {"importance", "prune", {"importance"}, "Michel et al.'s head importance on the task's held-out rows",
       [] {
         TrainArgs a;
         set_experiment_defaults(a);  // prune's regime
         return a.eval_size;
       },
       importance_scores},
      {"dla", "dla", {"dla"}, "mean direct logit attribution of the answer token", [] { return 200; }, dla_scores},
      {"compose", "compose", {"q_composition", "k_composition", "v_composition"},
       "the largest score into the head from a head of the layer before; NaN in layer 0", [] { return 200; },
       compose_scores},
  };
  return rows;
}

std::vector<std::string> head_analysis_names() {
  std::vector<std::string> n;
  for (const HeadAnalysis& a : head_analyses()) n.push_back(a.name);
  return n;
}

const HeadAnalysis& head_analysis(const std::string& name) {
  for (const HeadAnalysis& a : head_analyses())
    if (a.name == name) return a;
  std::string list;
  for (const HeadAnalysis& a : head_analyses()) list += (list.empty() ? "" : ", ") + a.name;
  fail("analysis '", name, "' is not one of ", list);
}

std::vector<Batch> detector_data(const ModelConfig& cfg, const HeadScoreOptions& given, const std::function<const Task&()>& task) {
  HeadScoreOptions o = given;
  if (o.data.empty()) o.data = "probe";
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

namespace {
bool patches_the_probe(const HeadScoreOptions& o) {
  if (o.data != "probe" && o.data != "task" && !o.data.empty()) fail("--data must be probe or task for patching, got '", o.data, "'");
  if (o.bos >= 0) fail("--bos applies to detect's probe, not to patching's");
  return o.data == "probe";
}
int probe_block(const ModelConfig& cfg, const HeadScoreOptions& o) {
  const int k = o.length > 0 ? o.length : static_cast<int>(std::min<int64_t>(16, cfg.max_seq_len / 2));
  if (2 * k > cfg.max_seq_len) fail("--length ", k, ": the probe's ", 2 * k, " tokens exceed the model's max_seq_len ", cfg.max_seq_len);
  return k;
}
// The probe's batches (up to 64 rows each) as one batch: patching runs every row at once.
Batch concat_rows(const std::vector<Batch>& parts) {
  Batch all = parts.at(0);
  for (size_t i = 1; i < parts.size(); ++i) {
    const Batch& b = parts[i];
    all.inputs.data.insert(all.inputs.data.end(), b.inputs.data.begin(), b.inputs.data.end());
    all.targets.data.insert(all.targets.data.end(), b.targets.data.begin(), b.targets.data.end());
    all.prompt_len.insert(all.prompt_len.end(), b.prompt_len.begin(), b.prompt_len.end());
  }
  const int64_t n = static_cast<int64_t>(all.prompt_len.size()), T = all.inputs.shape[1];
  all.inputs.shape = all.targets.shape = Shape{n, T};
  return all;
}
}  // namespace

int64_t patching_sequence_length(const ModelConfig& cfg, const HeadScoreOptions& o, const std::function<const Task&()>& task) {
  return patches_the_probe(o) ? 2 * probe_block(cfg, o) : task().seq_len();
}

PatchingInputs patching_inputs(const ModelConfig& cfg, const HeadScoreOptions& o, const std::function<const Task&()>& task) {
  if (patches_the_probe(o)) {
    const int vocab = static_cast<int>(cfg.vocab_size);
    return corrupt_one_symbol(concat_rows(varied_repeat_probe(o.examples, probe_block(cfg, o), vocab, o.seed)), vocab, o.seed,
                              o.corruption);
  }
  const Task& t = task();
  return corrupt_one_symbol(t.held_out(o.examples, o.seed, o.examples)[0], t.symbols(), o.seed, o.corruption);
}

HeadScores head_scores(const std::string& analysis, const SafetensorsFile& file, const std::string& source,
                       const HeadScoreOptions& o) {
  const HeadAnalysis& a = head_analysis(analysis);
  set_num_threads(o.threads);
  std::unique_ptr<TransformerLM> model = load_model(file);
  const TaskConfig tc = checkpoint_task(file, o.fallback_task);
  std::unique_ptr<Task> task_store;
  const std::function<const Task&()> task = [&]() -> const Task& {  // made when an analysis needs the task's rows
    if (!task_store) task_store = task_for_model(model->cfg, tc, source, analysis == "detect" || analysis == "patch" ? "--data probe" : "");
    return *task_store;
  };
  HeadScores r{a.scores, a.run({*model, task, source, o})};
  if (r.grids.size() != r.names.size())
    fail("analysis ", a.name, " returned ", r.grids.size(), " grids for its ", r.names.size(), " scores");
  return r;
}

}  // namespace hl
