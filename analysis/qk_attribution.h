// QK attribution (docs/circuits.md, "why a head attends where it does"): a head's attention score
// at (query, key) split into pairs of upstream components, one on the query side and one on the
// key side. The residual stream a head reads is a sum of components (the token embedding, the
// position embedding, each earlier head's result, each earlier attention output bias, each earlier
// MLP's output); through ln1 with its scale frozen at the run's value (the cached norm scale) each
// component maps to a part of q and of k, and the norm's and projections' biases to one more part
// ("bias"). QK-norm divides each part by the run's RMS of the head's whole q (k), frozen in the
// same way, and rotary positions turn each part by its position (a linear map per position). The
// score is bilinear in the parts: score = sum over (i, j) of q_i . k_j * scale, so the pairs sum
// to the score the model computed (hook_attn_scores, before any soft-cap).
//
// Over a task's answers the pair matrices of many (query, key) sites are averaged (or summed):
// the aggregate of the pairs is the aggregate of the scores.
#pragma once
#include <string>
#include <vector>

#include "analysis/patching.h"
#include "models/transformer.h"

namespace hl {

// One (query, key) position pair of one row of ids. key kMostAttendedKey: the key the head
// attends to most from that query (the argmax of its pattern in the run).
constexpr int64_t kMostAttendedKey = -1;
struct QkSite {
  int64_t row = 0, query = 0, key = 0;
};

// How a task's answers name their key: source = the answer's earlier occurrence (the token an
// induction or copying head attends to: for induction the token after the repeated token's first
// occurrence), previous = the query's previous position, max = the key the head attends to most.
enum class QkKeyRule { Source, Previous, Max };
QkKeyRule parse_qk_key_rule(const std::string& name);  // "source" | "previous" | "max"
std::string to_string(QkKeyRule r);
enum class QkReduce { Mean, Sum };
QkReduce parse_qk_reduce(const std::string& name);  // "mean" | "sum"
std::string to_string(QkReduce r);

struct QkAttribution {
  int layer = 0, head = 0;
  std::vector<std::string> components;  // "tok", "pos", "L0H1", "L0.b_O", "mlp0", ..., "bias" (last)
  std::vector<double> pairs;            // (C, C) row-major: [query-side i][key-side j], mean or sum over the sites
  double score = 0;                     // the model's scaled score (hook_attn_scores), mean or sum over the sites
  QkReduce reduce = QkReduce::Sum;
  std::vector<QkSite> sites;            // the (row, query, key) decomposed, keys resolved
  double pair(size_t i, size_t j) const { return pairs[i * components.size() + j]; }
  double sum() const;
  std::vector<double> query_totals() const;  // (C): each query-side component against every key-side one
  std::vector<double> key_totals() const;    // (C): each key-side component against every query-side one
};

// Fails naming the option for a model the decomposition does not handle exactly: post-norm,
// sandwich norms.
void check_qk_attribution_model(const ModelConfig& cfg);

// The decomposition of head (layer, head)'s score at each site of ids (B, T), averaged (Mean) or
// summed over the sites; a site's key <= its query (a causal model's visible keys, and inside a
// sliding window) or kMostAttendedKey. Runs the rows in chunks. Each argument is checked with one
// line; no sites is refused.
QkAttribution qk_attribution(TransformerLM& model, const Ids& ids, int layer, int head, const std::vector<QkSite>& sites,
                             QkReduce reduce = QkReduce::Mean);
// One site: the pairs of one score.
QkAttribution qk_attribution(TransformerLM& model, const Ids& ids, int64_t row, int layer, int head, int64_t query, int64_t key);

// The sites a task's answers name (the inputs of patch and edges, their clean rows): query = each
// answer's position (where the model predicts it), key by `rule` (source: in.source_pos, the
// answer's earlier occurrence; previous: query - 1, answers at position 0 left out; max:
// kMostAttendedKey). Fails when no site is left.
std::vector<QkSite> qk_answer_sites(const PatchingInputs& in, QkKeyRule rule);

// Memory of qk_attribution over `rows` rows of T tokens (one chunk's cached activations).
double qk_attribution_memory_bytes(const ModelConfig& cfg, int64_t rows, int64_t T);

}  // namespace hl
