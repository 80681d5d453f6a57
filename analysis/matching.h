// Heads matched across two models (seeds, head counts, forks of one run): a similarity between
// every head of model A and every head of model B, then the one-to-one assignment of largest
// total similarity (Hungarian algorithm), within each layer or across layers. Beside it, each
// head's role from the detectors, so a caller can say which roles recur from model to model.
//
// Two similarities:
//  - pattern: 1 - JSD(A_a[i, :], A_b[i, :]) averaged over every query i of every sequence of
//    shared prompts (JSD the Jensen-Shannon divergence in bits, so in [0, 1]; 1 = the two heads
//    put the same weights on the same keys). Comparable across any two models reading the same
//    tokens: seeds, head counts, widths.
//  - weights: the mean of the cosines (Frobenius) of the heads' QK circuits W_Q^h^T W_K^h and OV
//    circuits W_O^h W_V^h (d_model x d_model). The products, not the factors: they do not change
//    when a head's d_head basis does (W_V -> M W_V, W_O -> W_O M^-1), which training is free to
//    choose. They are written in the residual stream's basis, so they compare models that share
//    it (a model and its forks, or a copy); across seeds the residual bases differ and pattern is
//    the measure to use. Biases are not part of it.
#pragma once
#include <string>
#include <vector>

#include "analysis/heads.h"

namespace hl {

// The optimal assignment, stated as costs (a caller maximising similarity passes -similarity):
// rows r -> distinct columns col[r] minimising sum cost[r][col[r]]. Rectangular: min(rows, cols) pairs are made, the rest are
// left out (-1). cost[r] must all have the same length; costs must be finite.
// Kuhn-Munkres with potentials (shortest augmenting paths), O(n^2 m) for n <= m.
std::vector<int> hungarian(const std::vector<std::vector<double>>& cost);

enum class MatchBy { Pattern, Weights };
std::string to_string(MatchBy b);           // "pattern", "weights"
MatchBy parse_match_by(const std::string& s);  // fails naming the choices

struct HeadMatchOptions {
  MatchBy by = MatchBy::Pattern;
  bool across_layers = false;  // one assignment over all heads; otherwise layer l with layer l
};

struct HeadPair {
  int layer_a = 0, head_a = 0, layer_b = 0, head_b = 0;
  double similarity = 0;
};

struct HeadMatch {
  MatchBy by = MatchBy::Pattern;
  bool across_layers = false;
  int layers_a = 0, heads_a = 0, layers_b = 0, heads_b = 0;
  // similarity[la * heads_a + ha][lb * heads_b + hb]: every head of A against every head of B
  std::vector<std::vector<double>> similarity;
  std::vector<HeadPair> pairs;  // the assignment, in A's order (layer, head)
  std::vector<std::pair<int, int>> unmatched_a, unmatched_b;  // (layer, head) left without a partner
  double mean_similarity = 0;   // over the pairs
};

// Pattern similarity needs `data` (shared prompts, read by both models; every token must be in
// both vocabularies); weights ignores it. Within layers needs the same number of layers.
HeadMatch match_heads(TransformerLM& a, TransformerLM& b, const std::vector<Batch>& data, const HeadMatchOptions& o = {});

// What each head does, from the detectors (previous_token, duplicate_token, induction) on the
// probe position cannot fool (varied_repeat_probe of `examples` rows, `seed`). scores[d] is
// detector d's (layers, heads) grid.
struct HeadRoleScores {
  std::vector<std::string> detectors;
  std::vector<HeadGrid> scores;
};
HeadRoleScores detector_role_scores(TransformerLM& model, int examples = 200, uint64_t seed = 1234);
// The role of one head: the detector of highest score when it is at least `threshold`, else "none".
std::string head_role(const HeadRoleScores& r, int layer, int head, double threshold = 0.4);
// The same with a threshold per detector (thresholds[d] for r.detectors[d]): the detector whose
// score is highest among those strictly above their own threshold, else "none".
std::string head_role(const HeadRoleScores& r, int layer, int head, const std::vector<double>& thresholds);
// Each detector's level of chance for models of `cfg`: the largest score any head of `models`
// untrained models of that shape (initialised as headlab train does, seeds 1..models) gets on
// the probe detector_role_scores(examples, seed) uses. A trained head whose score is at or
// below it does nothing random weights do not do already.
std::vector<double> random_baseline_thresholds(const ModelConfig& cfg, int examples = 200, uint64_t seed = 1234, int models = 4);

// Shared prompts for match by pattern: varied_repeat_probe rows that both models can read (block
// up to min(16, max_seq_len / 2) of the shorter model, tokens of the smaller vocabulary).
std::vector<Batch> match_probe(const TransformerLM& a, const TransformerLM& b, int examples = 200, uint64_t seed = 1234);

// What `match` costs, said before the work (`examples` can be large): forward passes (one per
// batch of 64 probe rows, per model, per pattern probe and per detector) and the memory held at
// once (the probes' token ids, and one batch's activations and patterns per model).
struct MatchCost {
  int64_t forward_passes = 0, rows = 0;
  double memory_bytes = 0;
};
MatchCost match_cost(const TransformerLM& a, const TransformerLM& b, int examples, bool by_pattern);
// The same for detector_role_scores of one model (its probe freed at the end).
MatchCost detector_roles_cost(const TransformerLM& model, int examples);

// Roles of both heads of every pair of `m` (head_role of each side), and how many pairs have
// the same role that is not "none".
struct PairRoles {
  std::vector<std::string> role_a, role_b;  // per pair of m.pairs
  int same_role = 0;                        // pairs whose heads share a role other than "none"
};
PairRoles pair_roles(const HeadMatch& m, const HeadRoleScores& a, const HeadRoleScores& b, double threshold = 0.4);

// Reorders the heads of `layer` in place: new head h is old head perm[h] (W_Q, W_K, W_V rows and
// their biases, W_O columns, gates). The model computes the same function (the heads' outputs are
// summed through W_O); a test of matching recovers perm. Needs n_kv_heads == n_heads.
void permute_heads(TransformerLM& model, int layer, const std::vector<int>& perm);

}  // namespace hl
