#include "analysis/features_over_training.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "analysis/matching.h"
#include "lib/stop.h"

namespace hl {

namespace {
std::string full(double v) {
  if (!std::isfinite(v)) return "";
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}
}  // namespace

FeaturesOverTraining features_over_training(const std::vector<int64_t>& steps,
                                            const std::function<std::unique_ptr<TransformerLM>(size_t)>& load,
                                            const Sae& sae, const std::vector<Batch>& data,
                                            const std::function<void(size_t, size_t, int64_t)>& progress) {
  HL_CHECK(!steps.empty(), "features over training: no steps to read");
  FeaturesOverTraining r;
  r.steps = steps;
  r.features = sae.cfg.d_sae;
  for (size_t i = 0; i < steps.size(); ++i) {
    throw_if_stopped();
    const std::unique_ptr<TransformerLM> model = load(i);
    const FeaturePresence p = feature_presence(*model, sae, data);
    r.mean_activation.push_back(p.mean_activation);
    r.firing_frequency.push_back(p.firing_frequency);
    r.tokens = p.tokens;
    if (progress) progress(i + 1, steps.size(), steps[i]);
  }
  return r;
}

std::string features_over_training_csv(const FeaturesOverTraining& f) {
  std::string out = "step,feature,mean_activation,firing_frequency\n";
  for (size_t i = 0; i < f.steps.size(); ++i)
    for (int64_t j = 0; j < f.features; ++j)
      out += std::to_string(f.steps[i]) + "," + std::to_string(j) + "," + full(f.mean_activation[i][j]) + "," +
             full(f.firing_frequency[i][j]) + "\n";
  return out;
}

std::vector<std::vector<double>> decoder_cosines(const Sae& a, const Sae& b) {
  HL_CHECK(a.cfg.d_in == b.cfg.d_in, "decoder cosines: the SAEs read different widths (d_in ", a.cfg.d_in, " and ", b.cfg.d_in, ")");
  const int64_t D = a.cfg.d_in, Fa = a.cfg.d_sae, Fb = b.cfg.d_sae;
  auto norms = [D](const Tensor& w, int64_t F) {
    std::vector<double> n(static_cast<size_t>(F));
    for (int64_t j = 0; j < F; ++j) {
      double s = 0;
      for (int64_t c = 0; c < D; ++c) s += double(w.data()[j * D + c]) * w.data()[j * D + c];
      n[j] = std::sqrt(s);
    }
    return n;
  };
  const std::vector<double> na = norms(a.W_dec, Fa), nb = norms(b.W_dec, Fb);
  std::vector<std::vector<double>> cos(static_cast<size_t>(Fa), std::vector<double>(static_cast<size_t>(Fb), 0.0));
  for (int64_t i = 0; i < Fa; ++i)
    for (int64_t j = 0; j < Fb; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < D; ++c) dot += double(a.W_dec.data()[i * D + c]) * b.W_dec.data()[j * D + c];
      cos[i][j] = na[i] > 0 && nb[j] > 0 ? dot / (na[i] * nb[j]) : 0.0;
    }
  return cos;
}

FeatureMatch match_sae_features(const Sae& a, const Sae& b) {
  // the Hungarian assignment is cubic in the features: minutes at 4096, hours beyond
  HL_CHECK(std::min(a.cfg.d_sae, b.cfg.d_sae) <= 4096, "matching SAE features: ", a.cfg.d_sae, " x ", b.cfg.d_sae,
           " features is too many for the one-to-one assignment (at most 4096 on the smaller side)");
  const std::vector<std::vector<double>> cos = decoder_cosines(a, b);
  std::vector<std::vector<double>> cost = cos;
  for (auto& row : cost)
    for (double& c : row) c = -c;
  FeatureMatch m;
  m.partner = hungarian(cost);
  double sum = 0;
  int pairs = 0;
  for (size_t i = 0; i < m.partner.size(); ++i) {
    const int j = m.partner[i];
    m.cosine.push_back(j >= 0 ? cos[i][static_cast<size_t>(j)] : std::numeric_limits<double>::quiet_NaN());
    if (j >= 0) sum += cos[i][static_cast<size_t>(j)], ++pairs;
  }
  m.mean_cosine = pairs ? sum / pairs : 0.0;
  return m;
}

std::string feature_match_csv(const FeatureMatch& m) {
  std::string out = "feature_a,feature_b,cosine\n";
  for (size_t i = 0; i < m.partner.size(); ++i)
    out += std::to_string(i) + "," + (m.partner[i] >= 0 ? std::to_string(m.partner[i]) : std::string()) + "," + full(m.cosine[i]) + "\n";
  return out;
}

}  // namespace hl
