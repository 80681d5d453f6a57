// An SAE's features studied together, for the feature view (views/feature_page.h) and the
// tables of `headlab features` and Python: presence over data, then per chosen feature its
// top-activating examples, the source-position attribution of each example's largest
// activation, the split of its decoder over the heads, its direct logit effect and its ablation
// effect on the loss (analysis/feature_attribution.h). One function for both doors.
#pragma once
#include <limits>
#include <string>
#include <vector>

#include "analysis/feature_attribution.h"

namespace hl {

struct FeatureStudyOptions {
  std::vector<int> features;   // empty: the `top_features` most often firing ones
  int top_features = 8;
  int examples = 5, before = 8, after = 2;  // top examples: k and the window around the max
  int logit_tokens = 5;        // promoted / suppressed tokens shown
  bool ablate = true;          // each feature's ablation effect on the loss (one pass over data each)
};

struct FeatureCard {
  int feature = 0;
  double firing_frequency = 0, mean_activation = 0;
  std::vector<double> head_fraction;  // (H): the decoder's squared norm per head; empty off hook_z
  std::vector<std::pair<int32_t, double>> promoted, suppressed;  // direct logit effect per unit; empty off hook_z
  double ablation_loss_change = std::numeric_limits<double>::quiet_NaN();
  struct Example {
    FeatureExample top;
    // the max's pre-activation over the window's source positions, summed over heads (NaN
    // after the max: not attended), and over heads summed over sources; empty off hook_z
    std::vector<double> source;
    std::vector<double> by_head;
    double bias = 0;
  };
  std::vector<Example> examples;
};

struct FeatureStudy {
  std::string hook;
  int heads = 0;                 // 0 when the SAE is not on hook_z
  int64_t d_sae = 0, tokens = 0;
  double final_scale = 1;        // ln_final's mean scale used by the logit effects
  double base_loss = std::numeric_limits<double>::quiet_NaN();  // the loss nothing ablated
  FeaturePresence presence;      // every feature
  std::vector<FeatureCard> cards;
};

// Runs the analyses for the chosen features over data.
FeatureStudy feature_study(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data, const FeatureStudyOptions& o);
// feature,firing_frequency,mean_activation,head_fraction_0..H-1,ablation_loss_change,promoted,suppressed
// (promoted/suppressed: token ids separated by spaces) for the cards' features.
std::string feature_study_csv(const FeatureStudy& s);
}  // namespace hl
