// Every flag of a training run, spelled once. The CLI registers its options from this table,
// TrainArgs::validate() checks its ranges and choices, `train --resume` and the sweeps decide
// from it which settings must match a stored run, and the Python module maps keyword
// arguments (d_model=32) to the same rows.
#pragma once
#include <cmath>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "train/trainer.h"

namespace hl {

// The values behind the flags: TrainArgs, plus the flags typed as text and parsed into enums by
// resolve_train_flags().
struct TrainFlagValues {
  TrainArgs args;
  std::string norm = "pre", activation = "gelu_erf", positions = "learned", shuffle = "on";
  std::string normalization = "layernorm", mlp = "plain";  // block options
  TrainFlagValues() { args.task.min_len = 0; }  // "0 = --length"; resolve fills it in
};

enum class OnResume {
  kMustMatch,   // defines the run: with --resume it must equal the stored value; sweeps refuse a difference
  kMayChange,   // with --resume it replaces the stored value (--steps to train further); sweeps refuse a difference
  kIncidental,  // may change anytime and leaves results alone (threads, checkpoint frequency); sweeps ignore it
};

using FieldRef = std::variant<int*, int64_t*, uint64_t*, float*, double*, bool*, std::string*>;

struct TrainSetting {
  std::string flag;          // "--d-model"
  std::string json_pointer;  // where TrainArgs::to_json() keeps it: "/model/d_model"
  std::string help;
  FieldRef (*field)(TrainFlagValues&);
  OnResume on_resume = OnResume::kMustMatch;
  double lo = NAN, hi = NAN;         // numbers: the inclusive range
  std::vector<std::string> choices;  // text: the accepted values
  bool is_switch = false;            // given without a value (--decay-all)
  bool train_only = false;           // run control that only `headlab train` has
  std::string name() const;          // "d_model": the keyword in Python
};

const std::vector<TrainSetting>& train_settings();
// The row of "--d-model" or "d_model", or null.
const TrainSetting* find_train_setting(const std::string& flag_or_name);

// The --arch presets: name -> the settings it gives, as (flag, value) pairs, applied to the flags
// not given explicitly (before a task's training defaults).
struct ArchPreset {
  std::string name, help;
  std::vector<std::pair<std::string, std::string>> settings;
};
const std::vector<ArchPreset>& arch_presets();
const ArchPreset* find_arch_preset(const std::string& name);  // null for an unknown name

// The run the flags describe: parses the text flags and applies the --arch preset and the task's
// preset (alphabet, lengths) to what was not given.
// With task_training_defaults, the task's training defaults (induction's model and schedule) also
// apply to the flags not given: for training the task as such (train, study, Python's Trainer),
// not for the sweeps, which keep their own regime.
TrainArgs resolve_train_flags(const TrainFlagValues& v, const std::function<bool(const std::string& flag)>& given,
                              bool task_training_defaults = false);

// `train --resume`: the stored run, with the given flags that may change applied; a given flag that
// defines the run and differs from the stored value is an error naming both and `source`.
TrainArgs resume_with_flags(const TrainArgs& stored, const TrainArgs& given,
                            const std::function<bool(const std::string& flag)>& given_flag, const std::string& source);

// A study's own options (prune's --step-fraction, ...), one row each as in train_settings(): the
// command line adds them with their ranges in --help, and the study's validate() checks the same
// ranges with the same words (check_option_settings).
template <class Options>
struct OptionSetting {
  std::string flag, help;
  FieldRef (*field)(Options&);
  double lo = NAN, hi = NAN;         // numbers: the inclusive range
  std::vector<std::string> choices;  // text: the accepted values
  bool is_switch = false;            // given without a value (--recompute)
};
// The first row of `rows` whose value in `o` is out of range or not a choice: fails with
// "--step-fraction: value 5 is outside [0, 1]", as the command line words it.
template <class Options>
void check_option_settings(const std::vector<OptionSetting<Options>>& rows, const Options& o);
void check_option_value(const std::string& flag, FieldRef value, double lo, double hi, const std::vector<std::string>& choices);

// The one wording of a setting's range, for the command line and Python alike: range_text
// ("[0 - 100]", ">= 1") for --help, range_problem ("value 1000 is outside [0, 100]", or "" when
// the text is a number in range) for errors.
std::string range_text(double lo, double hi);
std::string range_problem(const std::string& text, double lo, double hi);
std::string range_problem(double value, const std::string& text, double lo, double hi);  // value parsed

template <class Options>
void check_option_settings(const std::vector<OptionSetting<Options>>& rows, const Options& o) {
  Options copy = o;  // rows point into a mutable Options
  for (const OptionSetting<Options>& r : rows) check_option_value(r.flag, r.field(copy), r.lo, r.hi, r.choices);
}

}  // namespace hl
