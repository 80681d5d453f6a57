// Circuit discovery on the edges of edges.h (docs/circuits.md): methods that score or select
// edges, each returning one value per edge in model_edges order (the order of edge_patching's
// result), and the circuit run that measures a set of kept edges.
//
// EAP-IG (Hanna et al. 2024): the attribution delta_s . dm/d(r's input), with the gradient
// averaged over `steps` runs along a path from the corrupted run (alpha 0) to the clean run
// (alpha 1), at alpha = k / steps for k = 1..steps (the right Riemann sum, so one step is the
// clean run: edge attribution).
//   inputs:      the token embedding interpolated, clean + (1 - alpha) (corrupted - clean);
//                everything downstream follows.
//   activations: per sender layer (the embedding, or attention layer l), that layer's outputs
//                interpolated the same way, the rest of the run recomputed; an edge from a sender of
//                that layer takes its gradients from that layer's runs; with the MLP-sender edges,
//                each MLP's output (hook_mlp_out) is interpolated the same way for its edges.
//   The clean run (alpha 1) is every point's last step, run once: 1 + points x (steps - 1) runs.
//
// The circuit run: the clean run in which each receiver r reads its input in that run plus, for
// every edge s -> r not kept, out_s(corrupted) - out_s(this run) (ACDC's and MIB's edge
// ablation: a removed edge carries the corrupted run's value of its sender). Its edges: model_edges
// and the MLP-sender edges (mlp_sender_edge_list, an MLP's out_s its hook_mlp_out), the edges
// exact patching and the attribution score.
//
// ACDC (Conmy et al. 2023): receivers from the logits back, each one's senders in reverse order;
// an edge is removed when the circuit run without it changes the score by less than `threshold`
// (metric: |m_new - m_current|; kl: KL_new - KL_current); a receiver's senders are the embedding,
// the heads and the MLPs before it. A receiver whose head or MLP no kept edge reads loses its
// edges without a run (they cannot change anything).
#pragma once
#include <string>
#include <vector>

#include "analysis/edges.h"

namespace hl {

struct EapIgOptions {
  enum Interpolate { Inputs, Activations } interpolate = Inputs;
  int steps = 5;  // 1..1000
  // The rows run in this many groups of like length, each cut after its rows' last answer (the
  // scores the same to rounding, fewer positions per step); 0: 4 from 32 rows when steps > 1, else
  // 1 (one step is then the attribution bit for bit). 0..64.
  int row_groups = 0;
};
// "inputs" / "activations"
const char* interpolation_name(EapIgOptions::Interpolate i);
EapIgOptions::Interpolate parse_interpolation(const std::string& name);

// EAP-IG's score of every edge, model_edges order, and with `mlp_scores` (a model with MLPs) those
// of the MLP-sender edges (mlp_sender_edges' order; empty for an attention-only model). Fails
// on a steps value out of range and on what edge_patching refuses.
std::vector<double> eap_ig_scores(TransformerLM& model, const PatchingInputs& in, const EapIgOptions& opt,
                                  std::vector<double>* mlp_scores = nullptr);

// AtP* (Kramar et al. 2024), edge by edge:
//   QK fix: an edge into a head's query or key input is scored by the head's output recomputed
//   exactly with that input + delta_s (its attention softmax at every query position, through ln1
//   and the projection), minus its clean output, dotted with the gradient at the head's output
//   (the sum of its readers' input gradients): only what follows the head is linearised. Other
//   edges keep the attribution delta_s . dm/d(r's input).
//   GradDrop: the same score with the gradient through layer l's residual contributions
//   (hook_attn_out, hook_mlp_out) set to 0, for each layer l, taken per prompt (row of the batch);
//   the score is the sum over the rows of the mean over the layers other than the receiver's own
//   of |the row's score with layer l dropped| (the paper's expectation over prompt pairs of
//   1/(L - 1) sum over l of |estimate l|, the receiver's own layer giving 0; the logits: all L
//   layers), with the sign of the undropped score. Without cancellation between paths or prompts
//   it is the score itself; where two paths cancel, dropping one shows the other.
struct AtpStarOptions {
  bool qk_fix = true, grad_drop = true;
};
// AtP*'s score of every edge, model_edges order, and with `mlp_scores` (a model with MLPs) those of
// the MLP-sender edges (mlp_sender_edges' order, the MLP's delta in place of delta_s; empty for an
// attention-only model). Refuses sandwich norms (a head's output is not what the residual stream
// adds) and what edge_patching refuses.
std::vector<double> atp_star_scores(TransformerLM& model, const PatchingInputs& in, const AtpStarOptions& opt = {},
                                    std::vector<double>* mlp_scores = nullptr);

// The circuit run's metric (and its mean KL(clean || circuit) over the answers' positions) with
// kept[i] saying whether edge i (model_edges order) is kept, and mlp_kept[i] MLP-sender edge i
// (mlp_sender_edge_list order; empty: every MLP-sender edge kept).
struct CircuitRun {
  double metric = 0, kl = 0;
};
CircuitRun circuit_run(TransformerLM& model, const PatchingInputs& in, const std::vector<bool>& kept,
                       const std::vector<bool>& mlp_kept = {});

struct AcdcOptions {
  enum Score { Metric, Kl } score = Metric;
  double threshold = 0.01;  // >= 0
};
struct AcdcResult {
  std::vector<bool> kept;      // model_edges order
  std::vector<double> scores;  // per edge, the change when its removal was tried (0: removed without a run)
  std::vector<bool> mlp_kept;      // the MLP-sender edges (mlp_sender_edge_list order; empty without MLPs)
  std::vector<double> mlp_scores;  // theirs, as scores
  CircuitRun final_run;        // the circuit of the kept edges
  int runs = 0;                // circuit runs made
};
AcdcResult acdc(TransformerLM& model, const PatchingInputs& in, const AcdcOptions& opt);

// The masked circuit run (edge pruning's relaxation of the circuit run): the clean run in which
// every receiver r reads its input + sum over its edges s -> r of (1 - mask_e) (out_s(corrupted) -
// out_s(this run)). mask_e 1 keeps edge e, 0 removes it as the circuit run does, values between
// mix the two; a 0/1 mask is the circuit run of its 1s. The mask: model_edges, then optionally the
// MLP-sender edges (mlp_sender_edge_list; not given: 1). With `gradients`, d metric / d mask and
// d KL / d mask from one backward.
struct MaskedRun {
  double metric = 0, kl = 0;
  std::vector<double> metric_grad, kl_grad;  // the mask's order; empty without gradients
};
MaskedRun masked_circuit_run(TransformerLM& model, const PatchingInputs& in, const std::vector<double>& mask, bool gradients);

// Edge pruning (Bhaskar et al. 2024): a hard-concrete mask z_e in [0, 1] on every edge, MLP-sender
// edges included (Louizos et
// al. 2018: log_alpha_e learned; beta 2/3, stretched to (-0.1, 1.1) and clipped, one sample per
// step), the masked circuit run's KL(clean || circuit) at the answers minimised with Adam, with the
// paper's Lagrangian sparsity term lambda1 (s - t) + lambda2 (s - t)^2 on the expected fraction of
// edges kept s (the lambdas raised by gradient ascent) and a target t going linearly from every
// edge to target_edges over the first half of the steps. The circuit: the target_edges edges of
// largest log_alpha among all of them; their circuit run is measured.
struct EdgePruningOptions {
  int target_edges = 0;  // 1..the model's edges with the MLP-sender edges
  int steps = 200;       // 1..100000
  double lr = 0.1;       // Adam's step on log_alpha, (0, 10]
  uint64_t seed = 0;     // the hard-concrete samples
};
struct EdgePruningResult {
  std::vector<double> keep_probability;  // per edge, P(z_e > 0) at the end: its score
  std::vector<bool> kept;                // model_edges order: the circuit
  std::vector<double> mlp_keep_probability;  // the MLP-sender edges' (mlp_sender_edge_list order)
  std::vector<bool> mlp_kept;                // the circuit's MLP-sender edges
  CircuitRun final_run;                  // the circuit run of `kept`
  double final_kl = 0;                   // the last step's sampled KL
};
EdgePruningResult edge_pruning(TransformerLM& model, const PatchingInputs& in, const EdgePruningOptions& opt);
// The edges a circuit is made of: model_edges and the MLP-sender edges (mlp_sender_edge_list).
size_t circuit_edge_count(const ModelConfig& cfg);
// The names of a circuit's kept edges, "L0H0->mlp0" then "mlp0->L1H0.v" (both doors print these).
std::vector<std::string> circuit_edge_names(const ModelConfig& cfg, const std::vector<bool>& kept, const std::vector<bool>& mlp_kept);
// One line for an option out of range; the target against `edges` (circuit_edge_count; 0: the
// model not known yet, the target not checked).
void check_edge_pruning_options(const EdgePruningOptions& opt, size_t edges);

// The top `k` edges by |score| (ties: earlier edge first), as a kept mask; k in 0..edges.
std::vector<bool> top_edges(const std::vector<double>& scores, size_t k);
// The top `k` of the model edges and the MLP-sender edges ranked together by |score| (ties: model
// edges first, then in order): (model edges kept, MLP-sender edges kept). k in 0..both.
std::pair<std::vector<bool>, std::vector<bool>> top_edges(const std::vector<double>& scores, const std::vector<double>& mlp_scores,
                                                          size_t k);

// Faithfulness of the top-k circuits of `scores` for each k in sizes: the circuit run's metric.
struct FaithfulnessPoint {
  size_t edges = 0;
  double metric = 0;
};
std::vector<FaithfulnessPoint> faithfulness_curve(TransformerLM& model, const PatchingInputs& in,
                                                  const std::vector<double>& scores, const std::vector<size_t>& sizes);

// ---- the methods by name, scored against exact patching ------------------------------------------

// The methods of `headlab edges --method` and hl.edge_patching(method=): attribution, eap-ig,
// atp-star, acdc, edge-pruning.
std::vector<std::string> edge_method_names();
struct EdgeMethodOptions {
  std::string method = "attribution";
  EapIgOptions ig;
  AtpStarOptions atp;
  AcdcOptions acdc;
  EdgePruningOptions pruning;
};
// Fails naming the choices for an unknown method.
void check_edge_method(const std::string& method);
// "metric" / "kl", failing naming the choices.
AcdcOptions::Score parse_acdc_score(const std::string& name);
// One line for an unknown method or an option out of range (steps 1..1000, threshold >= 0; edge
// pruning's steps and lr), before any work. Edge pruning's target is checked when the model is known.
void check_edge_method_options(const EdgeMethodOptions& opt);

struct MethodScores {
  std::string method;
  std::vector<double> scores;  // model_edges order; acdc: the change when its removal was tried
  std::vector<bool> circuit;   // acdc, edge-pruning: the edges it kept; other methods: empty
  std::vector<double> mlp_scores;  // the MLP-sender edges' (mlp_sender_edges order); attribution: empty
  std::vector<bool> mlp_circuit;   // acdc, edge-pruning: the MLP-sender edges kept; others: empty (every one kept)
  double seconds = 0;          // wall-clock time of the method alone (the attribution: its own backward)
};
// One method's scores. The attribution is taken from `exact` (edge_patching's result).
MethodScores run_edge_method(TransformerLM& model, const PatchingInputs& in, const EdgeResult& exact, const EdgeMethodOptions& opt);

// Spearman's rank correlation of |a| and |b| (ties share their mean rank); 0 when either is constant.
double rank_correlation(const std::vector<double>& a, const std::vector<double>& b);
// |top k of a ∩ top k of b| / k by |value|, k in 1..size.
double top_k_overlap(const std::vector<double>& a, const std::vector<double>& b, size_t k);

struct MethodComparison {
  MethodScores scores;
  double rank_correlation = 0, top_k_overlap = 0;
  std::vector<FaithfulnessPoint> curve;  // the method's top-k circuits
};
struct EdgeComparison {
  EdgeResult exact;
  double exact_seconds = 0;
  size_t top_k = 0;
  std::vector<FaithfulnessPoint> exact_curve;  // exact patching's top-k circuits
  std::vector<MethodComparison> methods;
};
// Every method in `methods` beside exact patching on one model and task: rank correlation and top-k
// overlap with the exact effects, and faithfulness curves over `sizes` (each <= the edge count).
EdgeComparison compare_edge_methods(TransformerLM& model, const PatchingInputs& in, const std::vector<std::string>& methods,
                                    const EdgeMethodOptions& opt, size_t top_k, const std::vector<size_t>& sizes);
// Edge scores and a circuit in the MIB circuit track's graph JSON (cisnlp/MIB-circuit-track,
// EAP-IG's Graph): {"cfg": {n_layers, n_heads, parallel_attn_mlp, d_model}, "nodes": {name:
// {in_graph}}, "edges": {name: {score, in_graph}}} with nodes input, a{l}.h{h}, m{l}, logits and
// edges "a0.h1->a1.h0<k>", "input->m0", "a1.h0->logits". MIB's graph also has the MLPs as senders
// (m{l} -> ...): those edges are in the graph, with mlp_scores' values (mlp_sender_edges' order)
// or, without them, score 0, in the graph as mlp_kept says (empty: every one in).
// kept empty: every edge out of the graph.
std::string mib_graph_json(const ModelConfig& cfg, const std::vector<double>& scores, const std::vector<bool>& kept,
                           const std::vector<double>& mlp_scores = {}, const std::vector<bool>& mlp_kept = {});

// The default sizes of a faithfulness curve over n edges: 0, 1, 2, 5, 10, 20, 50, ... and n.
std::vector<size_t> faithfulness_sizes(size_t n);

}  // namespace hl
