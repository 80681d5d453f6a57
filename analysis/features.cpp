#include "features.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/nn.h"
#include "lib/stop.h"

namespace hl {

SaeMetrics sae_metrics(const Sae& sae, const Tensor& x, const Tensor& target, double dense_above) {
  NoGradGuard no_grad;
  const Tensor y = target.defined() ? target : x;
  const Tensor f = sae.encode(x);
  const Tensor x_hat = sae.reconstruct(x, f);
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

LossRecovered sae_loss_recovered(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data) {
  HL_CHECK(!data.empty(), "loss recovered: no batches");
  HL_CHECK(!sae.cfg.hook_name.empty(), "loss recovered: the SAE names no hook point to splice it into");
  EvalScope mode(model);
  NoGradGuard no_grad;
  // the whole-sequence forward (not the packed one of evaluate): the hooks see (B, T, ...)
  auto loss = [&](const Hooks* hooks) {
    double sum = 0;
    int64_t counted = 0;
    for (const Batch& b : data) {
      throw_if_stopped();
      ForwardOptions opt;
      opt.hooks = hooks;
      opt.key_padding = b.key_padding;
      const int64_t n = b.counted_targets();
      if (n == 0) continue;
      sum += double(cross_entropy(model.forward(b.inputs, opt), b.targets).item()) * double(n);
      counted += n;
    }
    HL_CHECK(counted > 0, "loss recovered: the batches have no counted target");
    return sum / double(counted);
  };
  Hooks spliced, zeroed;
  add_sae_splice(spliced, sae);
  zeroed.add_forward(sae_output_hook(sae), [](const Tensor& x, const std::string&) { return Tensor::zeros(x.shape()); });
  LossRecovered r;
  r.clean = loss(nullptr), r.spliced = loss(&spliced), r.zero_ablated = loss(&zeroed);
  const double gap = r.zero_ablated - r.clean;
  r.recovered = gap != 0 ? (r.zero_ablated - r.spliced) / gap : std::numeric_limits<double>::quiet_NaN();
  return r;
}

std::vector<DensityBucket> density_histogram(const std::vector<double>& density, int decades) {
  HL_CHECK(decades >= 1, "density histogram: decades must be at least 1, got ", decades);
  std::vector<DensityBucket> h;
  h.push_back({-std::numeric_limits<double>::infinity(), -double(decades), 0});  // dead, then below 10^-decades
  for (int d = -decades; d < 0; ++d) h.push_back({double(d), double(d + 1), 0});
  for (double p : density) {
    if (p <= 0) {
      ++h[0].features;
      continue;
    }
    // floor(log10 p) clamped into the buckets; density 1 falls in the last one
    const int b = std::clamp(static_cast<int>(std::floor(std::log10(p))), -decades - 1, -1);
    ++h[static_cast<size_t>(b + decades + 1)].features;
  }
  return h;
}

namespace {
// (tokens of every batch, width) at `hook`: the rows an SAE there reads, batch after batch,
// each sequence's padding left out
Tensor rows_at(TransformerLM& model, const std::string& hook, const std::vector<Batch>& data) {
  std::vector<float> rows;
  int64_t width = 0;
  for (const Batch& b : data) {
    throw_if_stopped();
    auto [logits, cache] = model.run_with_cache(b.inputs, name_is(hook), false, b.key_padding);
    HL_CHECK(cache.has(hook), "SAE: the model has no hook point '", hook, "' (`headlab hooks` lists them)");
    const Tensor act = cache[hook];
    const int64_t B = act.size(0), T = act.size(1), tokens = B * T;
    width = tokens ? act.numel() / tokens : 0;
    const Tensor r = sae_rows(act, width, hook);
    for (int64_t row = 0; row < B; ++row)
      rows.insert(rows.end(), r.data() + row * T * width, r.data() + (row * T + b.row_tokens(row)) * width);
  }
  Tensor out = Tensor::empty({width ? static_cast<int64_t>(rows.size()) / width : 0, width});
  std::copy(rows.begin(), rows.end(), out.data());
  return out;
}
}  // namespace

SaeEvaluation evaluate_sae(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data, double dense_above) {
  HL_CHECK(!data.empty(), "SAE evaluation: no batches");
  SaeEvaluation e;
  {
    EvalScope mode(model);
    NoGradGuard no_grad;
    const Tensor x = rows_at(model, sae.cfg.hook_name, data);
    const Tensor target = sae.cfg.transcoder() ? rows_at(model, sae.cfg.hook_name_out, data) : Tensor();
    e.metrics = sae_metrics(sae, x, target, dense_above);
  }
  e.loss = sae_loss_recovered(model, sae, data);
  e.histogram = density_histogram(e.metrics.density);
  return e;
}

nlohmann::ordered_json sae_evaluation_json(const SaeEvaluation& e) {
  using json = nlohmann::ordered_json;
  auto number = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json buckets = json::array();
  for (const DensityBucket& b : e.histogram)
    buckets.push_back({{"log10_density_from", number(b.lo)}, {"log10_density_to", b.hi}, {"features", b.features}});
  const SaeMetrics& m = e.metrics;
  return {{"l0", m.l0}, {"explained_variance", m.explained_variance}, {"mse", m.mse},
          {"loss_clean", e.loss.clean}, {"loss_spliced", e.loss.spliced}, {"loss_zero_ablated", e.loss.zero_ablated},
          {"loss_recovered", number(e.loss.recovered)}, {"dead_fraction", m.dead_fraction}, {"dense_fraction", m.dense_fraction},
          {"density_histogram", buckets}, {"density", m.density}};
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
