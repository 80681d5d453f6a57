// Head-count sweeps as a library: one training run per (head count, seed) with everything
// else fixed, each in OUT/runs/H<h>-seed<s>/ so an interrupted sweep continues (finished runs
// are read back, an unfinished one resumes from its checkpoint; runs made with other settings
// are refused, or recomputed with force). Returns the runs as data; `headlab ablate` prints and
// plots them, and C++ (or Python) callers can use them directly.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "analysis/intervals.h"
#include "analysis/matching.h"
#include "train/trainer.h"

namespace hl {

struct SweepOptions {
  std::vector<int> head_counts = {1, 2, 4, 8, 16};
  int seeds = 3;                        // seeds base.seed, base.seed + 1, ...
  std::string policy = "fixed-d-model"; // or "fixed-d-head": d_model = heads x fixed_d_head
  int64_t fixed_d_head = 8;
  bool force = false;                   // recompute runs made with other settings
  // the mechanisms each run formed: detector scores of its heads on the probe (role_examples
  // sequences), a head taking the role of the detector scoring at least role_threshold
  int role_examples = 100;
  double role_threshold = 0.4;
};

struct SweepRun {
  int heads = 0;
  uint64_t seed = 0;
  int64_t d_head = 0, params = 0;
  double loss = 0, token_acc = 0, exact = 0, ar_exact = 0, train_s = 0, peak_bytes = 0;
  int64_t first_99 = -1;  // first eval step with token accuracy >= 99%, or -1
  bool reused = false;    // read back from an earlier invocation
  std::vector<std::pair<int64_t, EvalResult>> curve;
  // Mechanisms: its heads' detector scores (RUN/roles.json) and roles; its heads matched by
  // attention pattern to those of the first seed's run of the same head count (none for that run).
  HeadRoleScores roles;
  std::vector<std::vector<std::string>> role;  // [layer][head]: detector name or "none"
  bool matched = false;                         // matched to the first seed's run
  double match_similarity = 0;                  // mean over the matched pairs
  int match_pairs = 0, match_same_role = 0;     // pairs, and pairs whose heads share a role
  int heads_with_role(const std::string& r) const;
};

struct SweepObserver {
  // during a run: its index (1-based) of `total`, its arguments, the step reached and the loss
  std::function<void(int index, int total, const TrainArgs& run, int64_t step, float loss)> on_step;
  std::function<void(int index, int total, const SweepRun& run)> on_run;  // after each run
};

// The regime that separates head counts (ablate and prune start from it): variable-length copy
// (varcopy), d_model 32, 2 layers, d_ff 128, batch 64, lr 3e-3 cosine with 100 warmup steps, 600 steps.
void set_experiment_defaults(TrainArgs& a);

// mean, smallest and largest over the seeds of a head count, and the mean's 95% t-interval
// (undefined for one seed; summarize_sweep clips it to the metric's range: losses >= 0,
// accuracies in [0, 1])
struct Spread {
  double mean = 0, lo = 0, hi = 0;
  Interval ci95{NAN, NAN};
};
// with the interval clipped to [lo_bound, hi_bound] (see t_interval95)
Spread spread(const std::vector<double>& v, double lo_bound = -INFINITY, double hi_bound = INFINITY);

// One head count of a sweep: its runs summarised over the seeds.
struct HeadCountSummary {
  int heads = 0;
  int64_t d_head = 0, params = 0;
  int runs = 0;
  Spread loss, perplexity, token_acc, exact, ar_exact, train_s, peak_bytes;
  std::vector<double> first_99;  // first step at 99% token accuracy, of the runs that reached it
  double time_rel = 0, memory_rel = 0;  // train_s and peak_bytes means over those of the first head count
  // held-out curves over training: (step, loss spread, token-accuracy spread), steps of the first seed
  std::vector<int64_t> curve_steps;
  std::vector<Spread> curve_loss, curve_acc;
  // mechanisms: per detector, the runs (seeds) in which at least one head took that role
  // ("induction head formed: 4/5 seeds"), and the heads with it over all runs; the matching of
  // each later seed's heads to the first seed's: mean similarity and pairs sharing a role
  std::vector<std::string> detectors;
  std::vector<int> runs_with_role, heads_with_role;
  Spread match_similarity;
  int match_pairs = 0, match_same_role = 0;
};
// Per head count, in the order of `head_counts` (each must have at least one run).
std::vector<HeadCountSummary> summarize_sweep(const std::vector<SweepRun>& runs, const std::vector<int>& head_counts);

// A finished run read back from its summary.json and metrics.jsonl (final metrics and curve);
// fails naming `dir` when they are unreadable.
// A run whose files cannot be read fails naming the run and the cause, then `remedy` (a study's
// --force recomputes it; compare has nothing to recompute).
SweepRun read_finished_run(const std::string& dir, int heads, uint64_t seed,
                           const std::string& remedy = "rerun with --force to recompute it");

// The detector scores of the heads of the finished run in `dir` (its model.safetensors), kept
// in dir/roles.json: read back when it is there (and made with the same probe), else computed
// and written.
HeadRoleScores run_head_roles(const std::string& dir, int examples);
// Fills each run's roles and its matching to the first seed's run of its head count (runs of
// one head count in seed order, as run_head_count_sweep returns them; `dirs` their directories).
void record_mechanisms(std::vector<SweepRun>& runs, const std::vector<std::string>& dirs, const SweepOptions& o);

// The arguments of run (heads h, seed index s) of a sweep into `out`.
TrainArgs sweep_run_args(const TrainArgs& base, const SweepOptions& o, const std::string& out, int h, int s);
// Checks the options and every run's resources before anything is created.
void check_sweep(const TrainArgs& base, const SweepOptions& o, const std::string& out);
// Runs (or reads back) every run, in head-count order then seed order, with their mechanisms
// (record_mechanisms). Throws Interrupted after
// writing the interrupted run's checkpoint and summary (rerunning continues it).
// With a group of several ranks (an MPI job) the runs left to do are shared among the ranks,
// each rank taking the next one as it becomes free; every run is trained alone as in a single
// process, so the results are the same bits. Rank 0 gets every run back (and writes the files of
// runs made on other machines into its own copy of `out` when it does not see them), the other
// ranks an empty vector.
std::vector<SweepRun> run_head_count_sweep(const TrainArgs& base, const SweepOptions& o, const std::string& out,
                                           const SweepObserver& obs = {}, ProcessGroup* group = nullptr);

}  // namespace hl
