#include "features.h"

#include <algorithm>
#include <cmath>

namespace hl {

SaeMetrics sae_metrics(const Sae& sae, const Tensor& x, const Tensor& target, double dense_above) {
  NoGradGuard no_grad;
  const Tensor y = target.defined() ? target : x;
  const Tensor f = sae.encode(x);
  const Tensor x_hat = sae.decode(f);
  HL_CHECK(x_hat.shape() == y.shape(), "SAE metrics: reconstruction ", x_hat.shape().str(), " vs target ", y.shape().str());
  const int64_t N = f.size(0), F = f.size(1), D = y.size(1);
  SaeMetrics m;
  m.density.assign(static_cast<size_t>(F), 0.0);
  const float* fd = f.data();
  int64_t active = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < F; ++j)
      if (fd[r * F + j] != 0.f) ++active, m.density[j] += 1.0 / double(N);
  m.l0 = double(active) / double(N);
  std::vector<double> mean(D, 0.0);
  const float *yd = y.data(), *xh = x_hat.data();
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < D; ++c) mean[c] += yd[r * D + c] / double(N);
  double err = 0, var = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < D; ++c) {
      const double e = double(yd[r * D + c]) - xh[r * D + c], v = double(yd[r * D + c]) - mean[c];
      err += e * e, var += v * v;
    }
  m.mse = err / double(N);
  m.explained_variance = var > 0 ? 1.0 - err / var : 0.0;
  for (double d : m.density) {
    if (d == 0) m.dead_fraction += 1.0 / double(F);
    if (d > dense_above) m.dense_fraction += 1.0 / double(F);
  }
  return m;
}

Tensor decoder_head_fractions(const Sae& sae, int n_heads) {
  const int64_t F = sae.cfg.d_sae, D = sae.cfg.d_in;
  HL_CHECK(n_heads >= 1 && D % n_heads == 0, "decoder_head_fractions: d_in ", D, " is not n_heads (", n_heads,
           ") blocks of d_head: the SAE is not on this layer's hook_z");
  const int64_t dh = D / n_heads;
  Tensor out = Tensor::zeros({F, n_heads});
  const float* w = sae.W_dec.data();
  for (int64_t j = 0; j < F; ++j) {
    std::vector<double> part(static_cast<size_t>(n_heads), 0.0);
    double total = 0;
    for (int64_t c = 0; c < D; ++c) {
      const double v = double(w[j * D + c]) * w[j * D + c];
      part[c / dh] += v, total += v;
    }
    if (total > 0)
      for (int h = 0; h < n_heads; ++h) out.data()[j * n_heads + h] = static_cast<float>(part[h] / total);
  }
  return out;
}

std::vector<double> max_cosine(const Tensor& rows, const Tensor& reference) {
  HL_CHECK(rows.ndim() == 2 && reference.ndim() == 2 && rows.size(1) == reference.size(1),
           "max_cosine: rows ", rows.shape().str(), " and reference ", reference.shape().str(), " must be (n, d) and (m, d)");
  const int64_t n = rows.size(0), m = reference.size(0), d = rows.size(1);
  auto norms = [d](const Tensor& t) {
    std::vector<double> out(static_cast<size_t>(t.size(0)));
    for (int64_t i = 0; i < t.size(0); ++i) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += double(t.data()[i * d + c]) * t.data()[i * d + c];
      out[i] = std::sqrt(s);
    }
    return out;
  };
  const std::vector<double> nr = norms(rows), nf = norms(reference);
  std::vector<double> best(static_cast<size_t>(n), -1.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += double(rows.data()[i * d + c]) * reference.data()[j * d + c];
      const double den = nr[i] * nf[j];
      best[i] = std::max(best[i], den > 0 ? dot / den : 0.0);
    }
  return best;
}

}  // namespace hl
