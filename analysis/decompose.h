// The residual stream as a sum of components, and direct logit attribution (DLA), with
// TransformerLens's names (decompose_resid, stack_head_results, accumulated_resid,
// apply_ln_to_stack, logit_attrs). Everything reads one forward's ActivationCache (of a pre-norm
// model, in eval mode) and computes in double, so the identities hold to float32 rounding of the
// cached activations:
//   sum of decompose_resid(layer) == the residual stream entering `layer`, and
//   sum of logit_attrs(apply_ln_to_stack(decompose_resid(n_layers))) + final_bias_term == the logit
//   (with final_softcap: the logit before the cap).
// The norms may be any NormKind (the RMS forms are not centred and have no bias; rmsnorm_1p's gain
// is 1 + weight). A parallel block adds its attention and MLP outputs to the same residual; a
// sandwich norm's output is split over the heads with its cached hook_scale (ln1_post), its bias
// being a component of its own ("{l}_attn_norm_bias", layer norm only); hook_mlp_out is already
// after ln2_post.
// Component labels (in this order): "embed", "pos_embed", then per layer l < layer the heads
// "L{l}H{h}" (each head's hook_result), "{l}_attn_bias" (W_O's bias, when the model has
// attention biases), "{l}_attn_norm_bias" (sandwich layer norm's bias) and "{l}_mlp_out" (when the
// model has MLPs).
#pragma once
#include <string>
#include <vector>

#include "datasets/task.h"
#include "models/transformer.h"

namespace hl {

// Components stacked on the first axis: values (C, B, T, d_model) for every position, or
// (C, B, d_model) for one position; row-major doubles.
struct ResidStack {
  std::vector<std::string> labels;  // C of them
  std::vector<int64_t> shape;       // (C, B, T, D) or (C, B, D)
  std::vector<double> values;
  int64_t components() const { return shape.empty() ? 0 : shape[0]; }
};

// The hook points these functions read: hook_embed, hook_pos_embed, every attn.hook_result,
// hook_mlp_out, hook_resid_pre/post and the layer norms' hook_scale. run_with_cache(ids,
// decomposition_hooks()) caches them (hook_result is made only when asked for).
NameFilter decomposition_hooks();

// The components whose sum is the residual stream entering `layer` (0..n_layers; n_layers = the
// final residual, before ln_final). pos -1 = every position, else that position only.
ResidStack decompose_resid(const TransformerLM& model, const ActivationCache& cache, int layer, int64_t pos = -1);
// Only the heads of layers before `layer`: (layer * heads, ...), labels "L{l}H{h}".
ResidStack stack_head_results(const TransformerLM& model, const ActivationCache& cache, int layer, int64_t pos = -1);
// The residual stream entering each layer up to and including `layer` (labels "{l}_pre"), and for
// layer == n_layers also the final one ("final_post"): the logit lens's inputs.
ResidStack accumulated_resid(const TransformerLM& model, const ActivationCache& cache, int layer, int64_t pos = -1);
// Each component centred (its mean over d_model removed) and divided by the cached scale of the
// layer norm that reads the residual entering `layer` (ln_final.hook_scale for n_layers, else
// blocks.{layer}.ln1.hook_scale): what that layer norm makes of it, before its weight and bias.
// pos must be the stack's (-1 for (C, B, T, D)).
ResidStack apply_ln_to_stack(const TransformerLM& model, const ActivationCache& cache, const ResidStack& stack, int layer,
                             int64_t pos = -1);

// Each component projected on the answer token's unembedding direction through ln_final's
// weight, ln_final.weight * W_U[:, token] (minus the incorrect token's when given): (C, B, T) or
// (C, B). tokens: one id for every position (shape {}) or one per position of the stack ((B, T)
// or (B)).
struct TokenChoice {
  std::vector<int64_t> shape;  // {} = one token for all, else the stack's (B, T) or (B)
  std::vector<int32_t> ids;
};
ResidStack logit_attrs(const TransformerLM& model, const ResidStack& scaled, const TokenChoice& tokens,
                       const TokenChoice* incorrect = nullptr);
// ln_final.bias . W_U[:, token] + the unembedding bias (minus the incorrect token's): the part of
// the logit that no component carries.
double final_bias_term(const TransformerLM& model, int32_t token, int32_t incorrect = -1);

// Cross-entropy at each position: logits (B, T, V), targets (B, T') with T' <= T read against the
// first T' positions; -1 = not counted (loss 0 there). (B, T') row-major, in double.
std::vector<double> per_token_loss(const Tensor& logits, const Ids& targets);

// Direct logit attribution on held-out data: at every counted target of every row, each
// component of the final residual projected on the target token's direction. Per component,
// per row: the mean over the row's counted positions.
struct DlaResult {
  std::vector<std::string> labels;  // decompose_resid(n_layers)'s
  std::vector<int> layer, head;     // per component; -1 when not a layer's / not a head
  std::vector<std::vector<double>> per_row;  // [component][row]
  std::vector<double> bias_per_row;          // final_bias_term, averaged likewise
  std::vector<double> logit_per_row;         // the target's logit, averaged likewise (final_softcap: before the cap)
  int64_t positions = 0;                     // counted positions in all
};
DlaResult direct_logit_attribution(TransformerLM& model, const std::vector<Batch>& data);

}  // namespace hl
