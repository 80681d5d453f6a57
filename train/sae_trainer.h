// Training a sparse autoencoder (models/sae.h) on a stream of activations: Adam with a linear
// learning-rate warmup, unit-norm decoder rows (projected gradient, then renormalised) for
// TopK, BatchTopK and JumpReLU, b_dec initialised from the geometric median (or mean) of a
// first sample, dead features tracked by the tokens since each last fired, and an auxiliary
// loss (AuxK, Gao et al. 2024) that makes the dead features reconstruct the residual error.
#pragma once
#include <functional>
#include <vector>

#include "lib/optim.h"
#include "models/sae.h"
#include "models/transformer.h"

namespace hl {

struct SaeTrainArgs {
  int64_t steps = 1000;
  int64_t batch = 1024;        // rows (tokens) per step
  float lr = 4e-4f;
  int64_t warmup = 0;          // steps of linear learning-rate warmup
  float l1_coefficient = 5.f;  // Standard: weight of sum_j f_j |W_dec[j]|
  float l0_coefficient = 1.f;  // JumpReLU: weight of the step-function L0
  float aux_coefficient = 1.f / 32.f;  // AuxK's weight (0 turns it off)
  int64_t dead_after = 100000;  // a feature that has not fired for this many rows is dead
  bool b_dec_geometric_median = true;  // else the mean
  int64_t init_rows = 4096;     // rows of the b_dec initialisation sample
  uint64_t seed = 0;
};

// The next `rows` activations (rows, d_in); must not repeat the same tensor storage.
using ActivationSource = std::function<Tensor(int64_t rows)>;

// Activations of `model` at `hook` over `batches` of token ids (cycled), as SAE rows (sae_rows:
// hook_z concatenated over heads), mixed in a shuffle buffer of `buffer_rows` rows: the buffer
// is topped up with whole batches from the model and each request takes rows from it at random
// (SAELens's mixing buffer, without an activation file). A hook the model does not have is an
// error naming it; the model runs without gradients.
ActivationSource model_activations(TransformerLM& model, const std::string& hook, std::vector<Ids> batches,
                                   int64_t buffer_rows, uint64_t seed);

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
  SaeTrainer(const SaeConfig& cfg, const SaeTrainArgs& args, ActivationSource source);
  SaeStepStats step();
  // Runs the remaining steps; `on_step` (may be empty) sees each step's statistics.
  void train(const std::function<void(const SaeStepStats&)>& on_step = {});

  const Sae& sae() const { return sae_; }
  int64_t steps_done() const { return step_; }
  // Features that have not fired for dead_after rows.
  std::vector<bool> dead_features() const;

 private:
  SaeConfig cfg_;
  SaeTrainArgs args_;
  ActivationSource source_;
  Sae sae_;
  Adam opt_;
  int64_t step_ = 0;
  std::vector<int64_t> rows_since_fired_;
};

}  // namespace hl
