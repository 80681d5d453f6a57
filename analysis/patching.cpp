#include "analysis/patching.h"

#include "analysis/intervals.h"

#include "lib/stop.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

namespace hl {

PatchingInputs corrupt_one_symbol(const Batch& b, int alphabet, uint64_t seed) {
  const int64_t B = b.size(), T = b.inputs.shape[1];
  Rng rng(seed);
  std::vector<int64_t> rows;
  PatchingInputs in;
  for (int64_t r = 0; r < B; ++r) {
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
      if (in_prompt == 1 && answers == 1 && at >= p) choices.push_back({p, at});
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
        if (seen == 1) choices.push_back({p, at});
      }
    std::vector<int32_t> unused;
    for (int32_t s = 0; s < alphabet; ++s)
      if (!used.count(s)) unused.push_back(s);
    if (choices.empty() || unused.empty()) continue;
    const auto [p, at] = choices[rng.next_u64() % choices.size()];
    const int32_t corrupt = unused[rng.next_u64() % unused.size()];
    rows.push_back(r);
    in.answers.push_back({static_cast<int64_t>(rows.size()) - 1, at, b.inputs.at(r, p), corrupt});
    in.source_pos.push_back(p);
  }
  if (rows.empty()) fail("patching: no row has a symbol that can be corrupted (a unique source symbol whose copy is an answer, and a symbol the row does not use)");
  const int64_t R = static_cast<int64_t>(rows.size());
  in.clean = Ids(Shape{R, T});
  for (int64_t i = 0; i < R; ++i)
    for (int64_t t = 0; t < T; ++t) in.clean.at(i, t) = b.inputs.at(rows[i], t);
  in.corrupted = in.clean;
  for (int64_t i = 0; i < R; ++i) in.corrupted.at(i, in.source_pos[i]) = in.answers[i].corrupted;
  return in;
}

double patching_memory_bytes(const ModelConfig& cfg, int64_t rows, int64_t T) {
  return estimate_step_bytes(cfg, rows, T, true);
}

Tensor logit_difference(const Tensor& logits, const std::vector<PatchAnswer>& answers) {
  const int64_t T = logits.size(1), V = logits.size(2);
  Tensor select = Tensor::zeros(logits.shape());  // +1/n at the clean answer, -1/n at the corrupted one
  const float w = 1.f / static_cast<float>(answers.size());
  for (const PatchAnswer& a : answers) {
    select.data()[(a.row * T + a.pos) * V + a.clean] += w;
    select.data()[(a.row * T + a.pos) * V + a.corrupted] -= w;
  }
  return sum(mul(logits, select));
}

namespace {

// The mean logit difference, and with `each` every answer's own (for intervals).
double metric_of(TransformerLM& model, const Ids& ids, const std::vector<PatchAnswer>& answers, const Hooks* hooks = nullptr,
                 std::vector<double>* each = nullptr) {
  EvalScope mode(model);
  NoGradGuard ng;
  ForwardOptions opt;
  opt.hooks = hooks;
  const Tensor logits = model.forward(ids, opt);  // (B, T, V)
  if (each) {
    const int64_t T = logits.size(1), V = logits.size(2);
    each->clear();
    for (const PatchAnswer& a : answers) {
      const float* row = logits.data() + (a.row * T + a.pos) * V;
      each->push_back(static_cast<double>(row[a.clean]) - static_cast<double>(row[a.corrupted]));
    }
  }
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

// sum over the elements f selects of (clean - corrupted) * grad
template <class Select>
double attribution(const Tensor& clean, const Tensor& corrupted, const Tensor& grad, Select&& selected) {
  double s = 0;
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

PatchingResult activation_patching(TransformerLM& model, const PatchingInputs& in) {
  const int L = model.cfg.n_layers, H = model.cfg.n_heads;
  const int64_t T = in.clean.shape[1], dh = model.cfg.head_dim(), D = model.cfg.d_model;
  auto wanted = [](const std::string& n) {
    return n.ends_with("attn.hook_z") || n.ends_with("hook_resid_pre");
  };
  const ActivationCache clean = run_recorded(model, in, in.clean, wanted, false);
  const ActivationCache corrupt = run_recorded(model, in, in.corrupted, wanted, true);
  PatchingResult r;
  std::vector<double> clean_each, corrupted_each, patched_each;
  r.clean_metric = metric_of(model, in.clean, in.answers, nullptr, &clean_each);
  r.corrupted_metric = metric_of(model, in.corrupted, in.answers, nullptr, &corrupted_each);
  const double span = r.clean_metric - r.corrupted_metric;
  if (!(std::fabs(span) > 0)) fail("patching: the clean and the corrupted runs give the same metric (", r.clean_metric, "): nothing to restore");
  auto normalised = [&](double m) { return (m - r.corrupted_metric) / span; };
  r.z_exact = r.z_attribution = r.z_exact_ci95_lo = r.z_exact_ci95_hi = HeadGrid(L, std::vector<double>(H));
  r.resid_exact = r.resid_attribution = HeadGrid(L, std::vector<double>(T));
  for (int l = 0; l < L; ++l) {
    const std::string z = "blocks." + std::to_string(l) + ".attn.hook_z", res = "blocks." + std::to_string(l) + ".hook_resid_pre";
    const Tensor &cz = clean[z], &kz = corrupt[z], &gz = corrupt.grad(z);  // (B, T, H, dh)
    const Tensor &cr = clean[res], &kr = corrupt[res], &gr = corrupt.grad(res);  // (B, T, D)
    for (int h = 0; h < H; ++h) {
      throw_if_stopped();  // each head is a pass over every example
      auto head_h = [&](int64_t i) { return (i / dh) % H == h; };
      Hooks hooks;
      hooks.add_forward(z, [&](const Tensor& x, const std::string&) {
        Tensor y = x.clone();
        for (int64_t i = 0; i < y.numel(); ++i)
          if (head_h(i)) y.data()[i] = cz.data()[i];
        return y;
      });
      r.z_exact[l][h] = normalised(metric_of(model, in.corrupted, in.answers, &hooks, &patched_each));
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
      r.z_attribution[l][h] = attribution(cz, kz, gz, head_h) / span;
    }
    for (int64_t t = 0; t < T; ++t) {
      throw_if_stopped();
      auto at_t = [&](int64_t i) { return (i / D) % T == t; };
      Hooks hooks;
      hooks.add_forward(res, [&](const Tensor& x, const std::string&) {
        Tensor y = x.clone();
        for (int64_t i = 0; i < y.numel(); ++i)
          if (at_t(i)) y.data()[i] = cr.data()[i];
        return y;
      });
      r.resid_exact[l][t] = normalised(metric_of(model, in.corrupted, in.answers, &hooks));
      r.resid_attribution[l][t] = attribution(cr, kr, gr, at_t) / span;
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
  const double attr = attribution(clean[name], corrupt[name], corrupt.grad(name), [](int64_t) { return true; }) / (mc - mk);
  return {exact, attr};
}

}  // namespace hl
