#include "analysis/evaluate.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "lib/parallel.h"

namespace hl {

namespace {
// Index of the largest of n logits (the first on ties).
int32_t argmax(const float* l, int64_t n) {
  int32_t best = 0;
  for (int64_t v = 1; v < n; ++v)
    if (l[v] > l[best]) best = static_cast<int32_t>(v);
  return best;
}

// Greedy decoding of rows (batch, row) of `data`; answers[batch][row], empty for rows not asked.
using RowRef = std::pair<size_t, int64_t>;  // (batch, row)
std::vector<std::vector<std::vector<int32_t>>> decode_rows(TransformerLM& model, std::span<const Batch> data,
                                                           std::span<const RowRef> wanted) {
  EvalScope mode(model);
  NoGradGuard ng;
  // rows by (prompt length, answer length): each group decodes in one batch, so a held-out set
  // of the copy tasks takes 16 groups, not 16 per batch
  std::map<std::pair<int, int>, std::vector<RowRef>> groups;
  std::vector<std::vector<std::vector<int32_t>>> out(data.size());
  for (size_t i = 0; i < data.size(); ++i) out[i].resize(static_cast<size_t>(data[i].size()));
  for (const auto& [i, r] : wanted) {
    const Batch& batch = data[i];
    int answer = 0;
    for (int64_t t = 0; t < batch.targets.shape[1]; ++t) answer += batch.targets.at(r, t) >= 0;
    groups[{batch.prompt_len[r], answer}].push_back({i, r});
  }
  // decodes rows of prompt length p and answer length n together, KV-cached
  auto decode = [&](std::span<const RowRef> rows, int p, int n) {
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
        decode(std::span<const RowRef>(rows).subspan(at, std::min(kMaxDecodeRows, rows.size() - at)), key.first,
               key.second);
  return out;
}

// Whether greedy decoding of `row` feeds the model exactly its teacher-forced inputs for as long
// as every prediction is right: the counted targets are the positions from prompt_len - 1 on,
// back to back, and each is the next position's input. Then the greedy answer is right exactly
// when every teacher-forced prediction is (the first wrong prediction is the same token in both,
// as everything before it is), and evaluation need not decode the row. The copy and induction
// tasks' rows all have this form.
bool answer_follows_prompt(const Batch& b, int64_t row) {
  const int64_t T = b.targets.shape[1], first = b.prompt_len[row] - 1;
  int64_t end = first;  // one past the answer's last position
  while (end < T && b.targets.at(row, end) >= 0) ++end;
  for (int64_t t = 0; t < T; ++t)
    if ((t < first || t >= end) && b.targets.at(row, t) >= 0) return false;  // counted outside the answer
  for (int64_t t = first; t + 1 < end; ++t)
    if (b.inputs.at(row, t + 1) != b.targets.at(row, t)) return false;
  return true;
}

}  // namespace

std::vector<std::vector<std::vector<int32_t>>> greedy_answers(TransformerLM& model, std::span<const Batch> data) {
  std::vector<RowRef> rows;
  for (size_t i = 0; i < data.size(); ++i)
    for (int64_t r = 0; r < data[i].size(); ++r)
      if (!data[i].prompt_len.empty() && data[i].prompt_len[r] >= 1) rows.push_back({i, r});
  return decode_rows(model, data, rows);
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
  // packed live positions, except with soft-capped scores (the unfused score path takes no packed rows)
  if (!hooks && !model.saes_replace_activations() && model.cfg.attn_softcap == 0.f && batch.live_positions(scratch.live_len, scratch.output_rows, scratch.targets)) {
    opt.live_len = scratch.live_len;
    opt.output_rows = &scratch.output_rows;
    targets = &scratch.targets;
  }
  return model.forward(batch.inputs, opt);
}

void check_data_fits_model(const std::vector<Batch>& data, const ModelConfig& cfg, const std::string& what) {
  int64_t first_row = 0;  // of the batch, counted over all batches
  for (const Batch& b : data) {
    const int64_t T = b.inputs.shape[1];
    if (T > cfg.max_seq_len)
      fail(what, ": rows of ", T, " tokens are longer than the model's max_seq_len (", cfg.max_seq_len, ")");
    for (const Ids* ids : {&b.inputs, &b.targets})
      for (int64_t i = 0; i < ids->numel(); ++i) {
        const int32_t v = ids->data[static_cast<size_t>(i)];
        if (v >= cfg.vocab_size || (ids == &b.inputs && v < 0))
          fail(what, ": ", ids == &b.inputs ? "input_ids" : "targets", " holds the id ", v, " (row ", first_row + i / T,
               ", position ", i % T, "), outside the model's vocabulary 0..", cfg.vocab_size - 1);
      }
    first_row += b.size();
  }
}

EvalResult evaluate(TransformerLM& model, const std::vector<Batch>& data, bool autoregressive, const Hooks* hooks,
                    std::vector<double>* row_loss) {
  if (row_loss) row_loss->clear();
  EvalScope mode(model);
  NoGradGuard ng;
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0, exact = 0, ar_exact = 0, ar_rows = 0;
  BatchScratch scratch;
  std::vector<RowRef> to_decode;  // rows whose greedy answer does not follow from the predictions here
  std::vector<int32_t> row_first, row_correct;
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
    // per row: its counted targets predicted right, and whether all are (rows in parallel: the
    // argmax over the vocabulary at every target is most of this)
    row_first.resize(static_cast<size_t>(B));  // live: the row's first logits row
    row_correct.resize(static_cast<size_t>(B));
    for (int64_t row = 0, at = 0; row < B; ++row) {
      row_first[row] = at;
      for (int64_t t = 0; t < T; ++t) at += b.targets.at(row, t) >= 0;
    }
    const float* L = logits.data();
    parallel_for(B, counted * V, [&](int64_t row) {
      int32_t right = 0, at = row_first[row];
      for (int64_t t = 0; t < T; ++t) {
        const int32_t target = b.targets.at(row, t);
        if (target < 0) continue;
        right += argmax(L + (live ? at++ : row * T + t) * V, V) == target;
      }
      row_correct[row] = right;
    });
    if (row_loss)
      for (int64_t row = 0, at = 0; row < B; ++row) {
        double s = 0;  // -log softmax at each counted target
        for (int64_t t = 0; t < T; ++t) {
          const int32_t target = b.targets.at(row, t);
          if (target < 0) continue;
          const float* z = L + (live ? at++ : row * T + t) * V;
          double mx = z[0], e = 0;
          for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
          for (int64_t v = 0; v < V; ++v) e += std::exp(static_cast<double>(z[v]) - mx);
          s += mx + std::log(e) - z[target];
        }
        row_loss->push_back(s);
      }
    for (int64_t row = 0; row < B; ++row) {
      correct += row_correct[row];
      const bool all = row_correct[row] == (row + 1 < B ? row_first[row + 1] : counted) - row_first[row];
      exact += all;
      if (!autoregressive || b.prompt_len.empty() || b.prompt_len[row] < 1) continue;  // no answer (text, tokens)
      ++ar_rows;
      if (answer_follows_prompt(b, row))
        ar_exact += all;
      else
        to_decode.push_back({static_cast<size_t>(&b - data.data()), row});
    }
    r.sequences += B;
  }
  if (!to_decode.empty()) {
    const auto answers = decode_rows(model, data, to_decode);  // [batch][row]
    for (const auto& [i, row] : to_decode) ar_exact += answers[i][static_cast<size_t>(row)] == Task::answer(data[i], row);
  }
  r.loss = r.tokens ? loss_sum / r.tokens : 0;
  r.token_acc = r.tokens ? static_cast<double>(correct) / r.tokens : 0;
  r.exact_match = r.sequences ? static_cast<double>(exact) / r.sequences : 0;
  if (autoregressive && ar_rows) r.ar_exact_match = static_cast<double>(ar_exact) / ar_rows;
  return r;
}

Ids generate(TransformerLM& model, const Ids& prompt, int64_t max_new_tokens, double temperature, uint64_t seed,
             const Tensor& key_padding) {
  if (prompt.shape.size() != 2 || prompt.shape[1] < 1) fail("generate: the prompt must have at least one token");
  if (max_new_tokens < 0) fail("generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  if (!(temperature >= 0) || !std::isfinite(temperature)) fail("generate: temperature must be >= 0, got ", temperature);
  const int64_t B = prompt.shape[0], T = prompt.shape[1], total = T + max_new_tokens;
  if (total > model.cfg.max_seq_len)
    fail("generate: ", T, " prompt tokens + ", max_new_tokens, " new ones = ", total, " exceed the model's n_ctx (",
         model.cfg.max_seq_len, ")");
  Ids out(Shape{B, total});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) out.at(b, t) = prompt.at(b, t);
  if (max_new_tokens == 0) return out;
  NoGradGuard ng;
  EvalScope eval(model);  // no dropout: the same seed gives the same tokens in any mode
  Rng rng(seed);
  std::vector<KVCacheLayer> cache;
  ForwardOptions opt;
  opt.kv_cache = &cache;
  // Padded prompts: the padding stays masked in the cache; the new tokens' positions continue
  // each row's real ones (so right padding, which would put them after the padding, is refused).
  Ids positions;
  std::vector<int32_t> real(static_cast<size_t>(B), 0);  // each row's real tokens so far
  Tensor padding;
  if (key_padding.defined()) {
    if (key_padding.shape() != Shape({B, T})) fail("generate: key_padding ", key_padding.shape().str(), " must be (", B, ",", T, ")");
    for (int64_t b = 0; b < B; ++b) {
      if (key_padding.data()[b * T + T - 1] != 0.f)
        fail("generate: row ", b, " ends in padding: pad the prompts on the left, so that the new tokens follow them");
      for (int64_t t = 0; t < T; ++t) real[static_cast<size_t>(b)] += key_padding.data()[b * T + t] == 0.f;
    }
    positions = positions_from_padding(key_padding);
    opt.position_ids = &positions;
    padding = key_padding;
    opt.key_padding = key_padding;
  }
  // The keys' padding once the cache holds `keys` columns: the prompt's, then real tokens.
  const auto padding_of = [&](int64_t keys) {
    Tensor p = Tensor::zeros({B, keys});
    for (int64_t b = 0; b < B; ++b) std::copy_n(padding.data() + b * T, T, p.data() + b * keys);
    return p;
  };
  Tensor logits = model.forward(prompt, opt);  // (B, T, V), then (B, 1, V) per new token
  const int64_t V = logits.size(2);
  std::vector<double> p(static_cast<size_t>(V));
  Ids next(Shape{B, 1});
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t Tl = logits.size(1);
    for (int64_t b = 0; b < B; ++b) {
      const float* l = logits.data() + (b * Tl + Tl - 1) * V;
      int32_t tok = argmax(l, V);
      if (temperature > 0) {  // softmax(l / temperature) in double, then one uniform draw
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += p[v] = std::exp((l[v] - l[tok]) / temperature);
        double u = static_cast<double>(rng.uniform()) * sum;
        for (int64_t v = 0; v < V; ++v)
          if ((u -= p[v]) < 0 || v == V - 1) {
            tok = static_cast<int32_t>(v);
            break;
          }
      }
      out.at(b, T + i) = next.at(b, 0) = tok;
    }
    if (i + 1 < max_new_tokens) {
      if (padding.defined()) {
        positions = Ids(Shape{B, 1});
        for (int64_t b = 0; b < B; ++b) positions.at(b, 0) = real[static_cast<size_t>(b)] + static_cast<int32_t>(i);
        opt.key_padding = padding_of(T + i + 1);
      }
      logits = model.forward(next, opt);
    }
  }
  return out;
}

}  // namespace hl
