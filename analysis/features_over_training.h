// One sparse autoencoder's features followed over a run: the SAE applied to the model at every
// step given (how present each feature is at each step: mean activation and firing frequency
// over the same data), and the features of two SAEs (trained at two snapshots, or on a fork and
// its original) matched one to one by the cosine of their decoder rows (Hungarian matching,
// analysis/matching.h). Reading a run's snapshots is the caller's (train/snapshots.h): this file
// takes the models through a loader.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/feature_attribution.h"

namespace hl {

struct FeaturesOverTraining {
  std::vector<int64_t> steps;
  int64_t features = 0, tokens = 0;
  // [step index][feature]
  std::vector<std::vector<double>> mean_activation, firing_frequency;
};
// load(i) gives the model at steps[i]; the SAE's hook must be one of its hook points with the
// SAE's width. progress(done, total, step) after each step.
FeaturesOverTraining features_over_training(const std::vector<int64_t>& steps,
                                            const std::function<std::unique_ptr<TransformerLM>(size_t)>& load,
                                            const Sae& sae, const std::vector<Batch>& data,
                                            const std::function<void(size_t, size_t, int64_t)>& progress = {});
// step,feature,mean_activation,firing_frequency (full float precision)
std::string features_over_training_csv(const FeaturesOverTraining& f);

// cos[i][j] between decoder row i of a and row j of b (d_sae_a x d_sae_b; a zero row gives 0).
std::vector<std::vector<double>> decoder_cosines(const Sae& a, const Sae& b);
// The one-to-one assignment of a's features to b's of largest total decoder cosine.
struct FeatureMatch {
  std::vector<int> partner;     // (d_sae_a): b's feature matched to a's feature i, -1 = none (b smaller)
  std::vector<double> cosine;   // (d_sae_a): the pair's cosine (NaN without partner)
  double mean_cosine = 0;       // over the pairs
};
FeatureMatch match_sae_features(const Sae& a, const Sae& b);
// feature_a,feature_b,cosine
std::string feature_match_csv(const FeatureMatch& m);

}  // namespace hl
