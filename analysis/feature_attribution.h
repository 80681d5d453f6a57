// What a sparse autoencoder's features on a layer's attention output mean for the model
// (Kissane et al. 2024, "Interpreting attention layer outputs with sparse autoencoders"): for an
// SAE on blocks.L.attn.hook_z (heads concatenated, d_in = n_heads * d_head, models/sae.h),
//  - each feature's decoder row split into its heads' blocks (decoder_head_fractions,
//    analysis/features.h) and carried through each head's W_O into the residual stream
//    (feature_head_outputs), and from there through ln_final and W_U onto the tokens
//    (feature_logit_effects: the tokens it promotes and suppresses);
//  - direct feature attribution by source position: hook_z of head h at query q is
//    g_h sum_s pattern[h, q, s] v[h, s] (g the head gates, v with its bias), so the feature's
//    pre-activation is exactly
//      sum_h sum_s g_h pattern[h, q, s] (v[h, s] . W_enc[block h, j]) + b_enc[j] - b_dec . W_enc[:, j]
//    (the b_dec term only with apply_b_dec_to_input; with layer_norm each query's terms use the
//    encoder column centred and are divided by the query's std + eps): feature_source_attribution;
//  - top-activating examples with per-token activations over data (top_activating_examples);
//  - features as nodes: the SAE spliced in with chosen features edited (sae_splice_edited),
//    and each feature's ablation effect on the task's loss (feature_ablation_effects).
// Everything is forward-only, in eval mode, without a graph.
#pragma once
#include <string>
#include <vector>

#include "datasets/task.h"
#include "models/sae.h"
#include "models/transformer.h"

namespace hl {

// The layer of an SAE on blocks.L.attn.hook_z whose width is this model's n_heads * d_head;
// fails in one line naming the SAE's hook and width otherwise.
int hook_z_layer(const TransformerLM& model, const Sae& sae);

// Each feature's decoder block of head h through head h's W_O: (d_sae, n_heads, d_model), what
// one unit of the feature writes into the residual stream through that head (W_O's bias not
// included: it is not the feature's). Summed over heads: the feature's direct output.
Tensor feature_head_outputs(const TransformerLM& model, const Sae& sae);

// A feature's direct effect on the logits per unit of activation: its direct output, through
// ln_final with the given scale (the mean of ln_final.hook_scale over data: final_norm_scale),
// centred for a layer norm, times ln_final's gain, then W_U. Logits before a final soft-cap.
// Sandwich norms (an attention output normalised before the residual) have no such direct path
// and are refused, as are post-norm models.
struct FeatureLogitEffect {
  int feature = 0;
  std::vector<double> logits;               // (vocab)
  std::vector<int32_t> promoted, suppressed;  // the top_k tokens of largest / smallest effect, in order
};
std::vector<FeatureLogitEffect> feature_logit_effects(const TransformerLM& model, const Sae& sae,
                                                      const std::vector<int>& features, double final_scale, int top_k = 10);
// The mean of ln_final.hook_scale over every token of data, padding left out (1 without a final norm).
double final_norm_scale(TransformerLM& model, const std::vector<Batch>& data);

// Feature `feature`'s pre-activation at every query of ids (B, T) decomposed over the heads and
// attended source positions. contribution[((b * T + q) * H + h) * T + s]; sources after q are 0
// (causal). sum over (h, s) of contribution + bias == pre_activation[b * T + q] up to float
// rounding; where the feature is active its activation equals the pre-activation for standard,
// topk and jumprelu SAEs (batchtopk: where it passes the threshold). With key_padding (B, T),
// 1 = padding, on either side of each row's tokens (models/padding.h), the forward runs with it:
// each row's tokens give what the row alone gives, in their columns; a padding query has no
// contribution and a NaN pre-activation and activation.
struct FeatureSourceAttribution {
  int feature = 0, heads = 0;
  int64_t batch = 0, tokens = 0;
  std::vector<double> contribution;    // (B, T, H, T)
  double bias = 0;                     // b_enc[j] - b_dec . W_enc[:, j]
  std::vector<double> pre_activation;  // (B, T) from the SAE's own encoder on the cached hook_z
  std::vector<double> activation;      // (B, T) the feature's activation (inference encode)
  double at(int64_t b, int64_t q, int h, int64_t s) const {
    return contribution[static_cast<size_t>(((b * tokens + q) * heads + h) * tokens + s)];
  }
};
FeatureSourceAttribution feature_source_attribution(TransformerLM& model, const Sae& sae, const Ids& ids, int feature,
                                                    const Tensor& key_padding = Tensor());

// One top-activating example: the window of a row around the token where the feature is largest.
struct FeatureExample {
  int64_t row = 0, position = 0;        // in the data, rows counted across batches
  double max_activation = 0;            // at `position`
  int64_t window_start = 0;             // first position shown
  std::vector<int32_t> tokens;          // the window's ids
  std::vector<double> activations;      // the feature's activation at each of them
};
struct FeatureExamples {
  int feature = 0;
  std::vector<FeatureExample> examples;  // at most k, largest first; rows where the feature never fires are left out
};
// The SAE's activations at its hook over every row of data; per feature, the k rows of largest
// activation (one example per row, at its largest token; ties: the earlier row), each with
// `before` tokens before that token and `after` after it (within the row's tokens: padding is
// never an example nor in a window).
std::vector<FeatureExamples> top_activating_examples(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data,
                                                     const std::vector<int>& features, int k = 10, int before = 8, int after = 2);

// How present each feature is over data: mean activation and firing frequency (active tokens /
// tokens), per feature, over every token of every row (padding not counted).
struct FeaturePresence {
  std::vector<double> mean_activation, firing_frequency;  // (d_sae)
  int64_t tokens = 0;
};
FeaturePresence feature_presence(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data);

// The splice (models/sae.h) with `features` edited: their activations set to `value` (0 =
// ablated) before decoding. keep_error: the SAE's error x - x_hat is added back, so the spliced
// model with nothing edited is the model itself and editing feature i by delta adds delta W_dec[i]
// to the activation (ablating it subtracts f_i W_dec[i]): features as nodes of the model's own
// computation. Without: the model with the SAE's reconstruction in place.
ForwardHook sae_splice_edited(const Sae& sae, const std::vector<int>& features, float value = 0.f, bool keep_error = true);

// Each feature's ablation effect on the task's loss: the mean loss over data with the SAE
// spliced in (keep_error as above) and the feature set to 0, minus that loss with no feature
// edited. With keep_error the base is the model's own loss; without, the loss of the model with
// the SAE's reconstruction.
struct FeatureAblation {
  double base_loss = 0;                 // nothing ablated
  std::vector<int> features;
  std::vector<double> loss_change;      // per feature: ablated loss - base_loss
};
FeatureAblation feature_ablation_effects(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data,
                                         const std::vector<int>& features, bool keep_error = true);

}  // namespace hl
