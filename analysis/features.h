// Measures of a sparse autoencoder's features (models/sae.h): how sparse and how faithful its
// code is on a batch of activations, and how well its decoder matches known directions.
#pragma once
#include <vector>

#include "models/sae.h"

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

// For an SAE on blocks.L.attn.hook_z (d_in = n_heads * d_head, heads concatenated): each
// feature's decoder row split into the heads' blocks, as the fraction of its squared norm in
// each head's d_head columns (Kissane et al. 2024). Returns (d_sae, n_heads); rows sum to 1
// (a zero row gives zeros).
Tensor decoder_head_fractions(const Sae& sae, int n_heads);

// For each row of `rows` (n, d), the largest cosine similarity with a row of `reference` (m, d).
std::vector<double> max_cosine(const Tensor& rows, const Tensor& reference);

}  // namespace hl
