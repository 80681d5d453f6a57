// What the role commands (detect, patch, compose) share: their common flags, the checkpoint
// with its task, and the head table and heatmap writers.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "analysis/circuits.h"
#include "analysis/heads.h"
#include "analysis/patching.h"
#include "datasets/task.h"
#include "models/transformer.h"
#include "cli/commands.h"
#include "cli/plot.h"
#include "train/over_training.h"

namespace hl {

// Each role command's own flags, one struct per analysis; RoleOpts composes them with the flags
// the commands share.
struct DetectFlags {  // detect (and what --run of the detectors reads)
  std::string pattern_file;  // --pattern: a (T, T) pattern of your own
  bool exclude_bos = false, exclude_current = false;
};
struct DlaFlags {  // dla: one sequence of your own instead of the task's rows
  std::string tokens;           // --tokens: its token ids
  std::string text, tokenizer;  // --text, encoded with the tokenizer of this directory
};
struct KnockoutFlags {  // knockout: the hook point, its head, positions ("1,4") and the ablation kind
  std::string hook, kind = "zero", positions;
  int head = -1;
  bool per_position = false;
};
struct PatchFlags {  // patch --hook: the hook point and the patching axes ("layer,head")
  std::string hook, axes;
};
struct RoleOpts {
  std::string run;  // --run: every snapshot of this run instead of one --checkpoint
  std::string checkpoint, out, data = "probe", task = "copy";
  int examples = 200, length = 0, threads = 2, bos = -1;
  uint64_t seed = 1234;
  std::string corrupt = "source";  // patch and edges: which token corrupt_one_symbol replaces
  std::string precision = "float32";  // --precision: the linear layers' products (lib/bf16.h)
  DetectFlags detect;
  DlaFlags dla;
  KnockoutFlags knockout;
  PatchFlags patch;
  std::vector<std::string> saes;  // --sae DIR (patch and edges): SAEs attached to the model (TransformerLM::add_sae)
};
// "1,4,7" -> {1, 4, 7} (empty text: empty), each checked as a whole number >= 0; `flag` names it.
std::vector<int64_t> parse_positions_flag(const std::string& text, const std::string& flag);

struct RoleModel {
  std::unique_ptr<TransformerLM> model;
  std::unique_ptr<Task> task;
  TaskConfig config;
};

// Registers a role command with the flags every one has (--checkpoint, --out, --task,
// --examples, --seed, --threads); `run` runs when it is chosen. Returns the subcommand and its
// options, for flags of its own.
using RoleRun = int (*)(const RoleOpts&);
std::pair<CLI::App*, std::shared_ptr<RoleOpts>> add_role_command(CLI::App& app, CommandRunner& runner, const std::string& name,
                                                                 const std::string& help, RoleRun run,
                                                                 const RoleOpts& defaults = {});
// Adds --run RUN to a role command with per-head scores over training (detect, patch, dla,
// compose): --checkpoint is then no longer required, and exactly one of the two is.
void add_run_option(CLI::App* sub, RoleOpts& opts);
// --run given: fails when --checkpoint is given too (or neither); true when the command is to
// run over the snapshots.
bool over_training_requested(const RoleOpts& o);
// The options of train/over_training.h from a role command's flags.
HeadScoreOptions head_score_options(const RoleOpts& o);
// `COMMAND --run RUN`: `analysis`'s per-head scores at every snapshot of RUN and its final
// checkpoint -> OUT/ANALYSIS_over_training.csv (step, layer, head, one column per score), .json
// and one PNG per score (a line per head against the step); OUT defaults to
// RUN/over_training/ANALYSIS, where `headlab view RUN` finds it, marked as the analysis's command's.
int write_scores_over_training(const std::string& run, const std::string& out_flag, const std::string& analysis,
                               const HeadScoreOptions& ho);

// The checkpoint's model, and its task's settings (the task itself is made by role_task, when a
// command needs its data, and checked against the model's vocabulary; `instead`: what the command
// takes without a task, named when the model is a Hugging Face one: task_for_model).
RoleModel load_role_model(const RoleOpts& o);
const Task& role_task(RoleModel& m, const std::string& checkpoint, const std::string& instead = "");
// The inputs of patch and edges: o.examples held-out rows of the task (seed o.seed), or with
// `probe` random tokens with a block of up to o.length repeated (any model, e.g. GPT-2's), with
// one token corrupted in each (corrupt_one_symbol; o.corrupt: source or previous), after
// `command` has said that `bytes(cfg, rows, T)` (the analysis's memory estimate) fits.
PatchingInputs role_patching_inputs(RoleModel& m, const RoleOpts& o, double (*bytes)(const ModelConfig&, int64_t, int64_t),
                                    const std::string& command, bool probe = false);
// --corrupt source|previous (patch and edges): which token of each row the corrupted run changes.
void add_corrupt_option(CLI::App* sub, RoleOpts& opts);
// --data task|probe and --length (patch and edges): the task's held-out rows, or the repeat probe
// (any model, e.g. a Hugging Face checkpoint's); role_patching_inputs(..., o.data == "probe").
void add_patching_data_options(CLI::App* sub, RoleOpts& opts);
// --sae DIR, repeatable (patch and edges): SAELens-layout SAE directories attached to the model
// with their error terms (load_role_model attaches them), so their features are hook points.
void add_sae_option(CLI::App* sub, RoleOpts& opts);
// What patch and edges ran on, for their printed lines: "the repeat probe" or "task NAME".
std::string patching_data_name(const RoleOpts& o, const RoleModel& m);
// patch and edges: a warning on stderr when the corruption moves the logit difference by less than
// kLeastPatchingGap (a model that has not learnt the task): what divides or compares by it is noise.
void warn_if_corruption_changes_little(double clean_metric, double corrupted_metric);
// A (layers, heads) grid as a heatmap with rows named row_prefix + l and columns col_prefix + h.
Heatmap head_heatmap(const std::string& title, const HeadGrid& g, const std::string& row_prefix, const std::string& col_prefix);
// One table (printed unless quiet) and CSV with a row per (layer, head) and a column per grid.
void write_head_table(const std::string& path, const std::vector<std::string>& names, const std::vector<HeadGrid>& grids,
                      bool quiet = false);

// The files of detect, patch and compose in `out` (tables printed unless quiet): detect.csv and
// detect.png from (name, name_ci95_lo, name_ci95_hi) triples; patch_heads.csv, patch_resid.csv
// and their PNGs; compose.csv, compose_baseline.csv and compose.png.
// A detector's three columns for write_detect_files: name, name_ci95_lo, name_ci95_hi.
void add_detector_columns(std::vector<std::string>& names, std::vector<HeadGrid>& grids, const std::string& name,
                          const HeadGrid& score, const HeadGrid& lo, const HeadGrid& hi);
void write_detect_files(const std::string& out, const std::vector<std::string>& names, const std::vector<HeadGrid>& grids,
                        bool quiet = false);
void write_patch_files(const std::string& out, const PatchingResult& r, bool quiet = false);
void write_compose_files(const std::string& out, const std::vector<CompositionScores>& layers, const CompositionBaseline& base,
                         bool quiet = false);

}  // namespace hl
