// Measures of a sparse autoencoder's features (models/sae.h): how sparse and how faithful its
// code is on a batch of activations, and how well its decoder matches known directions.
#pragma once
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/task.h"
#include "models/sae.h"
#include "models/transformer.h"

namespace hl {

struct SaeMetrics {
  double l0 = 0;                  // mean active features per row
  double explained_variance = 0;  // 1 - sum |x - x_hat|^2 / sum |x - mean(x)|^2
  double mse = 0;                 // mean over rows of |x - x_hat|^2
  double dead_fraction = 0;       // features that never fire on the batch
  double dense_fraction = 0;      // features firing on more than dense_above of the rows
  std::vector<double> density;    // (d_sae): fraction of rows on which each feature fires
};

// x (N, d_in), target (N, d_out) or undefined (then x: an autoencoder). Inference encode.
SaeMetrics sae_metrics(const Sae& sae, const Tensor& x, const Tensor& target = Tensor(), double dense_above = 0.1);

// The model's loss on `data` (mean cross-entropy over counted targets) three ways: clean, with
// the SAE's reconstruction spliced in at its hook (sae_splice), and with that activation zeroed.
// recovered = (zero_ablated - spliced) / (zero_ablated - clean): 1 when the splice loses
// nothing, 0 when it is as bad as removing the activation (NaN when zeroing changes nothing).
struct LossRecovered {
  double clean = 0, spliced = 0, zero_ablated = 0, recovered = 0;
};
LossRecovered sae_loss_recovered(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data);

// Features counted by log10 of their density (SAELens's feature density histogram): a bucket
// holds the features with density in [10^lo, 10^hi); the first, from lo = -inf, the dead ones
// (density 0) and any below 10^-decades; the last ends at 10^0 inclusive.
struct DensityBucket {
  double lo = 0, hi = 0;
  int64_t features = 0;
};
std::vector<DensityBucket> density_histogram(const std::vector<double>& density, int decades = 6);

// Everything above for an SAE on a model: the activations at its hook over `data` (every
// token of every batch, padding left out; a transcoder's target at hook_name_out) give the
// metrics and the histogram, the same batches the loss recovered.
struct SaeEvaluation {
  SaeMetrics metrics;
  LossRecovered loss;
  std::vector<DensityBucket> histogram;
};
SaeEvaluation evaluate_sae(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data, double dense_above = 0.1);
// Its fields by name (metrics.json of `headlab sae`, hl.evaluate_sae's dict): l0,
// explained_variance, mse, loss_clean, loss_spliced, loss_zero_ablated, loss_recovered (null
// when undefined), dead_fraction, dense_fraction, density_histogram [{log10_density_from (null
// = -inf), log10_density_to, features}], density (per feature).
nlohmann::ordered_json sae_evaluation_json(const SaeEvaluation& e);

// For an SAE on blocks.L.attn.hook_z (d_in = n_heads * d_head, heads concatenated): each
// feature's decoder row split into the heads' blocks, as the fraction of its squared norm in
// each head's d_head columns (Kissane et al. 2024). Returns (d_sae, n_heads); rows sum to 1
// (a zero row gives zeros).
Tensor decoder_head_fractions(const Sae& sae, int n_heads);

// For each row of `rows` (n, d), the largest cosine similarity with a row of `reference` (m, d).
std::vector<double> max_cosine(const Tensor& rows, const Tensor& reference);

}  // namespace hl
