// Head-level analyses for `headlab prune` (and users): single-head ablation, Michel et al.
// (2019) importance, mean head outputs, attention statistics (Voita et al. 2019), and
// iterative pruning through the head gates.
#pragma once
#include <functional>
#include <vector>

#include "datasets/task.h"
#include "models/transformer.h"
#include "analysis/evaluate.h"

namespace hl {

using HeadGrid = std::vector<std::vector<double>>;  // [layer][head]

// Forward pass of one batch with dropout off and no graph, recording the activations whose
// names pass `filter` (hook names, models/hooks.h).
ActivationCache recorded_forward(TransformerLM& model, const Batch& batch, NameFilter filter);

// Mean of each layer's head outputs z (before W_O) over the non-padding positions: (H*d_head).
std::vector<Tensor> mean_head_outputs(TransformerLM& model, const std::vector<Batch>& data);

struct AblationResult {
  HeadGrid d_loss, d_acc;            // zero-ablation: change in held-out loss and token accuracy
  HeadGrid d_loss_mean, d_acc_mean;  // mean-ablation
  // 95% bootstrap intervals of d_loss and d_loss_mean over the held-out examples
  HeadGrid d_loss_ci95_lo, d_loss_ci95_hi, d_loss_mean_ci95_lo, d_loss_mean_ci95_hi;
  EvalResult base;
};
// Ablates each head alone (zero, then mean) and evaluates on `data`.
AblationResult single_head_ablation(TransformerLM& model, const std::vector<Batch>& data);
inline AblationResult single_head_ablation(TransformerLM& model, const Task&, const std::vector<Batch>& data) {
  return single_head_ablation(model, data);  // the rows' targets are all a task would give
}

// Head importance as Michel, Levy and Neubig (2019, "Are Sixteen Heads Really Better than One?")
// define it: I_h = (1/N) sum over examples x of |dL(x)/dxi_h|, xi_h a gate on head h's output
// and L(x) the example's mean loss over its counted targets. z_h is the gated head output, so
// dL(x)/dxi_h = sum over x's tokens t of sum_d z_h[t,d] dL(x)/dz_h[t,d] (at gate 1; a gate
// of 0 scores 0). N counts the examples with a counted target. With normalize_per_layer each
// layer is divided by its l2 norm, as their code does.
// With per_example, each example's |dL(x)/dxi_h| too (before any normalisation), e.g. for intervals.
HeadGrid head_importance(TransformerLM& model, const std::vector<Batch>& data, bool normalize_per_layer,
                         std::vector<HeadGrid>* per_example = nullptr);
// The token-level variant: (1/n) sum over every non-padding position t of
// |sum_d z_h[t,d] dL/dz_h[t,d]|, L the summed token loss and n the counted targets: the absolute
// value per position, not per example. Same normalisation option.
HeadGrid head_importance_per_token(TransformerLM& model, const std::vector<Batch>& data, bool normalize_per_layer);
// dL/dg for every gate, L the summed token loss over `data` (for tests and users).
HeadGrid gate_gradients(TransformerLM& model, const std::vector<Batch>& data);

struct HeadStats {
  HeadGrid entropy, entropy_norm, confidence, argmax_distance;
};
// Over non-padding queries: entropy -sum A log A (and divided by log #visible keys), confidence
// (max weight, Voita et al.), mean |i - argmax_j A_ij|.
HeadStats attention_statistics(TransformerLM& model, const std::vector<Batch>& data);

struct PruneStep {
  int pruned = 0;  // heads removed so far
  double fraction = 0;
  EvalResult eval;
  std::vector<std::pair<int, int>> removed;  // (layer, head) removed at this step
};
struct PruneOptions {
  double step_fraction = 0.1;  // of all heads per step (at least one head)
  int min_per_layer = 0;
  bool recompute = false;      // re-rank after each step (importance order only)
  int finetune_steps = 0;      // between steps
  std::function<void(TransformerLM&, int steps)> finetune;  // trains the model in place
};
// Scores uniform in [0, 1) from `seed`: ranked by prune_curve, a random pruning order (baseline).
HeadGrid random_ranking(int n_layers, int n_heads, uint64_t seed);
// Removes heads (gate = 0) in the order given by `rank` (lowest score first), re-asking rank
// after each step when opts.recompute; evaluates after every step.
std::vector<PruneStep> prune_curve(TransformerLM& model, const std::vector<Batch>& data,
                                   const std::function<HeadGrid(TransformerLM&)>& rank, const PruneOptions& opts);
inline std::vector<PruneStep> prune_curve(TransformerLM& model, const Task&, const std::vector<Batch>& data,
                                          const std::function<HeadGrid(TransformerLM&)>& rank, const PruneOptions& opts) {
  return prune_curve(model, data, rank, opts);  // the rows' targets are all a task would give
}

}  // namespace hl
