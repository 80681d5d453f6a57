#include "train/induction_study.h"

#include <algorithm>

#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/run_dir.h"
#include "train/sweep.h"

namespace hl {

namespace {

// Trains seed `a.seed` into a.out, or reads it back when it is finished.
void train_or_read(InductionRun& r, TrainArgs a, const InductionStudyOptions& o, const InductionObserver& obs, int index,
                   int total) {
  reuse_only_if_same_settings(a.out, a, o.force, "--force");
  const bool done = run_finished(a.out);
  if (obs.on_run_start) obs.on_run_start(index, total, a.seed, done);
  if (!done) train_to_end(a, obs.training);
  const SweepRun back = read_finished_run(a.out, a.model.n_heads, a.seed);
  r.final_eval.loss = back.loss, r.final_eval.token_acc = back.token_acc, r.final_eval.exact_match = back.exact;
  r.final_eval.ar_exact_match = back.ar_exact;
  r.curve = back.curve;
}

void summarize(InductionRun& r) {
  const HeadRoles& h = r.roles;
  for (double v : h.score[0][0]) r.previous_token_best = std::max(r.previous_token_best, v);  // layer 0
  for (size_t l = 1; l < h.score[2].size(); ++l)
    for (double v : h.score[2][l]) r.induction_best = std::max(r.induction_best, v);
  if (!h.compose.empty())
    for (const auto& row : h.compose[0].k)
      for (double v : row) r.k_composition_best = std::max(r.k_composition_best, v);
  for (const auto& [step, e] : r.curve)
    if (e.token_acc >= 0.5) {
      r.phase_step = step;
      break;
    }
}

}  // namespace

InductionStudy run_induction_study(const TrainArgs& base, const InductionStudyOptions& o, const std::string& out,
                                   const InductionObserver& obs) {
  if (base.task.name != "induction") fail("the induction study trains --task induction, got --task ", base.task.name);
  if (o.seeds < 1) fail("--seeds must be at least 1, got ", o.seeds);
  if (base.model.n_layers < 2) fail("--layers ", base.model.n_layers, ": the induction circuit needs at least 2 layers");
  base.validate();
  std::vector<TrainArgs> runs;
  for (int s = 0; s < o.seeds; ++s) {
    TrainArgs a = base;
    a.seed = base.seed + static_cast<uint64_t>(s);
    a.out = out + "/seed-" + std::to_string(a.seed);
    check_training_resources(a);  // every seed before anything is made
    runs.push_back(a);
  }
  InductionStudy st;
  claim_output_dir(out, "study");
  st.lock = std::make_unique<DirLock>(out);
  std::vector<double> prev, ind, acc, kc;
  for (int i = 0; i < o.seeds; ++i) {
    InductionRun r;
    r.seed = runs[i].seed;
    r.dir = runs[i].out;
    train_or_read(r, runs[i], o, obs, i + 1, o.seeds);
    set_num_threads(runs[i].threads);
    const std::unique_ptr<TransformerLM> model = load_model(r.dir + "/model.safetensors");
    const std::unique_ptr<Task> task = make_task(runs[i].task);
    r.roles = head_roles(*model, *task, o.roles);
    summarize(r);
    prev.push_back(r.previous_token_best), ind.push_back(r.induction_best);
    acc.push_back(r.final_eval.token_acc), kc.push_back(r.k_composition_best);
    st.formed += r.formed();
    if (obs.on_run) obs.on_run(r);
    st.runs.push_back(std::move(r));
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  st.previous_token_mean = mean(prev), st.induction_mean = mean(ind), st.token_acc_mean = mean(acc), st.k_composition_mean = mean(kc);
  // scores and accuracies live in [0, 1]
  st.previous_token = t_interval95(prev, 0, 1), st.induction = t_interval95(ind, 0, 1);
  st.token_acc = t_interval95(acc, 0, 1), st.k_composition = t_interval95(kc, 0, 1);
  return st;
}

}  // namespace hl
