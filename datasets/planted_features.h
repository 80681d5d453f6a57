// Synthetic activations with a known answer for sparse autoencoders: a planted dictionary of
// unit directions in d_in dimensions (more directions than dimensions: superposition), each
// sample the sum of a few of them with positive magnitudes. An SAE that works recovers the
// directions (analysis/features.h: max_cosine).
#pragma once
#include "lib/tensor.h"

namespace hl {

struct PlantedDictionary {
  Tensor directions;         // (n_features, d_in), unit rows
  float mean_active = 4.f;   // expected active features per sample
  float min_magnitude = 0.5f, max_magnitude = 1.5f;

  // Random unit directions.
  static PlantedDictionary make(int64_t d_in, int64_t n_features, float mean_active, Rng& rng);
  // (rows, d_in): each feature on with probability mean_active / n_features, at a magnitude
  // uniform in [min_magnitude, max_magnitude]; with `codes` the (rows, n_features) magnitudes.
  Tensor sample(int64_t rows, Rng& rng, Tensor* codes = nullptr) const;
};

}  // namespace hl
