// The headlab subcommands. Each registers its flags on the CLI11 app and runs when chosen.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "lib/safetensors.h"
#include "train/settings.h"
#include "train/trainer.h"

namespace hl {

// Registers the rows of train_settings() (model, task and optimisation flags, shared by train,
// ablate, prune and hooks), each with its default and range shown in --help.
struct TrainFlags {
  TrainFlagValues values;
  TrainArgs& args = values.args;
  TrainFlags() = default;
  TrainFlags(const TrainFlags&) = delete;  // `args` refers to this object's values
  void add(CLI::App* app, bool with_run_flags = true, bool with_heads = true);
  TrainArgs resolve() const;  // parses the text flags into args, applies task presets
  bool task_training_defaults = false;  // also the task's training defaults (train, study)
  bool machine_threads = true;  // resolve() applies the busy-machine rule (false: train's run plan does)
  // Whether `flag` was on the command line (false for a flag this command does not have).
  bool given(const std::string& flag) const {
    const CLI::Option* o = app_ ? app_->get_option_no_throw(flag) : nullptr;
    return o && o->count() > 0;
  }

 private:
  CLI::App* app_ = nullptr;
};

// Every command, in the order of `headlab --help`: cli/<name>.cpp defines add_<name>_command,
// which adds the subcommand to app and sets `runner` to run it once the flags are parsed.
#define HEADLAB_COMMANDS(X) \
  X(train) X(grads) X(attn) X(bench) X(ablate) X(prune) X(hooks) X(view) X(detect) X(patch) X(knockout) X(compose) X(dla) X(edges) \
  X(study) X(match) X(compare) X(convert) X(export) \
  X(sae) \
  X(qk) \
  X(features)
using CommandRunner = std::function<int()>;
#define HEADLAB_DECLARE_COMMAND(name) void add_##name##_command(CLI::App& app, CommandRunner& runner);
HEADLAB_COMMANDS(HEADLAB_DECLARE_COMMAND)
#undef HEADLAB_DECLARE_COMMAND
// The page of `headlab view RUN_DIR` (RUN_DIR/view.html).
int write_view_page(const std::string& run_dir, int threads);

// Shared helpers for commands.
std::string default_out_dir(const std::string& command);  // runs/<command>-YYYYmmdd-HHMMSS
std::string percent(double v);                              // 0.9871 -> "98.71%"
std::string fixed(double v, int decimals);                  // 3.14159, 2 -> "3.14"
void print_table(const std::vector<std::vector<std::string>>& rows);  // first row = header
// Says before a command's work how much memory it will take beyond the model already loaded
// ("headlab detect: about 1.9 GiB of memory for WORK, beyond the loaded model (20 GiB
// available)", on stderr) and, when that is more than is available, refuses in one line naming
// the estimate and `lower`, the flags that make the work smaller.
void announce_memory(const std::string& command, double need, const std::string& work, const std::string& lower);
// A whole decimal integer in [lo, hi] (no trailing characters, no wrap-around), else an error
// naming `what` and the text.
int64_t parse_int(const std::string& text, int64_t lo, int64_t hi, const std::string& what);
// --tokens: token ids separated by commas and/or spaces ("3,7 9"), each a whole number in
// [0, vocab_size); fails naming `flag` for a bad id or for none.
std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab_size, const std::string& flag = "--tokens");
// CLI11 check for a number in [lo, hi] (finite; NaN and Inf rejected), shown in --help.
CLI::Validator in_range(double lo, double hi);
// One option (or switch) bound to a field, with its range or choices checked and shown in --help.
CLI::Option* add_setting(CLI::App* app, const std::string& flag, const std::string& help, FieldRef field, double lo, double hi,
                         const std::vector<std::string>& choices, bool is_switch);
// Every row of a study's option table (train/settings.h) as an option of `app` bound to `values`.
template <class Options>
void add_option_settings(CLI::App* app, const std::vector<OptionSetting<Options>>& rows, Options& values) {
  for (const OptionSetting<Options>& r : rows) add_setting(app, r.flag, r.help, r.field(values), r.lo, r.hi, r.choices, r.is_switch);
}
// Installs the Ctrl-C / SIGTERM handler: the first signal asks training loops to stop at the next
// step boundary (request_stop), a second one ends the process at once.
void install_stop_handler();

}  // namespace hl
