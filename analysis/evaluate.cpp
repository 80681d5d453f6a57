#include "analysis/evaluate.h"

#include <map>

namespace hl {

namespace {
// Index of the largest of n logits (the first on ties).
int32_t argmax(const float* l, int64_t n) {
  int32_t best = 0;
  for (int64_t v = 1; v < n; ++v)
    if (l[v] > l[best]) best = static_cast<int32_t>(v);
  return best;
}
}  // namespace

std::vector<std::vector<int32_t>> greedy_answers(TransformerLM& model, const Batch& batch) {
  EvalScope mode(model);
  NoGradGuard ng;
  // rows by (prompt length, answer length): each group decodes in one batch
  std::map<std::pair<int, int>, std::vector<int64_t>> groups;
  for (int64_t r = 0; r < batch.size(); ++r) {
    if (batch.prompt_len.empty() || batch.prompt_len[r] < 1) continue;
    int answer = 0;
    for (int64_t t = 0; t < batch.targets.shape[1]; ++t) answer += batch.targets.at(r, t) >= 0;
    groups[{batch.prompt_len[r], answer}].push_back(r);
  }
  std::vector<std::vector<int32_t>> out(batch.size());
  for (auto& [key, rows] : groups) {
    const auto [p, n] = key;
    if (n == 0) continue;
    const int64_t G = static_cast<int64_t>(rows.size());
    Ids prompt(Shape{G, p});
    for (int64_t g = 0; g < G; ++g)
      for (int t = 0; t < p; ++t) prompt.at(g, t) = batch.inputs.at(rows[g], t);
    std::vector<KVCacheLayer> cache;
    ForwardOptions opt;
    opt.kv_cache = &cache;
    Tensor logits = model.forward(prompt, opt);  // (G, p, V)
    const int64_t V = logits.size(2);
    Ids next(Shape{G, 1});
    for (int i = 0; i < n; ++i) {
      const int64_t T = logits.size(1);
      for (int64_t g = 0; g < G; ++g) {
        const int32_t best = argmax(logits.data() + (g * T + T - 1) * V, V);
        next.at(g, 0) = best;
        out[rows[g]].push_back(best);
      }
      if (i + 1 < n) logits = model.forward(next, opt);  // (G, 1, V)
    }
  }
  return out;
}

EvalResult evaluate(TransformerLM& model, const Task& task, const std::vector<Batch>& data,
                    bool autoregressive, const Hooks* hooks) {
  EvalScope mode(model);
  NoGradGuard ng;
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0, exact = 0, ar_exact = 0, ar_rows = 0;
  for (const Batch& b : data) {
    ForwardOptions opt;
    opt.key_padding = b.key_padding;
    opt.hooks = hooks;
    Tensor logits = model.forward(b.inputs, opt);  // (B, T, V)
    const int64_t B = b.size(), T = b.inputs.shape[1], V = logits.size(2);
    const int64_t counted = b.counted_targets();
    loss_sum += static_cast<double>(cross_entropy(logits, b.targets).item()) * counted;
    r.tokens += counted;
    for (int64_t row = 0; row < B; ++row) {
      bool all = true;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t target = b.targets.at(row, t);
        if (target < 0) continue;
        const int32_t best = argmax(logits.data() + (row * T + t) * V, V);
        correct += best == target;
        all = all && best == target;
      }
      exact += all;
    }
    r.sequences += B;
    if (autoregressive) {
      auto answers = greedy_answers(model, b);
      for (int64_t row = 0; row < B; ++row) {
        if (b.prompt_len.empty() || b.prompt_len[row] < 1) continue;  // no answer to decode (text, tokens)
        ++ar_rows;
        ar_exact += answers[row] == task.answer(b, row);
      }
    }
  }
  r.loss = r.tokens ? loss_sum / r.tokens : 0;
  r.token_acc = r.tokens ? static_cast<double>(correct) / r.tokens : 0;
  r.exact_match = r.sequences ? static_cast<double>(exact) / r.sequences : 0;
  if (autoregressive && ar_rows) r.ar_exact_match = static_cast<double>(ar_exact) / ar_rows;
  return r;
}

}  // namespace hl
