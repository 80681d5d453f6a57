// Ablations by hook name, as TransformerLens users write them: any hook point's activation
// replaced by zeros, by its mean over a dataset (per position or over all positions), or by the
// activation of another prompt (resampling, a fixed permutation of the examples from a seed),
// restricted to one head (for hooks with a head axis) and to chosen positions. The result is the
// loss and accuracy of the ablated run beside the clean run's, per example and overall.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/evaluate.h"
#include "analysis/intervals.h"
#include "datasets/task.h"
#include "models/transformer.h"

namespace hl {

// Which axes of a hook point's activation hold the batch row, the position and the head (-1:
// none). The position of hook_pattern and hook_attn_scores is the query's; src_pos the key's.
// `feature`: the SAE feature axis of an attached SAE's hook_sae_acts_pre / hook_sae_acts_post (d_sae).
struct HookAxes {
  int ndim = 0, batch = -1, pos = -1, head = -1, src_pos = -1, feature = -1;
  int64_t heads = 0;  // the head axis's size (kv heads for hook_k, hook_v and their inputs)
};
// Fails naming the hook when the model has no such hook point.
HookAxes hook_axes(const ModelConfig& cfg, const std::string& name);
// The same for a model's hook points, those of its attached SAEs included (TransformerLM::add_sae).
HookAxes hook_axes(const TransformerLM& model, const std::string& name);

enum class AblationKind { Zero, Mean, Resample };
AblationKind parse_ablation_kind(const std::string& s);  // zero, mean or resample
std::string to_string(AblationKind k);

// Where an ablation replaces the activation: hook point, head (-1 = every head, or a hook
// without a head axis) and positions (empty = all).
struct AblationSite {
  std::string hook;  // a full name: "blocks.1.attn.hook_z"
  int head = -1;
  std::vector<int64_t> positions;
};
// Fails with one message naming what is wrong (unknown hook, head out of range, head given for a
// hook without heads, position outside 0..T-1 when T is known (T > 0)).
void check_ablation_site(const ModelConfig& cfg, const AblationSite& site, int64_t T = 0);

// x with the elements at the site's head and positions replaced by `value`'s, the others kept
// bit for bit: value undefined = zeros; else value has x's shape, or x's with the batch axis
// (and the position axis) of size 1 (a mean, broadcast). Differentiable in x (and value).
Tensor ablated_activation(const Tensor& x, const HookAxes& axes, const AblationSite& site, const Tensor& value = Tensor());

// The mean of activation `hook` over the rows (and, unless per_position, the positions) of
// `data`, padding left out: x's shape with the batch axis (and the position axis) of size 1.
// Accumulated in double: the mean of copies of one activation is that activation exactly.
Tensor mean_activation(TransformerLM& model, const std::vector<Batch>& data, const std::string& hook, bool per_position);

struct AblationOptions {
  AblationSite site;
  AblationKind kind = AblationKind::Zero;
  bool per_position = false;     // mean: per position (else one mean over every position)
  std::vector<Batch> mean_data;  // mean: the data averaged over (empty = the evaluated data)
  uint64_t seed = 0;             // resample: example i takes example permutation[i]'s activation,
  std::vector<int64_t> permutation;  //   the permutation from the seed unless given (size = examples)
};

struct KnockoutResult {
  // per example, in data's order: the mean loss over its counted targets, and the fraction of
  // them predicted right (argmax), clean and ablated
  std::vector<double> clean_loss, ablated_loss, clean_acc, ablated_acc;
  std::vector<int64_t> counted;  // counted targets per example
  std::vector<int64_t> permutation;  // resample: the permutation used (else empty)
  // over every counted target (as evaluate() weighs them)
  double clean_mean_loss = 0, ablated_mean_loss = 0, clean_token_acc = 0, ablated_token_acc = 0;
  // 95% bootstrap intervals over the examples of the token-weighted loss and accuracy, and of
  // the ablated - clean differences (paired)
  Interval clean_loss_ci95, ablated_loss_ci95, d_loss_ci95, clean_acc_ci95, ablated_acc_ci95, d_acc_ci95;
};
// About how many bytes knockout needs for `examples` rows of T tokens in batches of `batch`: one
// forward of a batch, and for resample every example's activation twice (recorded, and gathered
// per batch). An upper estimate for refusing what cannot fit.
double knockout_memory_bytes(const ModelConfig& cfg, const std::string& hook, AblationKind kind, int64_t examples, int64_t T,
                             int64_t batch);
// Runs `data` clean and ablated (dropout off, no graph). Both runs take the same forward path
// (hooks present), so an ablation that replaces nothing changes nothing, bit for bit.
KnockoutResult knockout(TransformerLM& model, const std::vector<Batch>& data, const AblationOptions& opt);

// The permutation resampling uses for n examples and a seed: a random cyclic permutation
// (Sattolo's algorithm), so for n > 1 no example keeps its own activation.
std::vector<int64_t> resample_permutation(int64_t n, uint64_t seed);

}  // namespace hl
