#include "planted_features.h"

#include <cmath>

namespace hl {

PlantedDictionary PlantedDictionary::make(int64_t d_in, int64_t n_features, float mean_active, Rng& rng) {
  HL_CHECK(d_in >= 1 && n_features >= 1, "planted dictionary: d_in and n_features must be positive");
  HL_CHECK(mean_active > 0.f && mean_active <= float(n_features), "planted dictionary: mean_active must be in (0, ",
           n_features, "], got ", mean_active);
  PlantedDictionary p;
  p.mean_active = mean_active;
  p.directions = Tensor::randn({n_features, d_in}, rng);
  float* w = p.directions.data();
  for (int64_t r = 0; r < n_features; ++r) {
    double nn = 0;
    for (int64_t c = 0; c < d_in; ++c) nn += double(w[r * d_in + c]) * w[r * d_in + c];
    for (int64_t c = 0; c < d_in; ++c) w[r * d_in + c] = static_cast<float>(w[r * d_in + c] / std::sqrt(nn));
  }
  return p;
}

Tensor PlantedDictionary::sample(int64_t rows, Rng& rng, Tensor* codes) const {
  const int64_t F = directions.size(0), D = directions.size(1);
  const float p_on = mean_active / float(F);
  Tensor x = Tensor::zeros({rows, D});
  if (codes) *codes = Tensor::zeros({rows, F});
  const float* w = directions.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t f = 0; f < F; ++f) {
      if (rng.uniform() >= p_on) continue;
      const float a = rng.uniform(min_magnitude, max_magnitude);
      if (codes) codes->data()[r * F + f] = a;
      for (int64_t c = 0; c < D; ++c) x.data()[r * D + c] += a * w[f * D + c];
    }
  return x;
}

}  // namespace hl
