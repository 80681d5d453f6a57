#include "analysis/feature_study.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "analysis/features.h"

namespace hl {

namespace {

// Row `row` of data (rows counted across batches) as (1, n) ids: its tokens, without padding.
Ids data_row(const std::vector<Batch>& data, int64_t row) {
  for (const Batch& b : data) {
    if (row < b.size()) {
      const int64_t T = b.inputs.shape[1], n = b.row_tokens(row);
      return Ids(Shape{1, n}, std::vector<int32_t>(b.inputs.data.begin() + row * T, b.inputs.data.begin() + row * T + n));
    }
    row -= b.size();
  }
  fail("feature study: no row ", row, " in the data");
}

}  // namespace

FeatureStudy feature_study(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data, const FeatureStudyOptions& o) {
  HL_CHECK(!data.empty(), "feature study: no data");
  HL_CHECK(o.top_features >= 1 && o.examples >= 1 && o.before >= 0 && o.after >= 0 && o.logit_tokens >= 0,
           "feature study: top_features and examples must be at least 1, the window and logit_tokens at least 0");
  FeatureStudy s;
  s.hook = sae.cfg.hook_name;
  s.d_sae = sae.cfg.d_sae;
  s.presence = feature_presence(model, sae, data);
  s.tokens = s.presence.tokens;
  std::vector<int> features = o.features;
  if (features.empty()) {  // the most often firing, then the earlier feature
    std::vector<int> order(static_cast<size_t>(sae.cfg.d_sae));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return s.presence.firing_frequency[a] > s.presence.firing_frequency[b]; });
    features.assign(order.begin(), order.begin() + std::min<size_t>(order.size(), static_cast<size_t>(o.top_features)));
  }
  const bool on_z = hook_layer(s.hook) >= 0 && s.hook == attn_hook(hook_layer(s.hook), "z");
  if (on_z) s.heads = model.cfg.n_heads, (void)hook_z_layer(model, sae);  // refuses another width
  const bool logits = on_z && model.cfg.norm == Norm::Pre && !model.cfg.sandwich_norm;
  if (logits) s.final_scale = final_norm_scale(model, data);
  const std::vector<FeatureExamples> top = top_activating_examples(model, sae, data, features, o.examples, o.before, o.after);
  const Tensor fractions = on_z ? decoder_head_fractions(sae, s.heads) : Tensor();
  const std::vector<FeatureLogitEffect> effects =
      logits ? feature_logit_effects(model, sae, features, s.final_scale, o.logit_tokens) : std::vector<FeatureLogitEffect>();
  FeatureAblation ablation;
  if (o.ablate) ablation = feature_ablation_effects(model, sae, data, features), s.base_loss = ablation.base_loss;
  for (size_t i = 0; i < features.size(); ++i) {
    const int j = features[i];
    FeatureCard c;
    c.feature = j;
    c.firing_frequency = s.presence.firing_frequency[j], c.mean_activation = s.presence.mean_activation[j];
    if (on_z)
      for (int h = 0; h < s.heads; ++h) c.head_fraction.push_back(fractions.at({j, h}));
    if (logits) {
      for (int32_t t : effects[i].promoted) c.promoted.emplace_back(t, effects[i].logits[t]);
      for (int32_t t : effects[i].suppressed) c.suppressed.emplace_back(t, effects[i].logits[t]);
    }
    if (o.ablate) c.ablation_loss_change = ablation.loss_change[i];
    for (const FeatureExample& e : top[i].examples) {
      FeatureCard::Example ex;
      ex.top = e;
      if (on_z) {
        const FeatureSourceAttribution a = feature_source_attribution(model, sae, data_row(data, e.row), j);
        const int64_t q = e.position;
        for (size_t t = 0; t < e.tokens.size(); ++t) {
          const int64_t src = e.window_start + static_cast<int64_t>(t);
          double v = 0;
          for (int h = 0; h < s.heads; ++h) v += a.at(0, q, h, src);
          ex.source.push_back(src > q ? std::numeric_limits<double>::quiet_NaN() : v);
        }
        for (int h = 0; h < s.heads; ++h) {
          double v = 0;
          for (int64_t src = 0; src <= q; ++src) v += a.at(0, q, h, src);
          ex.by_head.push_back(v);
        }
        ex.bias = a.bias;
      }
      c.examples.push_back(std::move(ex));
    }
    s.cards.push_back(std::move(c));
  }
  return s;
}

std::string feature_study_csv(const FeatureStudy& s) {
  auto full = [](double v) {
    if (!std::isfinite(v)) return std::string();
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return std::string(buf);
  };
  std::string out = "feature,firing_frequency,mean_activation";
  for (int h = 0; h < s.heads; ++h) out += ",head_fraction_" + std::to_string(h);
  out += ",ablation_loss_change,promoted,suppressed\n";
  for (const FeatureCard& c : s.cards) {
    out += std::to_string(c.feature) + "," + full(c.firing_frequency) + "," + full(c.mean_activation);
    for (double v : c.head_fraction) out += "," + full(v);
    out += "," + full(c.ablation_loss_change) + ",";
    for (size_t i = 0; i < c.promoted.size(); ++i) out += (i ? " " : "") + std::to_string(c.promoted[i].first);
    out += ",";
    for (size_t i = 0; i < c.suppressed.size(); ++i) out += (i ? " " : "") + std::to_string(c.suppressed[i].first);
    out += "\n";
  }
  return out;
}

}  // namespace hl
