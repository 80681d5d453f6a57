// One plan for every run of `headlab train` and of Python's Trainer: the run-control values as
// either door received them (out, resume, init, a fork and its interventions, the gradient atlas,
// snapshot steps), checked together once and turned into the run's arguments, with the thread
// count chosen by the busy-machine rule. The doors only read their flags or keywords into a
// RunRequest and print what the plan says.
#pragma once
#include <cmath>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "train/trainer.h"

namespace hl {

// The run-control values: those of a run, not of its model or training (train_settings() has those).
struct RunRequest {
  std::string out;        // the run's directory ("" = none: a run that writes nothing, Python only)
  bool resume = false;    // continue the run in out from its checkpoint
  std::string init;       // a new run's starting weights
  std::string fork;       // fork the run in this directory ...
  int64_t at = 0;         // ... from its snapshot at this step
  std::string fork_from;  // or from this state file
  std::vector<std::string> gate, freeze, reinit;  // a fork's interventions
  int64_t log_grads = 0;                          // the gradient atlas: every N steps
  std::vector<int64_t> dump_grads_at, snapshot_at;
  // Whether a setting of either table was given ("--resume", "--d-model").
  std::function<bool(const std::string& flag)> given;
  bool own_task = false;  // the caller built the task (token arrays from Python)
};

using RunFieldRef = std::variant<bool*, int64_t*, std::string*, std::vector<int64_t>*, std::vector<std::string>*>;

// One run-control setting: its flag (the Python keyword is the flag with _ for -), help and range;
// the command line registers its options from these rows and Python reads its keywords by them.
struct RunSetting {
  std::string flag, help;
  RunFieldRef (*field)(RunRequest&);
  double lo = NAN, hi = NAN;  // numbers (each number of a list): the inclusive range, checked by plan_run
  bool is_path = false;       // a file or directory (Python takes os.PathLike too)
  std::string name() const;   // "fork_from"
};
const std::vector<RunSetting>& run_settings();
const RunSetting* find_run_setting(const std::string& flag_or_name);

struct RunPlan {
  TrainArgs args;
  // The busy-machine rule's notice when it lowered the thread count ("1 of the 2 cores is busy
  // ...: running on 1 thread"), else ""; each door adds how to ask for `threads_wanted` anyway.
  std::string threads_notice;
  int threads_wanted = 0;
};

// The run `settings` (train_settings()'s values, resolved) and `request` describe: refuses a value
// out of range or a combination that does not go together, in one line naming the flags; resolves
// resume, fork and init; chooses the threads when none were given (a new run: the busy-machine
// rule; a resumed run or fork: the count it ran with, for the same arithmetic; under mpirun: this
// rank's share of the node).
RunPlan plan_run(const TrainArgs& settings, const RunRequest& request);

// "3 snapshots (steps 0, 5, 10) of 1.2 MiB each: 3.6 MiB of disk in OUT/snapshots", what both doors
// say up front; "" when the run keeps none.
std::string snapshot_notice(const Trainer& trainer);

}  // namespace hl
