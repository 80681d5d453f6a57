// The training loop shared by `train`, `ablate` and `prune`: model + task + optimizer,
// held-out evaluation, atomic checkpoints, exact resume, non-finite detection.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "datasets/copy_task.h"  // CopyTask for callers that build copy batches by hand
#include "datasets/task.h"
#include "lib/bf16.h"
#include "lib/fileutil.h"
#include "lib/optim.h"
#include "lib/safetensors.h"
#include "lib/stop.h"
#include "models/transformer.h"
#include "analysis/evaluate.h"
#include "train/distributed.h"
#include "train/interventions.h"

namespace hl {

struct TrainArgs {
  ModelConfig model;  // vocab_size and max_seq_len are set from the task
  TaskConfig task;
  std::string init;   // start from these weights (a checkpoint of the same config) instead of random ones
  int batch = 64;
  int64_t steps = 600;
  float lr = 3e-3f;
  std::string schedule = "cosine";
  int64_t warmup = 50;
  float min_lr_ratio = 0.1f;
  std::string optimizer = "adamw";
  float weight_decay = 0.01f;
  bool decay_all = false;  // AdamW: also decay biases, LayerNorm and embeddings
  float beta1 = 0.9f, beta2 = 0.999f, momentum = 0.9f;
  float clip = 1.0f;       // global-norm clipping; 0 = off
  uint64_t seed = 0;
  int threads = 2;
  int64_t eval_every = 100;
  int64_t checkpoint_every = 200;
  int eval_size = 1000;
  uint64_t eval_seed = 1234;
  bool eval_autoregressive = false;  // at every eval (always done at the end)
  bool skip_nonfinite = false;
  std::string out;
  bool resume = false;
  // gradient atlas (train --log-grads)
  int64_t log_grads_every = 0;
  std::vector<int64_t> dump_grads_at;
  // counterfactual fork (train --fork-from FILE): start from the full training state in FILE (a
  // snapshot or checkpoint of a run of the same settings) instead of step 0, with these heads
  // gated ("L.H=V"), frozen or re-initialised ("L.H"); train/interventions.h
  std::string fork_from;
  std::vector<std::string> gate_heads, freeze_heads, reinit_heads;
  // snapshots (train --snapshot-every N, --snapshot-at S1,S2): the resume state kept at these
  // steps as RUN/snapshots/step_NNNNNNNN.safetensors (train/snapshots.h); 0 = the initial weights
  int64_t snapshot_every = 0;  // 0 = off; else every multiple of N, step 0 included
  std::vector<int64_t> snapshot_at;
  // The task's data files as the run first read them (path -> "N bytes, fnv1a H"), recorded when
  // a run starts: a resume or fork refuses a file that has changed since.
  std::map<std::string, std::string> data_files;
  // The linear layers' products: "float32" or "bf16" (bf16 operands, float32 accumulation and
  // float32 everything else: weights, gradients, optimizer state; lib/bf16.h). Evaluations too.
  std::string precision = "float32";

  std::string to_json() const;
  static TrainArgs from_json(const std::string& text, const std::string& source);
  void validate() const;
};

// The run's precision (TrainArgs::precision); validate() has refused any other name.
inline Precision run_precision(const TrainArgs& a) { return parse_precision(a.precision, "--precision"); }

struct TrainResult {
  EvalResult final_eval;
  int64_t steps = 0;
  double wall_s = 0;
  int64_t params = 0;
  long peak_rss_kb = 0;
  int64_t skipped_steps = 0;
  int64_t first_step_99 = -1;  // first eval step with token accuracy >= 99%
  double train_s = 0;          // time in training steps (evaluations excluded)
  double eval_s = 0;           // time in held-out evaluations
  size_t peak_tensor_bytes = 0;  // most tensor memory live at once during the run
  int ranks = 1;                 // processes that shared each batch (MPI data parallelism)
  std::vector<std::pair<int64_t, EvalResult>> curve;  // (step, eval) over training
};

// Something to watch a run: called after each step (for progress) and at each eval.
struct TrainObserver {
  std::function<void(int64_t step, int64_t total, float loss, double tokens_per_s)> on_step;
  std::function<void(int64_t step, const EvalResult&)> on_eval;
  // After backward (gradients present), before the optimizer step.
  std::function<void(int64_t step, TransformerLM& model)> on_gradients;
};

// Raised for a non-finite loss, gradient, held-out loss or weight: names the step; nothing
// non-finite is ever checkpointed, so the last checkpoint is intact and good.
struct NonFiniteError : Error {
  using Error::Error;
};

// Raised when a stop was requested (Ctrl-C): the run stopped at a step boundary and its
// checkpoint is written. `step` is the step reached.
struct Interrupted : Stopped {
  Interrupted(const std::string& what, int64_t step) : Stopped(what, stop_signal()), step(step) {}
  int64_t step;
};

// Checks a run's arguments and that it fits in memory, before anything is allocated or any
// directory is made: one message naming the flag and the estimate.
void check_training_resources(const TrainArgs& args, const Task* task = nullptr);  // null: args.task's

// The arguments of the run stored in `dir` (its summary.json, else its checkpoint), or null
// JSON when the directory holds no run.
std::string stored_run_args(const std::string& dir);
// "steps is 80 in the existing run but 200 now" for the first setting that differs (settings
// that do not change results, such as threads and checkpoint frequency, are ignored), or "".
std::string first_setting_difference(const std::string& stored_json, const std::string& now_json);
// The first setting that defines a run (seed, model, task: those a resume must match) and differs
// between two runs' stored arguments, worded as above; "" when both are states of one run.
std::string first_identity_difference(const std::string& stored_json, const std::string& now_json, const std::string& stored_side,
                                      const std::string& now_side);
// The arguments that continue the run in `out`: those its checkpoint stores, with the settings the
// caller gave (`given_flag("--steps")` says whether it gave --steps) applied where a resumed run may
// change them and refused where they must match. The command line and Python both come here.
TrainArgs resume_args(const std::string& out, const TrainArgs& given,
                      const std::function<bool(const std::string& flag)>& given_flag);
// `train --init CK`: the model's architecture comes from the checkpoint's config (widths, layers,
// heads, d_ff, norm, activation, positions, biases and the length of its position table); a
// model setting the caller gave (`given_flag("--d-model")`) that contradicts it is refused,
// naming both values. Training settings (dropout included) stay the caller's.
TrainArgs init_args(const TrainArgs& given, const std::function<bool(const std::string& flag)>& given_flag);
// `train --fork-from FILE --out NEWRUN`: the arguments of the run FILE holds (its train_state), with
// the settings the caller gave applied where a resumed run may change them and refused where they
// must match (a fork of the same run, not of another config); out, the interventions and
// fork_from from `given`. FILE is a snapshot or checkpoint with the full training state.
TrainArgs fork_args(const std::string& file, const TrainArgs& given,
                    const std::function<bool(const std::string& flag)>& given_flag);
// The run directory a state file belongs to: RUN for RUN/checkpoint.safetensors and for
// RUN/snapshots/step_N.safetensors (its metrics.jsonl gives a fork its history).
std::string run_dir_of_state_file(const std::string& file);
// A sweep reuses what `dir` holds only if it was made with the same settings: refuses
// otherwise, naming the first difference, or with `force` deletes the old run.
void reuse_only_if_same_settings(const std::string& dir, const TrainArgs& args, bool force, const std::string& force_flag);

class Trainer {
 public:
  explicit Trainer(TrainArgs args);
  // With a task built by the caller (e.g. token arrays from Python) instead of args.task's
  // (null: args.task's). With a group of several ranks the run is data-parallel: every rank
  // draws the same global batch of args.batch rows and takes its share of the rows, the
  // gradients are summed across the ranks before clipping, and only rank 0 evaluates and
  // writes files. A group of one rank changes nothing.
  Trainer(TrainArgs args, std::unique_ptr<Task> task, ProcessGroup* group = nullptr);
  // Trains from the start or the last checkpoint to args.steps. Throws NonFiniteError,
  // Interrupted (after writing the checkpoint) or Error (e.g. a metrics write failed).
  TrainResult run(const TrainObserver& obs = {});
  // Gives up the output directory's lock (after run() has ended, and its summary is written),
  // so a new trainer in this process may resume the run while this object is still referenced.
  void release_out_dir() { lock_.reset(); }
  bool has_run() const { return ran_; }
  // A loop of the caller's own (Python's Trainer.step): one optimisation step on the next
  // training batch at the schedule's learning rate, exactly as run() takes it; returns (loss,
  // gradient norm before clipping). Counts from 0, or from the checkpoint with args.resume.
  // With args.out it writes metrics lines and checkpoints at the steps run() does.
  std::pair<float, float> step(const std::function<void(TransformerLM&)>& on_gradients = {});
  int64_t steps_done() const { return manual_step_; }
  EvalResult evaluate_held_out(bool autoregressive = false);
  TransformerLM& model() { return *model_; }
  Optimizer& optimizer() { return *opt_; }
  const Task& task() const { return *task_; }
  const TrainArgs& args() const { return args_; }
  const std::vector<Batch>& held_out() const { return held_out_; }
  std::string checkpoint_path() const;
  // The snapshots this run will still write (steps not yet on disk) and the bytes of each (the
  // size of the resume state: weights, optimizer moments and the metadata), as announced up front.
  struct SnapshotPlan {
    std::vector<int64_t> steps;
    double bytes_each = 0;
  };
  const SnapshotPlan& snapshot_plan() const { return snapshot_plan_; }
  // After run() threw Interrupted: the result up to the step it stopped at (for a summary).
  const TrainResult& partial_result() const { return partial_; }

 private:
  void save(int64_t step, double wall_s);
  // The resume state of `step`: what checkpoint.safetensors and every snapshot hold.
  SafetensorsWriter resume_state(int64_t step, double wall_s) const;
  void save_snapshot_if_due(int64_t step, double wall_s, int64_t last_ckpt);
  void plan_snapshots();  // fills snapshot_plan_; refuses when the disk cannot hold them
  void check_weights_finite(int64_t step, int64_t last_ckpt) const;
  int64_t restore(double& wall_s, const std::string& path);  // returns the step to continue from
  // The step to start from: 0, the checkpoint's (resume) or the fork's file's (with the fork's
  // history of metrics and its re-initialised heads); then the interventions' gates and frozen values.
  int64_t start_state(double& wall_s);
  // One step's second half with the interventions: frozen heads' gradients zeroed before clipping,
  // their values put back after the update.
  float apply_step(float loss, const std::function<void(TransformerLM&)>& on_gradients);
  bool forking() const { return !args_.fork_from.empty() && !args_.resume; }
  std::pair<float, float> step_at(int64_t step, const std::function<void(TransformerLM&)>& on_gradients);
  std::pair<float, float> data_parallel_step(int64_t step, const std::function<void(TransformerLM&)>& on_gradients);
  bool leads() const { return !group_ || group_->rank() == 0; }  // alone, or rank 0: evaluates and writes
  bool writes_files() const { return !args_.out.empty() && leads(); }
  TrainArgs args_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<TransformerLM> model_;
  std::unique_ptr<Optimizer> opt_;
  HeadInterventions interventions_;
  LrSchedule sched_;
  Rng data_rng_;
  std::vector<Batch> held_out_;
  double train_s_so_far_ = 0;  // time in training steps, carried across resumes
  double eval_s_so_far_ = 0;   // time in evaluations, likewise
  Batch batch_;                // the training batch, refilled in place every step
  std::unique_ptr<DirLock> lock_;  // owns args.out while the trainer lives
  TrainResult partial_;
  int64_t manual_step_ = -1;  // step()'s position; -1 = not started
  bool manual_metrics_started_ = false;  // step() has written metrics.jsonl's first line
  bool ran_ = false;
  ProcessGroup* group_ = nullptr;  // data-parallel ranks (more than one), or null
  Batch shard_;                    // this rank's rows of batch_
  std::vector<float> summed_;      // gradients, loss and stop requests summed over the ranks
  bool group_stop_ = false;        // a rank asked to stop: all stop after this step
  SnapshotPlan snapshot_plan_;
};

long peak_rss_kb();

// The generator of a run's training batches, as Trainer seeds it from args.seed (a test or a
// user can draw the same rows a run trains on).
Rng training_data_rng(uint64_t seed);

// summary.json of a run: configuration, final metrics, timings, sizes; `finished` is false for a
// run stopped early (Ctrl-C), which sweeps then continue instead of reading back.
void write_summary(const std::string& out_dir, const TrainArgs& args, const TrainResult& r, bool finished = true);
// Whether `dir` holds a finished run (a summary.json that does not say finished: false).
bool run_finished(const std::string& dir);

// The mean cross-entropy of a batch's counted targets (forward with its padding mask).
Tensor batch_loss(TransformerLM& model, const Batch& batch);
// One optimisation step on a batch (forward, loss, backward, clip, step, zero_grad); returns
// the loss and the gradient norm before clipping. Non-finite values skip the update.
std::pair<float, float> train_step(TransformerLM& model, Optimizer& opt, const Batch& batch, float clip,
                                   const std::function<void(TransformerLM&)>& on_gradients = {});
// The second half of a step, once the gradients are in: clip, step (unless the loss or the norm is
// not finite), zero_grad; returns the gradient norm before clipping.
float apply_gradients(TransformerLM& model, Optimizer& opt, float loss, float clip,
                      const std::function<void(TransformerLM&)>& on_gradients);
// A run trained on arrays given from Python keeps its held-out rows here (input_ids and
// targets, a file of task tokens): what `headlab view` shows of such a run.
std::string held_out_rows_path(const std::string& run_dir);
// Rows of `data` as a tokens file (input_ids (N, T) and targets (N, T), I32, -1 = not counted).
void save_token_rows(const std::string& path, const std::vector<Batch>& data);

// Trains a.out to its last step, continuing from its checkpoint when there is one, and writes its
// summary; when stopped, writes the summary with finished: false and rethrows Interrupted.
void train_to_end(TrainArgs a, const TrainObserver& obs = {});
// Fine-tunes a model in place for `steps` AdamW steps at a constant lr (used by prune).
void finetune(TransformerLM& model, const Task& task, int steps, float lr, int batch, uint64_t seed);
std::string eval_json(int64_t step, const EvalResult& e, float lr, double tokens_per_s, double wall_s);

}  // namespace hl
