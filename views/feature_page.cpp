#include "views/feature_page.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>

#include "views/pages.h"

namespace hl::views {

namespace {

using json = nlohmann::json;

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

extern const std::string_view kFeatureViewPage;  // views/feature_view.html, embedded by CMake

std::string feature_page(const FeatureStudy& s, const std::string& title, const std::function<std::string(int32_t)>& token_text,
                         bool compact) {
  json features = json::array();
  for (const FeatureCard& c : s.cards) {
    json promoted = json::array(), suppressed = json::array(), examples = json::array();
    for (const auto& [t, v] : c.promoted) promoted.push_back({{"token", token_text(t)}, {"id", t}, {"logit", num(v)}});
    for (const auto& [t, v] : c.suppressed) suppressed.push_back({{"token", token_text(t)}, {"id", t}, {"logit", num(v)}});
    for (const FeatureCard::Example& e : c.examples) {
      json tokens = json::array(), acts = json::array(), source = json::array(), by_head = json::array();
      for (int32_t t : e.top.tokens) tokens.push_back(token_text(t));
      for (double v : e.top.activations) acts.push_back(num(v));
      for (double v : e.source) source.push_back(num(v));
      for (double v : e.by_head) by_head.push_back(num(v));
      examples.push_back({{"row", e.top.row}, {"position", e.top.position}, {"start", e.top.window_start}, {"max", num(e.top.max_activation)},
                          {"tokens", tokens}, {"activations", acts}, {"source", source}, {"by_head", by_head}, {"bias", num(e.bias)}});
    }
    features.push_back({{"feature", c.feature}, {"firing_frequency", num(c.firing_frequency)}, {"mean_activation", num(c.mean_activation)},
                        {"head_fraction", c.head_fraction}, {"promoted", promoted}, {"suppressed", suppressed},
                        {"ablation", num(c.ablation_loss_change)}, {"examples", examples}});
  }
  std::string subtitle = "SAE on " + s.hook + ": " + std::to_string(s.d_sae) + " features, read over " + std::to_string(s.tokens) +
                         " tokens";
  if (std::isfinite(s.base_loss)) subtitle += "; loss with nothing ablated " + std::to_string(s.base_loss);
  return fill_page(kFeatureViewPage, {{"title", title}, {"subtitle", subtitle}, {"heads", s.heads}, {"compact", compact}, {"features", features}});
}

}  // namespace hl::views
