#include "analysis/heads.h"

#include "analysis/intervals.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hl {

namespace {
HeadGrid grid(const TransformerLM& m, double v = 0) {
  return HeadGrid(m.cfg.n_layers, std::vector<double>(m.cfg.n_heads, v));
}
bool is_pad(const Batch& b, int64_t row, int64_t t) {
  return b.key_padding.defined() && b.key_padding.at({row, t}) != 0.f;
}
}  // namespace

ActivationCache recorded_forward(TransformerLM& model, const Batch& b, NameFilter filter) {
  EvalScope mode(model);
  NoGradGuard ng;
  // Only the cache is returned: the forward stops after the last block with a recorded hook, so
  // neither later blocks nor the (B, T, vocab) logits are computed (GPT-2's vocabulary: 50,257
  // floats per token, more than the rest of the forward's activations together).
  int stop = 0;
  for (const auto& [name, shape] : hook_points(model.cfg)) {
    if (!filter(name)) continue;
    if (const int layer = hook_layer(name); layer >= 0) stop = std::max(stop, layer + 1);
    else if (name.rfind("ln_final.", 0) == 0) stop = model.cfg.n_layers + 1;  // needs the whole forward
  }
  ActivationCache cache;
  Hooks hooks;
  hooks.cache(cache, std::move(filter), false);
  ForwardOptions opt;
  opt.hooks = &hooks;
  opt.key_padding = b.key_padding;
  if (stop <= model.cfg.n_layers) opt.stop_at_layer = stop;
  (void)model.forward(b.inputs, opt);
  return cache;
}

namespace {
// Per layer, the attention activation `name` (e.g. "z") of one recorded forward, as raw pointers.
std::vector<const float*> per_layer(const ActivationCache& c, int layers, const char* name) {
  std::vector<const float*> p;
  for (int l = 0; l < layers; ++l) p.push_back(c[attn_hook(l, name)].data());
  return p;
}

// f(acts, b, row, t, T) for every non-padded position of every batch, with `name` of each layer
// from one recorded forward per batch.
template <class F>
void for_each_token(TransformerLM& model, const std::vector<Batch>& data, const char* name, F&& f) {
  for (const Batch& b : data) {
    const ActivationCache cache = recorded_forward(model, b, names_ending_with(in_block_name(attn_hook(0, name))));
    const std::vector<const float*> acts = per_layer(cache, model.cfg.n_layers, name);
    const int64_t B = b.size(), T = b.inputs.shape[1];
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t)
        if (!is_pad(b, r, t)) f(acts, b, r, t, T);
  }
}
}  // namespace

std::vector<Tensor> mean_head_outputs(TransformerLM& model, const std::vector<Batch>& data) {
  const int L = model.cfg.n_layers;
  const int64_t W = model.cfg.n_heads * model.cfg.head_dim();
  std::vector<std::vector<double>> sums(L, std::vector<double>(W, 0.0));
  int64_t count = 0;
  for_each_token(model, data, "z", [&](const std::vector<const float*>& zs, const Batch&, int64_t r, int64_t t, int64_t T) {
    for (int l = 0; l < L; ++l) {
      const float* z = zs[l] + (r * T + t) * W;  // (B, T, H, dh)
      for (int64_t j = 0; j < W; ++j) sums[l][j] += z[j];
    }
    ++count;
  });
  std::vector<Tensor> out;
  for (int l = 0; l < L; ++l) {
    Tensor m = Tensor::empty({W});
    for (int64_t j = 0; j < W; ++j) m.data()[j] = static_cast<float>(count ? sums[l][j] / count : 0.0);
    out.push_back(m);
  }
  return out;
}

AblationResult single_head_ablation(TransformerLM& model, const std::vector<Batch>& data) {
  AblationResult r;
  std::vector<double> base_rows, rows;  // summed loss per example
  r.base = evaluate(model, data, false, nullptr, &base_rows);
  r.d_loss = r.d_acc = r.d_loss_mean = r.d_acc_mean = grid(model);
  r.d_loss_ci95_lo = r.d_loss_ci95_hi = r.d_loss_mean_ci95_lo = r.d_loss_mean_ci95_hi = grid(model);
  std::vector<double> counted;  // counted targets per example
  for (const Batch& b : data)
    for (int64_t row = 0; row < b.size(); ++row) {
      double n = 0;
      for (int64_t t = 0; t < b.targets.shape[1]; ++t) n += b.targets.at(row, t) >= 0;
      counted.push_back(n);
    }
  const std::vector<Tensor> means = mean_head_outputs(model, data);
  const int L = model.cfg.n_layers, H = model.cfg.n_heads;
  const int64_t dh = model.cfg.head_dim();
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      for (int mode = 0; mode < 2; ++mode) {
        // head h of layer l's z replaced by zeros, or by its mean output
        const Tensor value = mode == 1 ? slice(means[l], 0, h * dh, (h + 1) * dh) : Tensor();
        Hooks hooks;
        hooks.add_forward(attn_hook(l, "z"), [h, value](const Tensor& z, const std::string&) {
          return replace_head(z, h, value);
        });
        const EvalResult e = evaluate(model, data, false, &hooks, &rows);
        (mode == 0 ? r.d_loss : r.d_loss_mean)[l][h] = e.loss - r.base.loss;
        (mode == 0 ? r.d_acc : r.d_acc_mean)[l][h] = e.token_acc - r.base.token_acc;
        // resampling the examples: the change of the loss per counted target
        const Interval ci = bootstrap_interval95(
            rows.size(),
            [&](const std::vector<size_t>& idx) {
              double d = 0, n = 0;
              for (size_t i : idx) d += rows[i] - base_rows[i], n += counted[i];
              return n > 0 ? d / n : 0.0;
            },
            1000, 1 + 131 * l + h + 7919 * mode);
        (mode == 0 ? r.d_loss_ci95_lo : r.d_loss_mean_ci95_lo)[l][h] = ci.lo;
        (mode == 0 ? r.d_loss_ci95_hi : r.d_loss_mean_ci95_hi)[l][h] = ci.hi;
      }
  return r;
}

namespace {
// Runs forward + backward of the summed token loss on each batch, caching the activations
// (and gradients) that pass `filter`; calls visit(batch, cache).
void backward_each(TransformerLM& model, const std::vector<Batch>& data, NameFilter filter,
                   const std::function<void(const Batch&, const ActivationCache&)>& visit) {
  EvalScope mode(model);
  for (const Batch& b : data) {
    auto [logits, cache] = model.run_with_cache(b.inputs, filter, true, b.key_padding);
    Tensor loss = mul_scalar(cross_entropy(logits, b.targets), static_cast<float>(b.counted_targets()));  // summed
    loss.backward();
    visit(b, cache);
    model.zero_grad();
  }
}
}  // namespace

HeadGrid gate_gradients(TransformerLM& model, const std::vector<Batch>& data) {
  model.set_gates_require_grad(true);
  HeadGrid g = grid(model);
  backward_each(model, data, [](const std::string&) { return false; }, [&](const Batch&, const ActivationCache&) {
    for (int l = 0; l < model.cfg.n_layers; ++l) {
      const Tensor gg = model.gates(l).grad();
      for (int h = 0; h < model.cfg.n_heads; ++h) g[l][h] += gg.defined() ? gg.data()[h] : 0.0;
      model.gates(l).zero_grad();
    }
  });
  model.set_gates_require_grad(false);
  return g;
}

namespace {
void normalize_layers(HeadGrid& g) {
  for (auto& row : g) {
    double n = 0;
    for (double v : row) n += v * v;
    n = std::sqrt(n);
    if (n > 0)
      for (double& v : row) v /= n;
  }
}

// sum_d z_h[t,d] g[t,d] for every head of one position: z and g point at the position's (H*dh) row.
void head_dots(const float* z, const float* g, int H, int64_t dh, double* out) {
  for (int h = 0; h < H; ++h) {
    double s = 0;
    for (int64_t j = h * dh; j < (h + 1) * dh; ++j) s += static_cast<double>(z[j]) * g[j];
    out[h] = s;
  }
}
}  // namespace

HeadGrid head_importance(TransformerLM& model, const std::vector<Batch>& data, bool normalize_per_layer,
                         std::vector<HeadGrid>* per_example) {
  HeadGrid imp = grid(model);
  const int H = model.cfg.n_heads;
  const int64_t dh = model.cfg.head_dim(), W = H * dh;
  int64_t examples = 0;
  std::vector<double> row_sum(static_cast<size_t>(H)), dots(static_cast<size_t>(H));
  // The summed token loss is sum over rows of n_r L(x_r), and rows do not see each other, so on
  // row r its gradient is n_r dL(x_r)/dz: the row's sum of z . dL/dz over n_r is dL(x_r)/dxi_h.
  backward_each(model, data, names_ending_with(in_block_name(attn_hook(0, "z"))), [&](const Batch& b, const ActivationCache& cache) {
    const int64_t B = b.size(), T = b.inputs.shape[1];
    std::vector<int64_t> counted(static_cast<size_t>(B), 0);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t) counted[static_cast<size_t>(r)] += b.targets.at(r, t) >= 0;
    std::vector<size_t> example_of(static_cast<size_t>(B));  // a row's place in per_example
    for (int64_t r = 0; r < B; ++r) {
      examples += counted[static_cast<size_t>(r)] > 0;
      if (per_example && counted[static_cast<size_t>(r)] > 0) {
        example_of[static_cast<size_t>(r)] = per_example->size();
        per_example->push_back(grid(model));
      }
    }
    for (int l = 0; l < model.cfg.n_layers; ++l) {
      const std::string name = attn_hook(l, "z");
      if (!cache.has_grad(name)) continue;
      const Tensor &z = cache[name], &gz = cache.grad(name);  // (B, T, H, dh)
      for (int64_t r = 0; r < B; ++r) {
        const int64_t n = counted[static_cast<size_t>(r)];
        if (n == 0) continue;
        std::fill(row_sum.begin(), row_sum.end(), 0.0);
        for (int64_t t = 0; t < T; ++t) {
          if (is_pad(b, r, t)) continue;
          head_dots(z.data() + (r * T + t) * W, gz.data() + (r * T + t) * W, H, dh, dots.data());
          for (int h = 0; h < H; ++h) row_sum[static_cast<size_t>(h)] += dots[static_cast<size_t>(h)];
        }
        for (int h = 0; h < H; ++h) imp[l][h] += std::fabs(row_sum[static_cast<size_t>(h)]) / static_cast<double>(n);
        if (per_example)
          for (int h = 0; h < H; ++h)
            (*per_example)[example_of[static_cast<size_t>(r)]][l][h] = std::fabs(row_sum[static_cast<size_t>(h)]) / static_cast<double>(n);
      }
    }
  });
  for (auto& row : imp)
    for (double& v : row) v /= static_cast<double>(std::max<int64_t>(examples, 1));
  if (normalize_per_layer) normalize_layers(imp);
  return imp;
}

HeadGrid head_importance_per_token(TransformerLM& model, const std::vector<Batch>& data, bool normalize_per_layer) {
  HeadGrid imp = grid(model);
  const int H = model.cfg.n_heads;
  const int64_t dh = model.cfg.head_dim(), W = H * dh;
  int64_t n_tokens = 0;
  std::vector<double> dots(static_cast<size_t>(H));
  backward_each(model, data, names_ending_with(in_block_name(attn_hook(0, "z"))), [&](const Batch& b, const ActivationCache& cache) {
    const int64_t B = b.size(), T = b.inputs.shape[1];
    n_tokens += b.counted_targets();
    for (int l = 0; l < model.cfg.n_layers; ++l) {
      const std::string name = attn_hook(l, "z");
      if (!cache.has_grad(name)) continue;
      const Tensor &z = cache[name], &gz = cache.grad(name);  // (B, T, H, dh)
      for (int64_t r = 0; r < B; ++r)
        for (int64_t t = 0; t < T; ++t) {
          if (is_pad(b, r, t)) continue;
          head_dots(z.data() + (r * T + t) * W, gz.data() + (r * T + t) * W, H, dh, dots.data());
          for (int h = 0; h < H; ++h) imp[l][h] += std::fabs(dots[static_cast<size_t>(h)]);
        }
    }
  });
  for (auto& row : imp)
    for (double& v : row) v /= static_cast<double>(std::max<int64_t>(n_tokens, 1));
  if (normalize_per_layer) normalize_layers(imp);
  return imp;
}

HeadStats attention_statistics(TransformerLM& model, const std::vector<Batch>& data) {
  HeadStats s{grid(model), grid(model), grid(model), grid(model)};
  const int L = model.cfg.n_layers, H = model.cfg.n_heads;
  int64_t queries = 0;
  for_each_token(model, data, "pattern", [&](const std::vector<const float*>& patterns, const Batch& b, int64_t r,
                                                   int64_t i, int64_t T) {
    int64_t visible = 0;
    for (int64_t j = 0; j <= i; ++j) visible += !is_pad(b, r, j);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const float* row = patterns[l] + ((r * H + h) * T + i) * T;  // (B, H, T, T)
        double e = 0, mx = -1;
        int64_t arg = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (row[j] > 0) e -= row[j] * std::log(static_cast<double>(row[j]));
          if (row[j] > mx) mx = row[j], arg = j;
        }
        s.entropy[l][h] += e;
        s.entropy_norm[l][h] += visible > 1 ? e / std::log(static_cast<double>(visible)) : 0.0;
        s.confidence[l][h] += mx;
        s.argmax_distance[l][h] += static_cast<double>(i - arg);
      }
    ++queries;
  });
  for (HeadGrid* g : {&s.entropy, &s.entropy_norm, &s.confidence, &s.argmax_distance})
    for (auto& row : *g)
      for (double& v : row) v /= std::max<int64_t>(queries, 1);
  return s;
}

std::vector<PruneStep> prune_curve(TransformerLM& model, const std::vector<Batch>& data,
                                   const std::function<HeadGrid(TransformerLM&)>& rank, const PruneOptions& opts) {
  const int L = model.cfg.n_layers, H = model.cfg.n_heads, total = L * H;
  const int per_step = std::max(1, static_cast<int>(std::lround(opts.step_fraction * total)));
  std::vector<PruneStep> curve;
  PruneStep s0;
  s0.eval = evaluate(model, data, false);
  curve.push_back(s0);
  auto alive = [&](int l, int h) { return model.gates(l).data()[h] != 0.f; };
  HeadGrid scores = rank(model);
  int pruned = 0;
  while (true) {
    if (opts.recompute && pruned > 0) scores = rank(model);
    std::vector<std::pair<double, std::pair<int, int>>> cand;
    std::vector<int> left(L, 0);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        if (alive(l, h)) {
          ++left[l];
          cand.push_back({scores[l][h], {l, h}});
        }
    std::stable_sort(cand.begin(), cand.end(), [](auto& a, auto& b) { return a.first < b.first; });
    PruneStep st;
    for (auto& [score, lh] : cand) {
      if (static_cast<int>(st.removed.size()) == per_step) break;
      if (left[lh.first] <= opts.min_per_layer) continue;
      --left[lh.first];
      st.removed.push_back(lh);
    }
    if (st.removed.empty()) break;
    for (auto& [l, h] : st.removed) model.gates(l).data()[h] = 0.f;
    pruned += static_cast<int>(st.removed.size());
    if (opts.finetune_steps > 0 && opts.finetune) opts.finetune(model, opts.finetune_steps);
    st.pruned = pruned;
    st.fraction = static_cast<double>(pruned) / total;
    st.eval = evaluate(model, data, false);
    curve.push_back(st);
  }
  return curve;
}

HeadGrid random_ranking(int n_layers, int n_heads, uint64_t seed) {
  Rng r(seed);
  HeadGrid g(n_layers, std::vector<double>(n_heads));
  for (auto& row : g)
    for (double& v : row) v = r.uniform();
  return g;
}

}  // namespace hl
