#include "train/run_plan.h"

#include <cstdio>
#include <type_traits>

#include "lib/fileutil.h"
#include "lib/threads.h"
#include "train/distributed.h"
#include "train/settings.h"
#include "train/snapshots.h"

// Rows leave trailing members (range, path) at their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace hl {

namespace {
#define FIELD(member) [](RunRequest& r) -> RunFieldRef { return &r.member; }
constexpr double kMany = 1e15;  // "no limit" in practice

std::vector<RunSetting> make_table() {
  // clang-format off
  return {
    {"--out", "Output directory (default: runs/train-<date>-<time>)", FIELD(out), NAN, NAN, true},
    {"--resume", "Continue the run in --out from its last checkpoint", FIELD(resume)},
    {"--init", "Start from the weights in this checkpoint, e.g. made in PyTorch; the model's architecture comes from it",
     FIELD(init), NAN, NAN, true},
    {"--log-grads", "Gradient atlas: every N steps log per-head gradient and weight norms of W_Q/W_K/W_V/W_O "
     "(grad_atlas.csv) and attention entropy; 0 = off", FIELD(log_grads), 0, kMany},
    {"--dump-grads-at", "Steps at which to dump every gradient (grads/step_N.safetensors) and per-head W_QK / W_OV "
     "singular values", FIELD(dump_grads_at), 1, kMany},
    {"--snapshot-at", "Steps at which to keep the run's full resume state (RUN/snapshots/step_NNNNNNNN.safetensors); "
     "0 = the initial weights", FIELD(snapshot_at), 0, kMany},
    {"--fork", "Counterfactual fork of this run (its directory) from its snapshot at --at, into --out: the same data "
     "order and RNG, settings from the snapshot; with --gate/--freeze/--reinit", FIELD(fork), NAN, NAN, true},
    {"--at", "The step of the snapshot --fork starts from", FIELD(at), 0, kMany},
    {"--fork-from", "Like --fork RUN --at STEP, from a file with the training state (a snapshot or checkpoint.safetensors)",
     FIELD(fork_from), NAN, NAN, true},
    {"--gate", "Fork: set a head's gate, LAYER.HEAD=VALUE (0 = the head's output removed); repeatable", FIELD(gate)},
    {"--freeze", "Fork: keep a head's W_Q/W_K/W_V rows and W_O columns exactly, LAYER.HEAD; repeatable", FIELD(freeze)},
    {"--reinit", "Fork: draw a head's weights again as at construction and reset their optimizer moments, LAYER.HEAD; "
     "repeatable", FIELD(reinit)},
  };
  // clang-format on
}
#undef FIELD

// A number of a row outside its range: "--at: value -1 is below 0", as the command line words ranges.
void check_range(const std::string& flag, int64_t v, double lo, double hi) {
  const std::string problem = range_problem(static_cast<double>(v), std::to_string(v), lo, hi);
  if (!problem.empty()) fail(flag, ": ", problem);
}
}  // namespace

std::string RunSetting::name() const {
  std::string n = flag.substr(2);
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

const std::vector<RunSetting>& run_settings() {
  static const std::vector<RunSetting> table = make_table();
  return table;
}

const RunSetting* find_run_setting(const std::string& flag_or_name) {
  for (const RunSetting& s : run_settings())
    if (s.flag == flag_or_name || s.name() == flag_or_name) return &s;
  return nullptr;
}

RunPlan plan_run(const TrainArgs& settings, const RunRequest& r) {
  const auto given = [&](const std::string& flag) { return r.given && r.given(flag); };
  // each number against its row's range; a list given empty as the command line refuses ""
  RunRequest values = r;
  for (const RunSetting& s : run_settings()) {
    if (!given(s.flag)) continue;
    const RunFieldRef f = s.field(values);
    const bool empty = std::visit(
        [](auto* v) {
          if constexpr (std::is_same_v<decltype(v), std::vector<int64_t>*> || std::is_same_v<decltype(v), std::vector<std::string>*>)
            return v->empty();
          return false;
        },
        f);
    if (empty) fail(s.flag, " is empty: give a value, or leave the flag out for its default");
    if (std::isnan(s.lo)) continue;
    if (auto* one = std::get_if<int64_t*>(&f)) check_range(s.flag, **one, s.lo, s.hi);
    if (auto* list = std::get_if<std::vector<int64_t>*>(&f))
      for (int64_t v : **list) check_range(s.flag, v, s.lo, s.hi);
  }
  // the combinations, each refused once, here
  const bool by_run = given("--fork"), by_file = given("--fork-from"), forking = by_run || by_file;
  if (by_run && by_file) fail("--fork and --fork-from both name the state to fork from: choose one");
  if (by_run && !given("--at")) fail("--fork ", r.fork, ": give the step of its snapshot to start from (--at STEP)");
  if (given("--at") && !by_run) fail("--at ", r.at, " goes with --fork RUN");
  if (forking && r.resume) fail("--resume continues a run (a fork too) from its own checkpoint: leave out --fork");
  if (forking && given("--init")) fail("--init and --fork both give the starting weights: choose one");
  if (r.resume && given("--init"))
    fail("--init gives a new run its starting weights and --resume continues from the run's checkpoint: choose one");
  if (!forking && !(r.gate.empty() && r.freeze.empty() && r.reinit.empty()))
    fail("--gate, --freeze and --reinit apply to a fork: give --fork RUN --at STEP (or --fork-from FILE)");
  if (forking && r.own_task) fail("--fork: a fork trains on the task of the run it forks; leave out the data arrays");
  if (r.out.empty() && (r.log_grads > 0 || !r.dump_grads_at.empty()))
    fail("--log-grads and --dump-grads-at write the gradient atlas into the run's directory: give --out");

  RunPlan plan;
  TrainArgs& a = plan.args;
  if (r.resume) {
    a = resume_args(r.out, settings, given);  // the run keeps its own atlas settings
  } else if (forking) {
    TrainArgs wanted = settings;
    wanted.out = r.out;
    wanted.gate_heads = r.gate, wanted.freeze_heads = r.freeze, wanted.reinit_heads = r.reinit;
    wanted.log_grads_every = r.log_grads;
    wanted.dump_grads_at = r.dump_grads_at;
    a = fork_args(by_run ? require_snapshot(r.fork, r.at) : r.fork_from, wanted, given);
  } else {
    a = settings;
    a.init = r.init;
    a = init_args(a, given);
    if (!r.out.empty())
      for (const char* file : {"/model.safetensors", "/checkpoint.safetensors"})
        refuse_output_over_input("--out", r.out + file, {{"--init", a.init}});
    a.out = r.out;
    a.log_grads_every = r.log_grads;
    a.dump_grads_at = r.dump_grads_at;
  }
  // a resumed run, or a fork, keeps the run's own snapshot steps unless given
  if ((!r.resume && !forking) || given("--snapshot-at")) a.snapshot_at = r.snapshot_at;
  if (!given("--threads")) {
    // A resumed run or a fork keeps the count it ran with: another count changes the arithmetic.
    a.threads = default_threads(a.threads);  // under mpirun: this rank's share of the node
    if (!r.resume && !forking && !in_multi_rank_job()) {
      const ThreadChoice c = choose_threads(a.threads);
      plan.threads_wanted = a.threads;
      plan.threads_notice = c.notice;
      a.threads = c.threads;
    }
  }
  return plan;
}

std::string snapshot_notice(const Trainer& trainer) {
  const Trainer::SnapshotPlan& plan = trainer.snapshot_plan();
  const size_t n = plan.steps.size();
  if (n == 0) return "";
  std::string at;
  for (size_t i = 0; i < n; ++i) {
    if (n > 8 && i == 5) i = n - 1, at += ", ...";  // a long list: its ends
    at += (i ? ", " : "") + std::to_string(plan.steps[i]);
  }
  const char* s = n == 1 ? "" : "s";
  return std::to_string(n) + " snapshot" + s + " (step" + s + " " + at + ") of " + format_bytes(plan.bytes_each) +
         " each: " + format_bytes(plan.bytes_each * static_cast<double>(n)) + " of disk in " + trainer.args().out +
         "/snapshots";
}

}  // namespace hl
