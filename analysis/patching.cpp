#include "analysis/patching.h"

#include "analysis/ablation.h"
#include "analysis/chunks.h"
#include "analysis/intervals.h"

#include "lib/stop.h"
#include "models/padding.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

namespace hl {

Corruption parse_corruption(const std::string& name) {
  if (name == "source") return Corruption::Source;
  if (name == "previous") return Corruption::Previous;
  fail("unknown corruption '", name, "' (source or previous)");
}

std::string to_string(Corruption c) { return c == Corruption::Source ? "source" : "previous"; }

namespace {
// Previous: the token before source position p is the answer position's token (the context the
// answer follows) and occurs once before the answer position.
bool previous_is_the_context(const Batch& b, int64_t r, int64_t p, int64_t at) {
  if (p < 1 || at <= p) return false;
  const int32_t c = b.inputs.at(r, p - 1);
  if (b.inputs.at(r, at) != c) return false;
  int seen = 0;
  for (int64_t t = 0; t < at; ++t) seen += b.inputs.at(r, t) == c;
  return seen == 1;
}
}  // namespace

PatchingInputs corrupt_one_symbol(const Batch& b, int alphabet, uint64_t seed, Corruption corruption) {
  const int64_t B = b.size(), T = b.inputs.shape[1];
  Rng rng(seed);
  std::vector<int64_t> rows;
  PatchingInputs in;
  for (int64_t r = 0; r < B; ++r) {
    if (r % 4096 == 0) throw_if_stopped();  // 10^6 rows take seconds
    const int prompt = b.prompt_len.empty() ? 0 : b.prompt_len[r];
    std::vector<std::pair<int64_t, int64_t>> choices;  // (source position, answer position)
    std::set<int32_t> used;
    for (int64_t t = 0; t < T; ++t) used.insert(b.inputs.at(r, t));
    for (int64_t p = 1; p < prompt; ++p) {
      const int32_t s = b.inputs.at(r, p);
      if (s < 0 || s >= alphabet) continue;
      int in_prompt = 0, answers = 0;
      int64_t at = -1;
      for (int64_t t = 0; t < prompt; ++t) in_prompt += b.inputs.at(r, t) == s;
      for (int64_t t = 0; t < T; ++t)
        if (b.targets.at(r, t) == s) ++answers, at = t;
      if (in_prompt == 1 && answers == 1 && at >= p &&
          (corruption == Corruption::Source || previous_is_the_context(b, r, p, at)))
        choices.push_back({p, at});
    }
    if (prompt == 0)  // language-modelling rows (tokens, text): the source may be anywhere before
      for (int64_t p = 0; p < T; ++p) {
        // a symbol the model has seen once, at p, when it must predict it at `at`
        const int32_t s = b.inputs.at(r, p);
        if (s < 0 || s >= alphabet) continue;
        int64_t at = p + 1;
        while (at < T && b.targets.at(r, at) != s) ++at;
        if (at >= T) continue;
        int seen = 0;
        for (int64_t t = 0; t <= at; ++t) seen += b.inputs.at(r, t) == s;
        if (seen == 1 && (corruption == Corruption::Source || previous_is_the_context(b, r, p, at)))
          choices.push_back({p, at});
      }
    std::vector<int32_t> unused;
    for (int32_t s = 0; s < alphabet; ++s)
      if (!used.count(s)) unused.push_back(s);
    if (choices.empty() || unused.empty()) continue;
    const auto [p, at] = choices[rng.next_u64() % choices.size()];
    const int32_t corrupt = unused[rng.next_u64() % unused.size()];
    rows.push_back(r);
    in.answers.push_back({static_cast<int64_t>(rows.size()) - 1, at, b.inputs.at(r, p), corrupt});
    in.source_pos.push_back(corruption == Corruption::Source ? p : p - 1);
  }
  if (rows.empty() && corruption == Corruption::Previous)
    fail("patching: no row has a token to corrupt before an answer's source (a unique source symbol whose copy is an "
         "answer, preceded by the answer position's token seen once, and a symbol the row does not use)");
  if (rows.empty()) fail("patching: no row has a symbol that can be corrupted (a unique source symbol whose copy is an answer, and a symbol the row does not use)");
  const int64_t R = static_cast<int64_t>(rows.size());
  in.clean = Ids(Shape{R, T});
  for (int64_t i = 0; i < R; ++i)
    for (int64_t t = 0; t < T; ++t) in.clean.at(i, t) = b.inputs.at(rows[i], t);
  in.corrupted = in.clean;
  for (int64_t i = 0; i < R; ++i) in.corrupted.at(i, in.source_pos[i]) = in.answers[i].corrupted;
  if (b.key_padding.defined()) {  // the chosen rows' padding
    in.key_padding = Tensor::zeros({R, T});
    for (int64_t i = 0; i < R; ++i)
      std::copy_n(b.key_padding.data() + rows[i] * T, T, in.key_padding.data() + i * T);
  }
  return in;
}

// The mask's shape, then each row's padding before its tokens (models/padding.h's checks).
std::vector<int64_t> patching_leading_padding(const PatchingInputs& in, const std::string& fn) {
  const int64_t B = in.clean.shape[0], T = in.clean.shape[1];
  if (in.key_padding.shape().ndim != 2 || in.key_padding.shape()[0] != B || in.key_padding.shape()[1] != T)
    fail(fn, ": attention_mask has shape ", in.key_padding.shape().str(), " but the ids are ", in.clean.shape.str());
  return leading_padding({in.key_padding.data(), static_cast<size_t>(B * T)}, B, T, fn + ": attention_mask");
}

void check_answers_at_tokens(const PatchingInputs& in, const std::string& fn) {
  const int64_t B = in.clean.shape[0], T = in.clean.shape[1];
  for (const PatchAnswer& a : in.answers)
    if (a.row >= 0 && a.row < B && a.pos >= 0 && a.pos < T && in.key_padding.data()[a.row * T + a.pos] != 0.f)
      fail(fn, ": answer (", a.row, ", ", a.pos, ", ", a.clean, ", ", a.corrupted, ") is at padding (attention_mask 0 there)");
}

std::vector<int64_t> left_align_rows(PatchingInputs& in, const std::string& fn) {
  if (!in.key_padding.defined()) return {};
  const std::vector<int64_t> lead = patching_leading_padding(in, fn);
  check_answers_at_tokens(in, fn);  // in the padded frame the caller gave
  if (!any_shift(lead)) return lead;
  const int64_t T = in.clean.shape[1];
  rotate_rows_left(in.clean.data.data(), T, 1, lead);
  rotate_rows_left(in.corrupted.data.data(), T, 1, lead);
  rotate_rows_left(in.key_padding.data(), T, 1, lead);
  for (PatchAnswer& a : in.answers)
    if (a.row >= 0 && a.row < in.clean.shape[0]) a.pos -= lead[static_cast<size_t>(a.row)];
  for (size_t r = 0; r < in.source_pos.size(); ++r) in.source_pos[r] -= lead[r];
  return lead;
}

void check_patching_padding(const PatchingInputs& in, const std::string& fn) {
  if (!in.key_padding.defined()) return;
  const std::vector<int64_t> lead = patching_leading_padding(in, fn);
  // the patched runs number positions from column 0: a row's tokens must come first
  for (size_t r = 0; r < lead.size(); ++r)
    if (lead[r] != 0)
      fail(fn, ": attention_mask: row ", r, " starts with padding: left-align the rows first (left_align_rows)");
  check_answers_at_tokens(in, fn);
}

// Stacked patched runs (StackedRuns, below): at most this many tokens of rows in one forward_from,
// and this many bytes of their keys/values and activations.
inline constexpr int64_t kStackTokens = 4096;               // rows of the products: well into the sgemm kernels' peak
inline constexpr double kStackBytes = 256.0 * 1024 * 1024;

double patching_memory_bytes(const ModelConfig& cfg, int64_t rows, int64_t T) {
  // one chunk's passes, and per row its ids and its answer's value at every head and in the two runs;
  // per row of a chunk (held one chunk at a time), the corrupted run's keys and values at every
  // layer, recorded and a working copy; and a stack of patched runs
  const double kv = 4.0 * static_cast<double>(4 * cfg.n_layers * T * cfg.kv_heads() * cfg.head_dim());
  return chunked_pass_bytes(cfg, rows, T, true, 8.0 * static_cast<double>(cfg.n_layers * cfg.n_heads + 2)) +
         kv * static_cast<double>(rows_per_pass(cfg, rows, T, true)) + kStackBytes;
}

namespace {
// The metric's terms on logits (rows, T, V) of rows row0..: +w at each answer's clean token, -w at
// its corrupted one, summed over the logits times them (differentiable in the logits).
Tensor weighted_logit_difference(const Tensor& logits, const std::vector<PatchAnswer>& answers, int64_t row0, float w) {
  const int64_t R = logits.size(0), T = logits.size(1), V = logits.size(2);
  Tensor select = Tensor::zeros(logits.shape());
  for (const PatchAnswer& a : answers) {
    if (a.row < row0 || a.row >= row0 + R) continue;
    select.data()[((a.row - row0) * T + a.pos) * V + a.clean] += w;
    select.data()[((a.row - row0) * T + a.pos) * V + a.corrupted] -= w;
  }
  return mul(logits, select);
}
}  // namespace

Tensor logit_difference(const Tensor& logits, const std::vector<PatchAnswer>& answers) {
  return sum(weighted_logit_difference(logits, answers, 0, 1.f / static_cast<float>(answers.size())));
}

LogitDifferenceSum::LogitDifferenceSum(const std::vector<PatchAnswer>& answers)
    : answers_(&answers), w_(1.f / static_cast<float>(answers.size())) {}

namespace {
PassLogits every_position(const Tensor& logits) {  // (rows, T, V)
  PassLogits p;
  p.every = logits, p.T = logits.size(1), p.V = logits.size(2);
  return p;
}
// Whether row r of a pass over rows row0.. holds answer a (a pass over no rows holds none).
bool holds(const PassLogits& p, const PatchAnswer& a, int64_t row0) {
  if (a.row < row0) return false;
  if (p.every.defined()) return a.row < row0 + p.every.size(0);
  return p.at.count((a.row - row0) * p.T + a.pos) > 0;
}
}  // namespace

const float* PassLogits::row(int64_t r, int64_t pos) const {
  if (every.defined()) return every.data() + (r * T + pos) * V;
  return at.at(r * T + pos);
}

void LogitDifferenceSum::add(const Tensor& logits, int64_t row0) { add(every_position(logits), row0); }

void LogitDifferenceSum::add(const PassLogits& logits, int64_t row0) {
  // the sum of weighted_logit_difference's terms in sum()'s order (one float, element after
  // element), reading only its nonzero ones: the selector's weights accumulated as it does, in
  // answer order, then added in index order (the zero terms add nothing to a finite sum)
  const int64_t T = logits.T, V = logits.V;
  std::map<int64_t, float> select;  // flat index in (rows, T, V) -> weight
  for (const PatchAnswer& a : *answers_) {
    if (!holds(logits, a, row0)) continue;
    select[((a.row - row0) * T + a.pos) * V + a.clean] += w_;
    select[((a.row - row0) * T + a.pos) * V + a.corrupted] -= w_;
  }
  for (const auto& [i, w] : select) sum_ += logits.row(i / (T * V), (i / V) % T)[i % V] * w;
}

namespace {

// Each answer's logit difference, of the answers in a pass over rows row0..: each[a].
void each_answer(const PassLogits& logits, const std::vector<PatchAnswer>& answers, int64_t row0, std::vector<double>& each) {
  for (size_t i = 0; i < answers.size(); ++i) {
    const PatchAnswer& a = answers[i];
    if (!holds(logits, a, row0)) continue;
    const float* row = logits.row(a.row - row0, a.pos);
    each[i] = static_cast<double>(row[a.clean]) - static_cast<double>(row[a.corrupted]);
  }
}
void each_answer(const Tensor& logits, const std::vector<PatchAnswer>& answers, int64_t row0, std::vector<double>& each) {
  each_answer(every_position(logits), answers, row0, each);
}

// The mean logit difference, and with `each` every answer's own (for intervals).
double metric_of(TransformerLM& model, const Ids& ids, const std::vector<PatchAnswer>& answers, const Hooks* hooks = nullptr,
                 std::vector<double>* each = nullptr) {
  EvalScope mode(model);
  NoGradGuard ng;
  ForwardOptions opt;
  opt.hooks = hooks;
  const Tensor logits = model.forward(ids, opt);  // (B, T, V)
  if (each) each->assign(answers.size(), 0.0), each_answer(logits, answers, 0, *each);
  return logit_difference(logits, answers).item();
}

// The activations `filter` names of a run, and (with_grads) the metric's gradients at them.
ActivationCache run_recorded(TransformerLM& model, const PatchingInputs& in, const Ids& ids, NameFilter filter, bool with_grads) {
  EvalScope mode(model);
  std::unique_ptr<NoGradGuard> no_graph;
  if (!with_grads) no_graph = std::make_unique<NoGradGuard>();
  auto [logits, cache] = model.run_with_cache(ids, std::move(filter), with_grads);
  if (with_grads) {
    logit_difference(logits, in.answers).backward();
    model.zero_grad();  // the parameters' gradients are a by-product
  }
  return cache;
}

// s plus the sum over the elements f selects of (clean - corrupted) * grad (s: the chunks before)
template <class Select>
double attribution(double s, const Tensor& clean, const Tensor& corrupted, const Tensor& grad, Select&& selected) {
  for (int64_t i = 0; i < clean.numel(); ++i)
    if (selected(i)) s += (static_cast<double>(clean.data()[i]) - corrupted.data()[i]) * grad.data()[i];
  return s;
}

}  // namespace

double pearson(const HeadGrid& a, const HeadGrid& b) {
  std::vector<double> x, y;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) x.push_back(a[i][j]), y.push_back(b[i][j]);
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

double PatchGrid::at(const std::vector<int64_t>& index) const {
  if (index.size() != shape.size()) fail("patch grid: index of ", index.size(), " entries for ", shape.size(), " axes");
  int64_t flat = 0;
  for (size_t a = 0; a < shape.size(); ++a) {
    if (index[a] < 0 || index[a] >= shape[a]) fail("patch grid: index ", index[a], " outside 0..", shape[a] - 1, " on axis ", axes[a]);
    flat = flat * shape[a] + index[a];
  }
  return values[static_cast<size_t>(flat)];
}

namespace {

bool is_hook(const ModelConfig& cfg, const std::string& name) {
  for (const HookPointInfo& p : describe_hook_points(cfg))
    if (p.name == name) return true;
  return false;
}
// An attached SAE's point ("blocks.1.attn.hook_z.hook_sae_acts_post": TransformerLM::add_sae).
bool is_sae_hook(const TransformerLM& model, const std::string& name) {
  for (const HookPointInfo& p : describe_hook_points(model))
    if (p.name == name) return !is_hook(model.cfg, name);
  return false;
}

// The hook's name within a block ("attn.hook_z" for "hook_z"), or fails saying why.
std::string block_relative_name(const ModelConfig& cfg, const std::string& hook) {
  std::vector<std::string> found;
  for (const HookPointInfo& p : describe_hook_points(cfg)) {
    if (hook_layer(p.name) != 0) continue;
    const std::string rel = in_block_name(p.name);
    if (rel == hook || rel.ends_with("." + hook)) found.push_back(rel);
  }
  if (found.size() == 1) return found[0];
  if (found.empty()) fail("patching: no hook point '", hook, "' in the blocks (headlab hooks lists them; name one without its blocks.L. prefix)");
  std::string all;
  for (const std::string& f : found) all += (all.empty() ? "" : " or ") + f;
  fail("patching: '", hook, "' is ambiguous: ", all);
}

}  // namespace

std::vector<std::string> default_patch_axes(const ModelConfig& cfg, const std::string& hook) {
  std::vector<std::string> axes;
  std::string full = hook;
  if (!is_hook(cfg, hook)) {
    axes.push_back("layer");
    full = hook_name(0, block_relative_name(cfg, hook));
  }
  axes.push_back(hook_axes(cfg, full).head >= 0 ? "head" : "pos");
  return axes;
}

std::vector<std::string> default_patch_axes(const TransformerLM& model, const std::string& hook) {
  if (!is_sae_hook(model, hook)) return default_patch_axes(model.cfg, hook);
  return {hook_axes(model, hook).feature >= 0 ? "feature" : "pos"};
}

namespace {

// A patched pass's logits of the batch's rows row0.., at index `flat` (`idx` per axis).
using OnPass = std::function<void(int64_t flat, const std::vector<int64_t>& idx, const PassLogits& logits, int64_t row0)>;
// Whether every element of `from` that `fixed` selects ((activation axis, index) pairs) equals x's.
bool same_where(const Tensor& from, const Tensor& x, const std::vector<std::pair<int, int64_t>>& fixed,
                const std::vector<int64_t>& stride) {
  const Shape& s = from.shape();
  for (int64_t i = 0; i < from.numel(); ++i) {
    bool here = true;
    for (const auto& [d, k] : fixed) here = here && (i / stride[d]) % s[d] == k;
    if (here && from.data()[i] != x.data()[i]) return false;
  }
  return true;
}

// Per feature (the last axis of (B, T, d_sae) activations): whether the two runs' values differ anywhere.
std::vector<char> differing_features(const Tensor& a, const Tensor& b) {
  const int64_t F = a.size(-1), n = a.numel() / F;
  std::vector<char> differs(static_cast<size_t>(F), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < F; ++j) differs[static_cast<size_t>(j)] |= a.data()[i * F + j] != b.data()[i * F + j];
  return differs;
}

// The answers' window of a sweep: the first position where a clean and a corrupted row differ
// (causal: every activation before it is the same in both runs) and one past the last answer's.
// Over every row, so a chunk's patched runs do not depend on the chunking.
struct AnswerWindow {
  int64_t first_change = 0, end = 0;
};
AnswerWindow answer_window(const Ids& clean, const Ids& corrupted, const std::vector<PatchAnswer>& answers) {
  const int64_t B = clean.shape[0], T = clean.shape[1];
  AnswerWindow w{T, 0};
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < w.first_change; ++t)
      if (clean.at(r, t) != corrupted.at(r, t)) w.first_change = t;
  for (const PatchAnswer& a : answers) w.end = std::max(w.end, a.pos + 1);
  return w;
}

// The corrupted run's keys and values at every layer over positions [0, end) (rows, end, Hkv dh),
// and a working copy a stack of patched runs from position p on starts from: per stacked copy, the
// first p positions restored, the rest overwritten by that run.
struct CorruptedKV {
  std::vector<KVCacheLayer> recorded, work;
  void record(TransformerLM& model, const Ids& corrupted, int64_t end) {
    const int64_t R = corrupted.shape[0];
    Ids head(Shape{R, end});  // the first `end` positions: the keys and values a window reads
    for (int64_t r = 0; r < R; ++r)
      std::copy_n(corrupted.data.data() + r * corrupted.shape[1], end, head.data.data() + r * end);
    recorded.assign(static_cast<size_t>(model.cfg.n_layers), KVCacheLayer{});
    for (KVCacheLayer& c : recorded) c.capacity = end;
    ForwardOptions opt;
    opt.kv_cache = &recorded;
    (void)model.forward(head, opt);
    work.assign(recorded.size(), KVCacheLayer{});
  }
  // for `copies` runs stacked as rows (copy j: rows j R .. j R + R - 1)
  std::vector<KVCacheLayer>& from(int layer, int64_t p, int64_t copies) {
    for (size_t l = static_cast<size_t>(layer); l < work.size(); ++l) {
      const KVCacheLayer& r = recorded[l];
      const int64_t R = r.k.size(0), cap = r.k.size(1), W = r.k.size(2);
      KVCacheLayer& w = work[l];
      if (!w.k.defined() || w.k.size(0) != copies * R)
        w.k = Tensor::empty({copies * R, cap, W}), w.v = Tensor::empty({copies * R, cap, W}), w.capacity = cap;
      for (int64_t j = 0; j < copies; ++j)
        for (int64_t b = 0; b < R; ++b) {
          std::copy_n(r.k.data() + b * cap * W, p * W, w.k.data() + (j * R + b) * cap * W);
          std::copy_n(r.v.data() + b * cap * W, p * W, w.v.data() + (j * R + b) * cap * W);
        }
      w.len = p;
    }
    return work;
  }
};

// Bytes the working keys and values of one stacked copy of R rows take (every layer, `end` positions).
double block_kv_bytes(const ModelConfig& cfg, int64_t R, int64_t end) {
  return 4.0 * 2 * static_cast<double>(cfg.n_layers * R * end * cfg.kv_heads() * cfg.head_dim());
}

// A patched run over a window has few rows (the examples) and positions, so its products run far
// below the sgemm peak: windowed runs that start at the same block go as the rows of one
// forward_from, copy j being run j, all from the earliest p0 among them (the positions of a later
// run's window before its own p0 compute the corrupted run's values again). Each copy's answers
// are then its own run's to float32 rounding (the products take other row counts).
// A stack holds as many copies as kStackTokens tokens and kStackBytes allow (HEADLAB_TEST_PATCH_STACK=N,
// tests only: at most N), and a run joins only when the shared start wastes little (below).
int64_t stacked_runs_at_most(const ModelConfig& cfg, int64_t R, const AnswerWindow& w, double kv_bytes_per_copy) {
  if (const char* forced = std::getenv("HEADLAB_TEST_PATCH_STACK"); forced && *forced) return std::max<int64_t>(1, std::atoll(forced));
  const int64_t W = std::max<int64_t>(1, w.end - w.first_change);  // the widest window a copy computes
  // without gradients a block's activations are freed before the next block's: two blocks' worth
  // of estimate_step_bytes (which counts every block's) are live at once at most
  const double acts = estimate_step_bytes(cfg, R, W, false, false) - estimate_step_bytes(cfg, 0, W, false, false);
  const double per_copy = kv_bytes_per_copy + 2.0 * acts / std::max(1, cfg.n_layers);
  return std::max<int64_t>(1, static_cast<int64_t>(kStackBytes / std::max(1.0, per_copy)));
}
struct StackedRuns {
  struct Run {
    int64_t flat;
    std::vector<int64_t> idx;
    std::vector<std::pair<int, int64_t>> fixed;
    int64_t p0;
  };
  std::vector<Run> runs;
  int block = 0;
  int64_t p0 = 0;  // the earliest run's
  const Tensor* from = nullptr;       // the clean activation patched from
  const std::string* name = nullptr;  // its hook
  int64_t most, R, end;
  StackedRuns(int64_t most, int64_t R, int64_t end) : most(most), R(R), end(end) {}
  bool empty() const { return runs.empty(); }
  int64_t tokens(int64_t copies, int64_t start) const { return copies * R * (end - start); }
  // a run at block b from q joins when the stack starts at b and, with it, no run computes more
  // than a third beyond its own window (or the whole stack is a few hundred tokens: waste there
  // costs less than a product of a few rows)
  bool joins(int b, int64_t q) const {
    const int64_t start = std::min(p0, q), latest = std::max(latest_p0(), q), k = static_cast<int64_t>(runs.size()) + 1;
    return b == block && k <= most && tokens(k, start) <= kStackTokens &&
           (3 * (latest - start) <= end - latest || tokens(k, start) <= 512);
  }
  int64_t latest_p0() const {
    int64_t m = p0;
    for (const Run& r : runs) m = std::max(m, r.p0);
    return m;
  }
  void add(Run r, int b, const Tensor* f, const std::string* n) {
    if (runs.empty()) block = b, p0 = r.p0, from = f, name = n;
    p0 = std::min(p0, r.p0);
    runs.push_back(std::move(r));
  }
  bool full() const {
    const int64_t k = static_cast<int64_t>(runs.size());
    return k >= most || tokens(k + 1, p0) > kStackTokens;
  }
  void clear() { runs.clear(); }
};

// Writes `from`'s elements that fixed[j] selects into copy j of x: x is `copies` blocks of rows
// along axis 0, each of `from`'s shape but for its axis `pos`, which holds from's positions
// [p0, p0 + x's) (the whole axis: pos -1 or p0 0).
Tensor written_where(const Tensor& x, const Tensor& from, const std::vector<const std::vector<std::pair<int, int64_t>>*>& fixed, int pos, int64_t p0) {
  const Shape &sx = x.shape(), &sf = from.shape();
  const int64_t copies = static_cast<int64_t>(fixed.size());
  for (int d = 0; d < sf.ndim; ++d)
    if (sx.ndim != sf.ndim || (d == 0 ? sx[0] != copies * sf[0] : sx[d] != sf[d] && !(d == pos && p0 + sx[d] <= sf[d])))
      fail("patching: the activation is ", sx.str(), " in the corrupted run, ", sf.str(), " in the clean run");
  std::vector<int64_t> stride_x(static_cast<size_t>(sx.ndim), 1), stride_f(static_cast<size_t>(sf.ndim), 1);
  for (int d = sx.ndim - 2; d >= 0; --d) stride_x[d] = stride_x[d + 1] * sx[d + 1], stride_f[d] = stride_f[d + 1] * sf[d + 1];
  Tensor y = x.clone();
  const int64_t block = sf[0] * stride_x[0];  // one copy's elements
  for (int64_t i = 0; i < y.numel(); ++i) {
    const std::vector<std::pair<int, int64_t>>& fx = *fixed[static_cast<size_t>(i / block)];
    bool here = true;
    int64_t j = 0;  // i's element in `from`
    for (int d = 0; d < sx.ndim; ++d) {
      const int64_t k = (i / stride_x[d]) % (d == 0 ? sf[0] : sx[d]) + (d == pos ? p0 : 0);
      for (const auto& [fd, fk] : fx) here = here && (fd != d || fk == k);
      j += k * stride_f[d];
    }
    if (here) y.data()[i] = from.data()[j];
  }
  return y;
}

// The passes of a sweep: for every chunk of `per` rows (in row order) the clean run is recorded once
// and the corrupted run's residual stream into each block, then for every index the corrupted run
// with the clean activation written at that index goes to on_pass. A patch that writes what the
// corrupted run already has there (a position before the corruption in every row) is not run: the
// corrupted run's logits go to on_pass (forward_from gives them bit for bit).
// With `answers` (every row's), a patched run of a hook inside a block that has a position axis
// (and no key axis) computes only what can change their logits (AnswerWindow): block `layer` on,
// positions [p0, window end) after the corrupted run's keys and values before p0 (p0: the patched
// position, or the first that differs between the runs), the logits at the answers alone; an
// answer before p0, or a patch at or after the window's end, reads the corrupted run's. The logits
// are the full run's to float32 rounding (the products take fewer rows; the keys and values are
// projected apart from the queries).
// `passed`, if given, is called after each index of each chunk. Returns the grid's axes, shape and
// hooks, its values zero.
PatchGrid sweep(TransformerLM& model, const Ids& clean, const Ids& corrupted, const std::string& hook,
                const std::vector<std::string>& axes, int64_t per, const OnPass& on_pass,
                const std::function<void()>& passed = {}, const std::vector<PatchAnswer>* answers = nullptr) {
  if (clean.shape.ndim != 2 || clean.shape != corrupted.shape)
    fail("patching: the clean ids ", clean.shape.str(), " and the corrupted ids ", corrupted.shape.str(), " must be (B, T) of one shape");
  if (axes.empty()) fail("patching: no axes to patch over (e.g. layer,head)");
  const bool by_layer = std::find(axes.begin(), axes.end(), "layer") != axes.end();
  PatchGrid g;
  g.axes = axes;
  if (by_layer) {
    if (is_hook(model.cfg, hook) || is_sae_hook(model, hook))
      fail("patching: ", hook, " is one hook point; to patch over layers name it without its layer (e.g. ",
           hook_layer(hook) >= 0 ? in_block_name(hook) : std::string("attn.hook_z"), ")");
    const std::string rel = block_relative_name(model.cfg, hook);
    for (int l = 0; l < model.cfg.n_layers; ++l) g.hooks.push_back(hook_name(l, rel));
  } else {
    if (!is_hook(model.cfg, hook) && !is_sae_hook(model, hook)) fail("patching: '", hook, "' is not a hook point of this model; name it in full (blocks.1.attn.hook_z) or patch over the layer axis too");
    g.hooks.push_back(hook);
  }
  EvalScope mode(model);
  NoGradGuard ng;
  const HookAxes ha = hook_axes(model, g.hooks[0]);
  const bool windowed = answers && hook_layer(g.hooks[0]) >= 0 && ha.pos >= 0 && ha.src_pos < 0;
  const AnswerWindow window = windowed ? answer_window(clean, corrupted, *answers) : AnswerWindow{};
  std::vector<int> dim;  // per axis, the activation's axis it indexes (-1: the layer)
  int64_t n = 0;
  for (const auto& [begin, end] : row_chunks(clean.shape[0], per)) {
    throw_if_stopped();
    const Ids chunk_clean = slice_rows(clean, begin, end), chunk_corrupted = slice_rows(corrupted, begin, end);
    // the clean run, recorded once; and the corrupted run's residual stream into each block, from
    // which a patched run of a block's hook starts (forward_from: the blocks before it would
    // compute the same again; GPT-2 small, patching layer l skips l of its 12 blocks)
    ActivationCache cache, corrupted_resid;
    Tensor corrupted_logits;  // the unpatched corrupted run's (rows, T, V), made when a patch changes nothing
    auto unpatched = [&]() -> const Tensor& {
      if (!corrupted_logits.defined()) corrupted_logits = model.forward(chunk_corrupted);  // once per chunk
      return corrupted_logits;
    };
    cache = model.run_with_cache(chunk_clean, names_in(g.hooks)).second;
    {
      ForwardOptions stop;
      Hooks record;
      record.cache(corrupted_resid, names_ending_with("hook_resid_pre"));
      if (ha.feature >= 0) record.cache(corrupted_resid, names_in(g.hooks));  // which features differ
      stop.hooks = &record;
      stop.stop_at_layer = model.cfg.n_layers;  // no logits needed
      (void)model.forward(chunk_corrupted, stop);
    }
    CorruptedKV kv;
    if (windowed && window.first_change < window.end) kv.record(model, chunk_corrupted, window.end);
    const Shape s = cache[g.hooks[0]].shape();
    // an SAE's features: those equal in the two runs (most of them: they are sparse) patch nothing
    const std::vector<char> feature_differs = ha.feature >= 0 ? differing_features(cache[g.hooks[0]], corrupted_resid[g.hooks[0]]) : std::vector<char>();
    if (g.shape.empty()) {  // the axes, once: they do not depend on the rows
      for (const std::string& a : axes) {
        if (std::count(axes.begin(), axes.end(), a) > 1) fail("patching: axis '", a, "' given twice");
        const int d = a == "layer" ? -1 : a == "head" ? ha.head : a == "pos" ? ha.pos : a == "src_pos" ? ha.src_pos
                    : a == "feature" ? ha.feature : -2;
        if (d == -2) fail("patching: unknown axis '", a, "' (expected layer, head, pos, src_pos, or feature for an SAE's features)");
        if (a != "layer" && d < 0) fail("patching: ", g.hooks[0], " ", s.str(), " has no ", a, " axis");
        dim.push_back(d);
        g.shape.push_back(d < 0 ? model.cfg.n_layers : s[d]);
      }
      n = 1;
      for (int64_t k : g.shape) n *= k;
      g.values.assign(static_cast<size_t>(n), 0.0);
    }
    // windowed runs waiting to go as the rows of one forward_from (StackedRuns)
    const int64_t R = end - begin, T = clean.shape[1];
    StackedRuns stack(windowed ? stacked_runs_at_most(model.cfg, R, window, block_kv_bytes(model.cfg, R, window.end)) : 1, R, window.end);
    auto run_stack = [&] {
      if (stack.empty()) return;
      const int64_t k = static_cast<int64_t>(stack.runs.size()), p0 = stack.p0, W = window.end - p0, V = model.cfg.vocab_size;
      std::vector<const std::vector<std::pair<int, int64_t>>*> fixed;  // per copy
      for (const StackedRuns::Run& r : stack.runs) fixed.push_back(&r.fixed);
      Hooks hooks;
      hooks.add_forward(*stack.name, [&](const Tensor& x, const std::string&) {  // the setter: copy j writes run j's patch
        return written_where(x, *stack.from, fixed, ha.pos, p0);
      });
      ForwardOptions opt;
      opt.hooks = &hooks;
      opt.kv_cache = &kv.from(stack.block, p0, k);
      opt.stop_at_layer = model.cfg.n_layers;
      const Tensor start = slice(corrupted_resid[hook_name(stack.block, "hook_resid_pre")], 1, p0, window.end);  // (R, W, D)
      const Tensor resid = model.forward_from(stack.block, k == 1 ? start : concat(std::vector<Tensor>(static_cast<size_t>(k), start), 0), opt);
      // every copy's answers at or after its own patch, unembedded together; those before it read the corrupted run
      std::vector<PassLogits> logits(static_cast<size_t>(k));
      std::vector<int32_t> rows;              // the answers' rows of resid viewed as (k R W, d_model)
      std::vector<std::pair<int64_t, int64_t>> keys;  // their (copy, row * T + pos)
      for (int64_t j = 0; j < k; ++j) {
        PassLogits& lj = logits[static_cast<size_t>(j)];
        lj.T = T, lj.V = V;
        for (const PatchAnswer& a : *answers) {
          if (a.row < begin || a.row >= end) continue;
          const int64_t key = (a.row - begin) * T + a.pos;
          if (a.pos < stack.runs[static_cast<size_t>(j)].p0) lj.at[key] = unpatched().data() + key * V;  // before the patch: unchanged
          else if (!lj.at.count(key))
            lj.at[key] = nullptr, rows.push_back(static_cast<int32_t>((j * R + a.row - begin) * W + a.pos - p0)), keys.push_back({j, key});
        }
      }
      Tensor at_answers;  // (answers, V)
      if (!rows.empty())
        at_answers = model.unembed(gather_rows(reshape(resid, {k * R * W, model.cfg.d_model}), Ids(Shape{static_cast<int64_t>(rows.size())}, rows)));
      for (size_t i = 0; i < keys.size(); ++i) logits[static_cast<size_t>(keys[i].first)].at[keys[i].second] = at_answers.data() + static_cast<int64_t>(i) * V;
      for (int64_t j = 0; j < k; ++j) {
        PassLogits& lj = logits[static_cast<size_t>(j)];
        if (at_answers.defined()) lj.keep.push_back(at_answers);
        if (corrupted_logits.defined()) lj.keep.push_back(corrupted_logits);
        on_pass(stack.runs[static_cast<size_t>(j)].flat, stack.runs[static_cast<size_t>(j)].idx, lj, begin);
        if (passed) passed();
      }
      stack.clear();
    };
    std::vector<int64_t> idx(axes.size(), 0), stride(static_cast<size_t>(s.ndim), 1);
    for (int d = s.ndim - 2; d >= 0; --d) stride[d] = stride[d + 1] * s[d + 1];
    for (int64_t flat = 0; flat < n; ++flat) {
      throw_if_stopped();  // each index is a pass over a chunk of rows
      for (int64_t f = flat, a = static_cast<int64_t>(axes.size()) - 1; a >= 0; --a) idx[a] = f % g.shape[a], f /= g.shape[a];
      int layer = 0;
      int64_t patched_pos = -1;  // the position the patch writes at, or -1: all of them
      std::vector<std::pair<int, int64_t>> fixed;  // (activation axis, index) the patch writes at
      for (size_t a = 0; a < axes.size(); ++a) {
        if (dim[a] < 0) layer = static_cast<int>(idx[a]);
        else fixed.push_back({dim[a], idx[a]});
        if (dim[a] >= 0 && dim[a] == ha.pos) patched_pos = idx[a];
      }
      const std::string& name = g.hooks[by_layer ? layer : 0];
      const Tensor& from = cache[name];
      const int block = hook_layer(name);  // the block whose hook is patched (-1: hook_embed, ln_final, ...)
      const int64_t p0 = patched_pos >= 0 ? patched_pos : window.first_change;  // windowed: the first position changed
      bool unchanged = false;
      for (const auto& [d, k] : fixed)
        if (d == ha.feature) unchanged = !feature_differs[static_cast<size_t>(k)];
      // a patch before the window or past the answers, or writing what is there, is the corrupted run
      if (!unchanged)
        unchanged = (windowed && ((patched_pos >= 0 && patched_pos < window.first_change) || p0 >= window.end)) ||
                    (corrupted_resid.has(name) && same_where(from, corrupted_resid[name], fixed, stride));
      if (unchanged) {
        on_pass(flat, idx, every_position(unpatched()), begin);
        if (passed) passed();
        continue;
      }
      if (!windowed) {
        Hooks hooks;
        hooks.add_forward(name, [&](const Tensor& x, const std::string&) {  // the setter
          return written_where(x, from, {&fixed}, -1, 0);
        });
        ForwardOptions opt;
        opt.hooks = &hooks;
        const Tensor logits = block > 0 ? model.forward_from(block, corrupted_resid[hook_name(block, "hook_resid_pre")], opt)
                                        : model.forward(chunk_corrupted, opt);  // (rows, T, V)
        on_pass(flat, idx, every_position(logits), begin);
        if (passed) passed();
        continue;
      }
      // the window: positions [p0, end) from block `block` on, after the corrupted keys and values;
      // stacked with the runs before it when they start at the same block and near p0
      if (!stack.empty() && !stack.joins(block, p0)) run_stack();
      stack.add({flat, idx, fixed, p0}, block, &from, &name);
      if (stack.full()) run_stack();
    }
    run_stack();
  }
  return g;
}

// The mean logit difference of runs over `ids` in chunks, and with `each` every answer's own.
double chunked_metric(TransformerLM& model, const Ids& ids, const std::vector<PatchAnswer>& answers, int64_t per,
                      std::vector<double>* each = nullptr) {
  EvalScope mode(model);
  NoGradGuard ng;
  LogitDifferenceSum total(answers);
  if (each) each->assign(answers.size(), 0.0);
  for (const auto& [begin, end] : row_chunks(ids.shape[0], per)) {
    throw_if_stopped();
    const Tensor logits = model.forward(slice_rows(ids, begin, end));
    total.add(logits, begin);
    if (each) each_answer(logits, answers, begin, *each);
  }
  return total.value();
}

}  // namespace

PatchGrid generic_activation_patch(TransformerLM& model, const Ids& clean, const Ids& corrupted, const std::string& hook,
                                   const std::vector<std::string>& axes, const PatchMetric& metric) {
  // the metric sees each patched run's logits of every row at once: one chunk
  std::vector<double> values;
  PatchGrid g = sweep(model, clean, corrupted, hook, axes, std::max<int64_t>(1, clean.shape[0]),
                      [&](int64_t flat, const std::vector<int64_t>& idx, const PassLogits& logits, int64_t) {
                        values.resize(static_cast<size_t>(flat) + 1);
                        values[static_cast<size_t>(flat)] = metric(logits.every, idx);
                      });
  g.values = values;
  return g;
}

PatchGrid generic_activation_patch(TransformerLM& model, const PatchingInputs& in, const std::string& hook,
                                   const std::vector<std::string>& axes) {
  if (in.clean.shape.ndim != 2 || in.clean.shape != in.corrupted.shape)
    fail("patching: the clean ids ", in.clean.shape.str(), " and the corrupted ids ", in.corrupted.shape.str(), " must be (B, T) of one shape");
  check_patching_padding(in, "patching");
  const int64_t per = rows_per_pass(model.cfg, in.clean.shape[0], in.clean.shape[1], false);
  const double mc = chunked_metric(model, in.clean, in.answers, per), mk = chunked_metric(model, in.corrupted, in.answers, per);
  const double span = mc - mk;
  if (!(std::fabs(span) > 0)) fail("patching: the clean and the corrupted runs give the same metric (", mc, "): nothing to restore");
  std::vector<LogitDifferenceSum> sums;  // per index, over the chunks
  PatchGrid g = sweep(model, in.clean, in.corrupted, hook, axes, per,
                      [&](int64_t flat, const std::vector<int64_t>&, const PassLogits& logits, int64_t row0) {
                        if (sums.size() <= static_cast<size_t>(flat)) sums.resize(static_cast<size_t>(flat) + 1, LogitDifferenceSum(in.answers));
                        sums[static_cast<size_t>(flat)].add(logits, row0);
                      }, {}, &in.answers);
  for (size_t i = 0; i < g.values.size(); ++i) g.values[i] = (sums[i].value() - mk) / span;
  g.clean_metric = mc, g.corrupted_metric = mk;
  return g;
}

PatchingResult activation_patching(TransformerLM& model, const PatchingInputs& in, const std::function<void(size_t, size_t)>& progress) {
  const int L = model.cfg.n_layers, H = model.cfg.n_heads;
  const int64_t B = in.clean.shape[0], T = in.clean.shape[1], dh = model.cfg.head_dim(), D = model.cfg.d_model;
  // every pass runs over chunks of rows (the corrupted run's backward sets their size); what is
  // summed over rows carries its sum from chunk to chunk, so the result is one batch's, bit for bit
  check_patching_padding(in, "patching");
  const int64_t per = rows_per_pass(model.cfg, B, T, true);
  PatchingResult r;
  std::vector<double> clean_each, corrupted_each;
  r.clean_metric = chunked_metric(model, in.clean, in.answers, per, &clean_each);
  r.corrupted_metric = chunked_metric(model, in.corrupted, in.answers, per, &corrupted_each);
  const double span = r.clean_metric - r.corrupted_metric;
  if (!(std::fabs(span) > 0)) fail("patching: the clean and the corrupted runs give the same metric (", r.clean_metric, "): nothing to restore");
  auto normalised = [&](double m) { return (m - r.corrupted_metric) / span; };
  // attribution: (clean - corrupted) . d metric / d activation, summed over the rows' elements
  HeadGrid z_attribution(L, std::vector<double>(H)), resid_attribution(L, std::vector<double>(T));
  const float w = 1.f / static_cast<float>(in.answers.size());
  for (const auto& [begin, end] : row_chunks(B, per)) {
    throw_if_stopped();
    auto wanted = [](const std::string& n) { return n.ends_with("attn.hook_z") || n.ends_with("hook_resid_pre"); };
    const Ids chunk_clean = slice_rows(in.clean, begin, end), chunk_corrupted = slice_rows(in.corrupted, begin, end);
    ActivationCache clean, corrupt;
    {
      EvalScope mode(model);
      NoGradGuard ng;
      clean = model.run_with_cache(chunk_clean, wanted).second;
    }
    {
      EvalScope mode(model);
      auto [logits, cache] = model.run_with_cache(chunk_corrupted, wanted, true);
      sum(weighted_logit_difference(logits, in.answers, begin, w)).backward();
      model.zero_grad();  // the parameters' gradients are a by-product
      corrupt = std::move(cache);
    }
    for (int l = 0; l < L; ++l) {
      const std::string zn = attn_hook(l, "z"), res = hook_name(l, "hook_resid_pre");
      const Tensor &cz = clean[zn], &kz = corrupt[zn], &gz = corrupt.grad(zn);  // (rows, T, H, dh)
      const Tensor &cr = clean[res], &kr = corrupt[res], &gr = corrupt.grad(res);  // (rows, T, D)
      for (int h = 0; h < H; ++h)
        z_attribution[l][h] = attribution(z_attribution[l][h], cz, kz, gz, [&](int64_t i) { return (i / dh) % H == h; });
      for (int64_t t = 0; t < T; ++t)
        resid_attribution[l][t] = attribution(resid_attribution[l][t], cr, kr, gr, [&](int64_t i) { return (i / D) % T == t; });
    }
  }
  // exact patching: the generic sweeps over (layer, head) of hook_z and (layer, pos) of hook_resid_pre
  const size_t runs = row_chunks(B, per).size() * static_cast<size_t>(L * H + L * T);
  size_t done = 0;
  auto passed = [&] {
    if (progress) progress(++done, runs);
  };
  std::vector<LogitDifferenceSum> z_sums(static_cast<size_t>(L * H), LogitDifferenceSum(in.answers));
  std::vector<std::vector<double>> z_each(static_cast<size_t>(L * H), std::vector<double>(in.answers.size()));
  (void)sweep(model, in.clean, in.corrupted, "attn.hook_z", {"layer", "head"}, per,
              [&](int64_t flat, const std::vector<int64_t>&, const PassLogits& logits, int64_t row0) {
                z_sums[static_cast<size_t>(flat)].add(logits, row0);
                each_answer(logits, in.answers, row0, z_each[static_cast<size_t>(flat)]);
              }, passed, &in.answers);
  std::vector<LogitDifferenceSum> resid_sums(static_cast<size_t>(L * T), LogitDifferenceSum(in.answers));
  (void)sweep(model, in.clean, in.corrupted, "hook_resid_pre", {"layer", "pos"}, per,
              [&](int64_t flat, const std::vector<int64_t>&, const PassLogits& logits, int64_t row0) {
                resid_sums[static_cast<size_t>(flat)].add(logits, row0);
              }, passed, &in.answers);
  r.z_exact = r.z_attribution = r.z_exact_ci95_lo = r.z_exact_ci95_hi = HeadGrid(L, std::vector<double>(H));
  r.resid_exact = r.resid_attribution = HeadGrid(L, std::vector<double>(T));
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h) {
      const std::vector<double>& patched_each = z_each[static_cast<size_t>(l * H + h)];
      // resampling the answers: the normalised restoration of each resample
      const Interval ci = bootstrap_interval95(
          in.answers.size(),
          [&](const std::vector<size_t>& idx) {
            double p = 0, c = 0, k = 0;
            for (size_t i : idx) p += patched_each[i], c += clean_each[i], k += corrupted_each[i];
            return c != k ? (p - k) / (c - k) : 0.0;
          },
          1000, 1 + 131 * l + h);
      r.z_exact_ci95_lo[l][h] = ci.lo, r.z_exact_ci95_hi[l][h] = ci.hi;
      r.z_exact[l][h] = normalised(z_sums[static_cast<size_t>(l * H + h)].value());
      r.z_attribution[l][h] = z_attribution[l][h] / span;
    }
    for (int64_t t = 0; t < T; ++t) {
      r.resid_exact[l][t] = normalised(resid_sums[static_cast<size_t>(l * T + t)].value());
      r.resid_attribution[l][t] = resid_attribution[l][t] / span;
    }
  }
  r.z_correlation = pearson(r.z_exact, r.z_attribution);
  r.resid_correlation = pearson(r.resid_exact, r.resid_attribution);
  return r;
}

std::pair<double, double> patch_whole_activation(TransformerLM& model, const PatchingInputs& in, const std::string& name) {
  const ActivationCache clean = run_recorded(model, in, in.clean, name_is(name), false);
  const ActivationCache corrupt = run_recorded(model, in, in.corrupted, name_is(name), true);
  const double mc = metric_of(model, in.clean, in.answers), mk = metric_of(model, in.corrupted, in.answers);
  Hooks hooks;
  hooks.add_forward(name, [&](const Tensor&, const std::string&) { return clean[name].clone(); });
  const double exact = (metric_of(model, in.corrupted, in.answers, &hooks) - mk) / (mc - mk);
  const double attr = attribution(0.0, clean[name], corrupt[name], corrupt.grad(name), [](int64_t) { return true; }) / (mc - mk);
  return {exact, attr};
}

}  // namespace hl
