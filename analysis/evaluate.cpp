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

std::vector<std::vector<std::vector<int32_t>>> greedy_answers(TransformerLM& model, std::span<const Batch> data) {
  EvalScope mode(model);
  NoGradGuard ng;
  // rows of all batches by (prompt length, answer length): each group decodes in one batch, so a
  // held-out set of the copy tasks takes 16 groups, not 16 per batch
  std::map<std::pair<int, int>, std::vector<std::pair<size_t, int64_t>>> groups;  // -> (batch, row)
  std::vector<std::vector<std::vector<int32_t>>> out(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const Batch& batch = data[i];
    out[i].resize(static_cast<size_t>(batch.size()));
    for (int64_t r = 0; r < batch.size(); ++r) {
      if (batch.prompt_len.empty() || batch.prompt_len[r] < 1) continue;
      int answer = 0;
      for (int64_t t = 0; t < batch.targets.shape[1]; ++t) answer += batch.targets.at(r, t) >= 0;
      groups[{batch.prompt_len[r], answer}].push_back({i, r});
    }
  }
  // decodes rows (batch, row) of prompt length p and answer length n together, KV-cached
  auto decode = [&](std::span<const std::pair<size_t, int64_t>> rows, int p, int n) {
    const int64_t G = static_cast<int64_t>(rows.size());
    Ids prompt(Shape{G, p});
    for (int64_t g = 0; g < G; ++g)
      for (int t = 0; t < p; ++t) prompt.at(g, t) = data[rows[g].first].inputs.at(rows[g].second, t);
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
        out[rows[g].first][static_cast<size_t>(rows[g].second)].push_back(best);
      }
      if (i + 1 < n) logits = model.forward(next, opt);  // (G, 1, V)
    }
  };
  constexpr size_t kMaxDecodeRows = 256;  // per decoding batch: bounds the KV cache's memory
  for (auto& [key, rows] : groups)
    if (key.second > 0)
      for (size_t at = 0; at < rows.size(); at += kMaxDecodeRows)
        decode(std::span<const std::pair<size_t, int64_t>>(rows).subspan(at, std::min(kMaxDecodeRows, rows.size() - at)),
               key.first, key.second);
  return out;
}

std::vector<std::vector<int32_t>> greedy_answers(TransformerLM& model, const Batch& batch) {
  return greedy_answers(model, std::span<const Batch>(&batch, 1))[0];
}

Tensor forward_batch(TransformerLM& model, const Batch& batch, BatchScratch& scratch, const Ids*& targets,
                     const Hooks* hooks) {
  ForwardOptions opt;
  opt.key_padding = batch.key_padding;
  opt.hooks = hooks;
  targets = &batch.targets;
  if (!hooks && batch.live_positions(scratch.live_len, scratch.output_rows, scratch.targets)) {
    opt.live_len = scratch.live_len;
    opt.output_rows = &scratch.output_rows;
    targets = &scratch.targets;
  }
  return model.forward(batch.inputs, opt);
}

EvalResult evaluate(TransformerLM& model, const Task& task, const std::vector<Batch>& data,
                    bool autoregressive, const Hooks* hooks) {
  EvalScope mode(model);
  NoGradGuard ng;
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0, exact = 0, ar_exact = 0, ar_rows = 0;
  BatchScratch scratch;
  for (const Batch& b : data) {
    const int64_t B = b.size(), T = b.inputs.shape[1];
    const Ids* targets = nullptr;
    // (B, T, V), or a row per counted target (row 0's, then row 1's, ...)
    const Tensor logits = forward_batch(model, b, scratch, targets, hooks);
    const bool live = targets != &b.targets;
    const int64_t V = logits.size(-1);
    const int64_t counted = b.counted_targets();
    loss_sum += static_cast<double>(cross_entropy(logits, *targets).item()) * counted;
    r.tokens += counted;
    const float* next_target_logits = logits.data();  // live: the next counted target's row
    for (int64_t row = 0; row < B; ++row) {
      bool all = true;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t target = b.targets.at(row, t);
        if (target < 0) continue;
        const float* l = live ? next_target_logits : logits.data() + (row * T + t) * V;
        next_target_logits += V;
        const int32_t best = argmax(l, V);
        correct += best == target;
        all = all && best == target;
      }
      exact += all;
    }
    r.sequences += B;
  }
  if (autoregressive) {
    const auto answers = greedy_answers(model, data);  // [batch][row]
    for (size_t i = 0; i < data.size(); ++i)
      for (int64_t row = 0; row < data[i].size(); ++row) {
        if (data[i].prompt_len.empty() || data[i].prompt_len[row] < 1) continue;  // no answer to decode (text, tokens)
        ++ar_rows;
        ar_exact += answers[i][static_cast<size_t>(row)] == task.answer(data[i], row);
      }
  }
  r.loss = r.tokens ? loss_sum / r.tokens : 0;
  r.token_acc = r.tokens ? static_cast<double>(correct) / r.tokens : 0;
  r.exact_match = r.sequences ? static_cast<double>(exact) / r.sequences : 0;
  if (autoregressive && ar_rows) r.ar_exact_match = static_cast<double>(ar_exact) / ar_rows;
  return r;
}

}  // namespace hl
