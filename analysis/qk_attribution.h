// QK attribution (docs/circuits.md, "why a head attends where it does"): a head's attention score
// at (query, key) split into pairs of upstream components, one on the query side and one on the
// key side. The residual stream a head reads is a sum of components (the token embedding, the
// position embedding, each earlier head's result, each earlier attention output bias, each earlier
// MLP's output); through ln1 with its scale frozen at the run's value (the cached norm scale) each
// component maps to a part of q and of k, and the norm's and projections' biases to one more part
// ("bias"). The score is bilinear in them: score = sum over (i, j) of q_i . k_j * scale, so the
// pairs sum to the score the model computed (hook_attn_scores).
#pragma once
#include <string>
#include <vector>

#include "models/transformer.h"

namespace hl {

struct QkAttribution {
  std::vector<std::string> components;  // "tok", "pos", "L0H1", "L0.b_O", "mlp0", ..., "bias" (last)
  std::vector<double> pairs;            // (C, C) row-major: [query-side i][key-side j]
  double score = 0;                     // the model's scaled score (hook_attn_scores) at (query, key)
  double pair(size_t i, size_t j) const { return pairs[i * components.size() + j]; }
  double sum() const;
};

// Fails naming the option for a model the decomposition does not handle exactly: post-norm,
// rotary positions, QK-norm, sandwich norms.
void check_qk_attribution_model(const ModelConfig& cfg);

// The decomposition of head (layer, head)'s score at (query, key) of row `row` of ids (B, T);
// key <= query (a causal model's visible keys). Each argument is checked with one line.
QkAttribution qk_attribution(TransformerLM& model, const Ids& ids, int64_t row, int layer, int head, int64_t query, int64_t key);

}  // namespace hl
