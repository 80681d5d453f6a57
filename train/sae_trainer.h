// Training a sparse autoencoder (models/sae.h) on a stream of activations: Adam with a linear
// learning-rate warmup, unit-norm decoder rows (projected gradient, then renormalised) for
// TopK, BatchTopK and JumpReLU, b_dec initialised from the geometric median (or mean) of a
// first sample, dead features tracked by the tokens since each last fired, and an auxiliary
// loss (AuxK, Gao et al. 2024) that makes the dead features reconstruct the residual error.
// TopK and BatchTopK steps run the sparse loss of models/sae_sparse.h (the same step as the
// dense autograd graph within float32 rounding, several times faster); the others the graph.
#pragma once
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/features.h"
#include "lib/optim.h"
#include "lib/safetensors.h"
#include "models/sae.h"
#include "models/sae_sparse.h"
#include "models/transformer.h"

namespace hl {

struct SaeTrainArgs {
  int64_t steps = 1000;
  int64_t batch = 1024;        // rows (tokens) per step
  float lr = 4e-4f;
  int64_t warmup = 0;          // steps of linear learning-rate warmup
  int64_t lr_decay_steps = 0;  // final steps over which the learning rate falls linearly to 0 (SAELens's lr_decay_steps)
  float l1_coefficient = 5.f;  // Standard: weight of sum_j f_j |W_dec[j]|
  float l0_coefficient = 1.f;  // JumpReLU: weight of the L0 (its sparsity term)
  // JumpReLU's sparsity term: "step", the count of active features through the threshold's
  // straight-through step (Rajamanoharan et al. 2024); "tanh", sum_j tanh(c f_j |W_dec[j]|)
  // (Anthropic's January 2025 recipe, SAELens's jumprelu_sparsity_loss_mode), which also pulls
  // weak activations down through the encoder, as L1 does, and so shapes the features' directions.
  std::string jumprelu_sparsity = "step";
  float tanh_scale = 4.f;       // c above (SAELens's jumprelu_tanh_scale)
  // JumpReLU: weight of sum_j relu(threshold_j - pre_j) |W_dec[j]| over dead features (Anthropic's
  // pre-activation loss as SAELens applies it), which raises a dead feature towards firing. 0: off.
  float pre_act_coefficient = 0.f;
  // Standard, JumpReLU: steps over which the L1 / L0 weight rises linearly from 0 to its value
  // (SAELens's l1_warm_up_steps, l0_warm_up_steps), so features form before sparsity bites
  int64_t sparsity_warmup = 0;
  float aux_coefficient = 1.f / 32.f;  // AuxK's weight (0 turns it off)
  int64_t dead_after = 100000;  // a feature that has not fired for this many rows is dead
  bool b_dec_geometric_median = true;  // else the mean
  int64_t init_rows = 4096;     // rows of the b_dec initialisation sample
  uint64_t seed = 0;
  // TopK and BatchTopK: the sparse loss (models/sae_sparse.h) instead of the dense autograd
  // graph; the same step within float32 rounding, so not a setting a resume compares
  bool sparse_kernels = true;
};

// The learning rate of step `step` (from 0): the warmup's linear rise, then lr, then the linear
// decay to 0 over the last lr_decay_steps.
float sae_learning_rate(const SaeTrainArgs& args, int64_t step);

// The next `rows` activations (rows, d_in), or for a transcoder (rows, d_in + d_out): its input
// and its target side by side; must not repeat the same tensor storage.
using ActivationSource = std::function<Tensor(int64_t rows)>;

// A source whose position can be saved with the trainer's state and restored, so that a resume
// continues the stream where it stopped instead of replaying it from the start. `save` and `load`
// may be empty (a source that only gives rows): load_state then replays the stream.
struct ActivationStream {
  ActivationSource next;
  std::function<void(SafetensorsWriter&)> save;    // adds "stream.*" tensors and metadata
  std::function<void(const SafetensorsFile&)> load;
};

// Activations of `model` at `hook` over `batches` (cycled), as SAE rows (sae_rows: hook_z
// concatenated over heads), each row's tokens only (a batch's padding, key_padding, is run with
// the forward and left out: Batch::row_tokens), mixed in a shuffle buffer of `buffer_rows` rows: the buffer
// is topped up with whole batches from the model and each request takes rows from it at random
// (SAELens's mixing buffer, without an activation file). A hook the model does not have is an
// error naming it; the model runs without gradients.
// With several hooks each row holds every hook's values of one token side by side (a
// transcoder's [input | output]).
// The stream's state is the buffer's rows, the next batch's index and the picking generator.
ActivationStream model_activation_stream(TransformerLM& model, const std::vector<std::string>& hooks, std::vector<Batch> batches,
                                         int64_t buffer_rows, uint64_t seed);
// Token ids as batches without padding or targets.
std::vector<Batch> unpadded_batches(const std::vector<Ids>& ids);
inline ActivationSource model_activations(TransformerLM& model, const std::vector<std::string>& hooks, std::vector<Ids> batches,
                                          int64_t buffer_rows, uint64_t seed) {
  return model_activation_stream(model, hooks, unpadded_batches(batches), buffer_rows, seed).next;
}
inline ActivationSource model_activations(TransformerLM& model, const std::string& hook, std::vector<Ids> batches,
                                          int64_t buffer_rows, uint64_t seed) {
  return model_activations(model, std::vector<std::string>{hook}, std::move(batches), buffer_rows, seed);
}
// The hooks a source for `cfg` reads: hook_name, and a transcoder's hook_name_out after it.
std::vector<std::string> sae_source_hooks(const SaeConfig& cfg);
// The configuration of an SAE (or, with hook_out not empty, a transcoder) of `expansion` times
// the hook's width on `model`, widths read from one forward of `ids` (B, T); normalize_activations
// layer_norm for a BatchTopK SAE (its paper's recipe; not a transcoder), else none.
SaeConfig sae_config_for_model(TransformerLM& model, const Ids& ids, const std::string& hook, const std::string& hook_out,
                               const std::string& architecture, int64_t expansion);

// The bytes training `cfg` needs: the parameters, their gradients and Adam's two moments; a
// step's (batch, d_sae) activations (pre, f and their gradients, AuxK's); a shuffle buffer of
// buffer_rows. Checked (check_fits_in_memory) before training starts.
double sae_training_bytes(const SaeConfig& cfg, int64_t batch, int64_t buffer_rows);

struct SaeStepStats {
  int64_t step = 0;
  float loss = 0, mse = 0, sparsity = 0, aux = 0;
  float l0 = 0;              // mean active features per row of this batch
  float explained_variance = 0;
  float dead_fraction = 0;   // of features, by dead_after
};

class SaeTrainer {
 public:
  // Draws init_rows from `source` for b_dec (when the architecture subtracts it).
  SaeTrainer(const SaeConfig& cfg, const SaeTrainArgs& args, ActivationSource source)
      : SaeTrainer(cfg, args, ActivationStream{std::move(source), {}, {}}) {}
  SaeTrainer(const SaeConfig& cfg, const SaeTrainArgs& args, ActivationStream stream);
  SaeStepStats step();
  // Runs the remaining steps; `on_step` (may be empty) sees each step's statistics.
  void train(const std::function<void(const SaeStepStats&)>& on_step = {});

  // The training state in one safetensors file (written atomically): the parameters, Adam's
  // moments, the BatchTopK threshold, each feature's rows since it last fired, the step, the
  // settings and the stream's position (when the stream can save it). load_state refuses a file
  // made with other settings (naming the first that differs; steps may grow), then restores the
  // stream's position, or for a stream without one replays it up to the saved step (the same rows
  // for the same seed; the model's forwards run again, no SAE step), so training goes on bit for
  // bit as if never stopped.
  void save_state(const std::string& path) const;
  void load_state(const std::string& path);
  // The settings as saved with the state (JSON): the SAE's config and the training arguments.
  nlohmann::json settings() const;

  const Sae& sae() const { return sae_; }
  int64_t steps_done() const { return step_; }
  // Features that have not fired for dead_after rows.
  std::vector<bool> dead_features() const;

 private:
  SaeConfig cfg_;
  SaeTrainArgs args_;
  ActivationStream stream_;
  Sae sae_;
  Adam opt_;
  int64_t step_ = 0;
  std::vector<int64_t> rows_since_fired_;
  std::vector<bool> dead_;                      // this step's dead features, reused
  std::shared_ptr<SaeSparseWork> sparse_work_;  // the sparse loss's buffers, reused
};

// Training in a run directory, what `headlab sae` and hl.train_sae(out=...) both do: `out` holds
// sae_state.safetensors (resumable), snapshots/stepN/ every snapshot_every steps (SAELens's
// layout, with the state saved beside them), and at the end cfg.json, sae_weights.safetensors
// and metrics.json (evaluate_sae on `held_out`). A directory holding a run is refused unless
// resume, and resume without a state is refused, both before anything is written. Ctrl-C saves
// the state and rethrows Stopped, its message ending "at step N".
struct SaeRunOptions {
  std::string out;
  bool resume = false;
  int64_t snapshot_every = 0;
  std::string out_flag = "--out", resume_flag = "--resume";  // the door's names, for messages
  std::function<void(int64_t step)> on_resumed;            // may be empty
  std::function<void(const SaeStepStats&)> on_step;        // may be empty
};
struct SaeRun {
  Sae sae;
  SaeEvaluation evaluation;
};
// What train_sae_in_dir refuses about opt.out, refused now (nothing is written).
void check_sae_run_dir(const SaeRunOptions& opt);
SaeRun train_sae_in_dir(TransformerLM& model, const SaeConfig& cfg, const SaeTrainArgs& args, ActivationStream stream,
                        const std::vector<Batch>& held_out, const SaeRunOptions& opt);

}  // namespace hl
