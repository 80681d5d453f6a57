#include "analysis/feature_attribution.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "analysis/evaluate.h"
#include "analysis/features.h"
#include "lib/stop.h"
#include "models/padding.h"

namespace hl {

namespace {

void check_feature(const Sae& sae, int feature) {
  HL_CHECK(feature >= 0 && feature < sae.cfg.d_sae, "feature ", feature, " is outside the SAE's 0..", sae.cfg.d_sae - 1);
}

// The SAE's hook must be one of the model's: every function that runs the model reads it there.
void check_sae_hook(const TransformerLM& model, const Sae& sae) {
  bool known = false;
  for (const auto& [name, shape] : hook_points(model.cfg)) known = known || name == sae.cfg.hook_name;
  HL_CHECK(known, "SAE: its hook_name '", sae.cfg.hook_name, "' is not a hook point of the model (`headlab hooks` lists them)");
}

// Calls fn(batch, f) with f (B*T, d_sae) the SAE's inference activations on each batch of data,
// run with its padding (the rows' tokens: Batch::row_tokens; f at padding is not to be read).
template <class Fn>
void for_each_encoded_batch(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data, Fn fn) {
  check_sae_hook(model, sae);
  EvalScope mode(model);
  NoGradGuard no_grad;
  const std::string& hook = sae.cfg.hook_name;
  for (const Batch& b : data) {
    throw_if_stopped();
    ActivationCache cache;
    Hooks hooks;
    hooks.cache(cache, name_is(hook));
    ForwardOptions opt;
    opt.hooks = &hooks;
    opt.key_padding = b.key_padding;
    opt.stop_at_layer = hook_layer(hook) >= 0 ? hook_layer(hook) + 1 : -1;  // nothing after the hook's block
    (void)model.forward(b.inputs, opt);
    fn(b, sae.encode(sae_rows(cache[hook], sae.cfg.d_in, hook)));
  }
}

}  // namespace

int hook_z_layer(const TransformerLM& model, const Sae& sae) {
  const std::string& hook = sae.cfg.hook_name;
  const int layer = hook_layer(hook);
  HL_CHECK(layer >= 0 && layer < model.cfg.n_layers && hook == attn_hook(layer, "z"), "SAE on '", hook,
           "': head attribution needs an SAE on a layer's attention output, blocks.L.attn.hook_z with L in 0..",
           model.cfg.n_layers - 1);
  const int64_t width = model.cfg.n_heads * model.cfg.head_dim();
  HL_CHECK(sae.cfg.d_in == width, "SAE on '", hook, "': d_in ", sae.cfg.d_in, " is not the model's n_heads * d_head = ", width);
  return layer;
}

Tensor feature_head_outputs(const TransformerLM& model, const Sae& sae) {
  const int layer = hook_z_layer(model, sae);
  const int H = model.cfg.n_heads;
  const int64_t dh = model.cfg.head_dim(), D = model.cfg.d_model, F = sae.cfg.d_sae, W = H * dh;
  const float* wo = model.blocks[static_cast<size_t>(layer)]->attn.W_O.weight.data();  // (D, H*dh)
  const float* wd = sae.W_dec.data();                                                  // (F, H*dh)
  Tensor out = Tensor::zeros({F, H, D});
  for (int64_t j = 0; j < F; ++j)
    for (int h = 0; h < H; ++h) {
      float* o = out.data() + (j * H + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        double s = 0;
        for (int64_t c = h * dh; c < (h + 1) * dh; ++c) s += double(wo[d * W + c]) * wd[j * W + c];
        o[d] = static_cast<float>(s);
      }
    }
  return out;
}

double final_norm_scale(TransformerLM& model, const std::vector<Batch>& data) {
  if (!model.ln_f) return 1.0;
  EvalScope mode(model);
  NoGradGuard no_grad;
  const std::string name = get_act_name("scale");  // ln_final.hook_scale
  double sum = 0;
  int64_t n = 0;
  for (const Batch& b : data) {
    throw_if_stopped();
    auto [logits, cache] = model.run_with_cache(b.inputs, name_is(name), false, b.key_padding);
    const Tensor& s = cache[name];  // (B, T, 1)
    const int64_t B = s.size(0), T = s.size(1);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0, end = b.row_tokens(r); t < end; ++t) sum += s.data()[r * T + t], ++n;
  }
  HL_CHECK(n > 0, "final_norm_scale: no tokens in the data");
  return sum / double(n);
}

std::vector<FeatureLogitEffect> feature_logit_effects(const TransformerLM& model, const Sae& sae,
                                                      const std::vector<int>& features, double final_scale, int top_k) {
  const int layer = hook_z_layer(model, sae);
  HL_CHECK(model.cfg.norm == Norm::Pre, "feature logit effects: a post-norm model has no direct path from a head to the logits");
  HL_CHECK(!model.cfg.sandwich_norm, "feature logit effects: with sandwich_norm the attention output is normalised before the "
                                     "residual stream, so a feature has no direct path to the logits");
  HL_CHECK(std::isfinite(final_scale) && final_scale > 0, "feature logit effects: ln_final's scale must be positive, got ", final_scale);
  HL_CHECK(top_k >= 0, "feature logit effects: top_k must be at least 0, got ", top_k);
  (void)layer;
  const int H = model.cfg.n_heads;
  const int64_t D = model.cfg.d_model, V = model.cfg.vocab_size;
  const Tensor per_head = feature_head_outputs(model, sae);  // (F, H, D)
  const float* wu = model.head.weight.data();               // (V, D)
  std::vector<FeatureLogitEffect> out;
  for (int j : features) {
    check_feature(sae, j);
    std::vector<double> dir(static_cast<size_t>(D), 0.0);  // the feature's direct output (D)
    for (int h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) dir[d] += per_head.data()[(int64_t(j) * H + h) * D + d];
    if (model.ln_f) {  // ln_final with the fixed scale: centred (layer norm), divided, times the gain
      const double mu = model.ln_f->centred() ? std::accumulate(dir.begin(), dir.end(), 0.0) / double(D) : 0.0;
      for (int64_t d = 0; d < D; ++d) dir[d] = (dir[d] - mu) / final_scale * model.ln_f->gain(d);
    }
    FeatureLogitEffect e;
    e.feature = j;
    e.logits.assign(static_cast<size_t>(V), 0.0);
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += double(wu[v * D + d]) * dir[d];
      e.logits[v] = s;
    }
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return e.logits[a] > e.logits[b]; });
    const size_t n = std::min<size_t>(static_cast<size_t>(top_k), order.size());
    e.promoted.assign(order.begin(), order.begin() + n);
    e.suppressed.assign(order.rbegin(), order.rbegin() + n);
    out.push_back(std::move(e));
  }
  return out;
}

FeatureSourceAttribution feature_source_attribution(TransformerLM& model, const Sae& sae, const Ids& ids, int feature,
                                                    const Tensor& key_padding) {
  const int layer = hook_z_layer(model, sae);
  check_feature(sae, feature);
  HL_CHECK(ids.shape.ndim == 2, "feature source attribution: ids must be (B, T), got ", ids.shape.str());
  const int H = model.cfg.n_heads, Hkv = model.cfg.kv_heads();
  const int64_t dh = model.cfg.head_dim(), B = ids.shape[0], T = ids.shape[1], W = H * dh, F = sae.cfg.d_sae;
  const std::string z_name = attn_hook(layer, "z"), v_name = attn_hook(layer, "v"), p_name = attn_hook(layer, "pattern");
  EvalScope mode(model);
  NoGradGuard no_grad;
  ActivationCache cache;
  Hooks hooks;
  hooks.cache(cache, names_in({z_name, v_name, p_name}));
  Ids positions;  // a left-padded row's positions start at its first token
  if (key_padding.defined()) {
    (void)leading_padding({key_padding.data(), static_cast<size_t>(key_padding.numel())}, B, T, "feature attribution: attention_mask");
    positions = positions_from_padding(key_padding);
  }
  ForwardOptions opt;
  opt.hooks = &hooks;
  opt.key_padding = key_padding;
  if (key_padding.defined()) opt.position_ids = &positions;
  opt.stop_at_layer = layer + 1;
  (void)model.forward(ids, opt);
  const float* v = cache[v_name].data();        // (B, T, Hkv, dh), with W_V's bias
  const float* P = cache[p_name].data();        // (B, H, T, T)
  const float* g = model.blocks[static_cast<size_t>(layer)]->attn.gates.data();  // (H)
  const float* we = sae.W_enc.data();           // (W, F)
  FeatureSourceAttribution r;
  r.feature = feature, r.heads = H, r.batch = B, r.tokens = T;
  r.bias = sae.b_enc.data()[feature];
  if (sae.cfg.apply_b_dec_to_input)
    for (int64_t c = 0; c < W; ++c) r.bias -= double(sae.b_dec.data()[c]) * we[c * F + feature];
  // With layer_norm each query's row is centred and divided by its std (+ eps), constants of the
  // query: the encoder column centred over its W entries takes the mean away (so a sum over the
  // sources stays a sum), and the query's contributions are divided by its std + eps.
  std::vector<double> w_col(static_cast<size_t>(W));
  for (int64_t c = 0; c < W; ++c) w_col[c] = we[c * F + feature];
  std::vector<double> inv_scale(static_cast<size_t>(B * T), 1.0);  // per query
  const Tensor rows = sae_rows(cache[z_name], W, z_name);
  if (sae.layer_norm()) {
    const double m = std::accumulate(w_col.begin(), w_col.end(), 0.0) / double(W);
    for (double& w : w_col) w -= m;
    Tensor sd;
    sae.normalize_input(rows, &sd);
    for (int64_t i = 0; i < B * T; ++i) inv_scale[i] = 1.0 / (double(sd.data()[i]) + 1e-5);
  }
  // vw[b, s, h]: g_h v[b, s, head h's kv head] . W_enc[block h, feature]
  std::vector<double> vw(static_cast<size_t>(B * T * H));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < T; ++s)
      for (int h = 0; h < H; ++h) {
        const float* vh = v + ((b * T + s) * Hkv + h / (H / Hkv)) * dh;
        double acc = 0;
        for (int64_t d = 0; d < dh; ++d) acc += double(vh[d]) * w_col[h * dh + d];
        vw[static_cast<size_t>((b * T + s) * H + h)] = double(g[h]) * acc;
      }
  r.contribution.assign(static_cast<size_t>(B * T * H * T), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t q = 0; q < T; ++q)
      for (int h = 0; h < H; ++h)
        for (int64_t s = 0; s < T; ++s)
          r.contribution[static_cast<size_t>(((b * T + q) * H + h) * T + s)] =
              double(P[((b * H + h) * T + q) * T + s]) * vw[static_cast<size_t>((b * T + s) * H + h)] * inv_scale[b * T + q];
  const Tensor pre = sae.pre_acts(rows), f = sae.encode(rows);  // (B*T, F)
  for (int64_t i = 0; i < B * T; ++i) {
    r.pre_activation.push_back(pre.data()[i * F + feature]);
    r.activation.push_back(f.data()[i * F + feature]);
  }
  if (key_padding.defined())  // a padding query is no token: nothing to attribute
    for (int64_t i = 0; i < B * T; ++i)
      if (key_padding.data()[i] != 0.f) {
        r.pre_activation[i] = r.activation[i] = std::numeric_limits<double>::quiet_NaN();
        std::fill_n(r.contribution.begin() + i * H * T, H * T, 0.0);
      }
  return r;
}

std::vector<FeatureExamples> top_activating_examples(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data,
                                                     const std::vector<int>& features, int k, int before, int after) {
  HL_CHECK(k >= 1 && before >= 0 && after >= 0, "top examples: k must be at least 1 and the window's sides at least 0, got k ", k,
           ", before ", before, ", after ", after);
  for (int j : features) check_feature(sae, j);
  std::vector<FeatureExamples> out(features.size());
  for (size_t i = 0; i < features.size(); ++i) out[i].feature = features[i];
  const int64_t F = sae.cfg.d_sae;
  int64_t row0 = 0;
  for_each_encoded_batch(model, sae, data, [&](const Batch& batch, const Tensor& f) {
    const Ids& ids = batch.inputs;
    const int64_t B = ids.shape[0], T = ids.shape[1];
    for (size_t i = 0; i < features.size(); ++i) {
      const int j = features[i];
      std::vector<FeatureExample>& ex = out[i].examples;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t n = batch.row_tokens(b);  // the row's tokens; the padding after them is no example
        int64_t best = 0;
        for (int64_t t = 1; t < n; ++t)
          if (f.data()[(b * T + t) * F + j] > f.data()[(b * T + best) * F + j]) best = t;
        const double top = f.data()[(b * T + best) * F + j];
        if (!(top > 0)) continue;  // the feature does not fire in this row
        if (static_cast<int>(ex.size()) == k && !(top > ex.back().max_activation)) continue;
        FeatureExample e;
        e.row = row0 + b, e.position = best, e.max_activation = top;
        e.window_start = std::max<int64_t>(0, best - before);
        for (int64_t t = e.window_start; t <= std::min<int64_t>(n - 1, best + after); ++t) {
          e.tokens.push_back(ids.data[static_cast<size_t>(b * T + t)]);
          e.activations.push_back(f.data()[(b * T + t) * F + j]);
        }
        // insert after every example at least as large (earlier rows first among ties)
        const auto at = std::upper_bound(ex.begin(), ex.end(), top,
                                         [](double v, const FeatureExample& x) { return v > x.max_activation; });
        ex.insert(at, std::move(e));
        if (static_cast<int>(ex.size()) > k) ex.pop_back();
      }
    }
    row0 += B;
  });
  return out;
}

FeaturePresence feature_presence(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data) {
  const int64_t F = sae.cfg.d_sae;
  FeaturePresence p;
  p.mean_activation.assign(static_cast<size_t>(F), 0.0);
  p.firing_frequency.assign(static_cast<size_t>(F), 0.0);
  for_each_encoded_batch(model, sae, data, [&](const Batch& b, const Tensor& f) {
    const int64_t T = b.inputs.shape[1];
    for (int64_t row = 0; row < b.inputs.shape[0]; ++row) {
      const int64_t n = b.row_tokens(row);
      for (int64_t r = row * T; r < row * T + n; ++r)
        for (int64_t j = 0; j < F; ++j) {
          const float a = f.data()[r * F + j];
          p.mean_activation[j] += a;
          p.firing_frequency[j] += a != 0.f;
        }
      p.tokens += n;
    }
  });
  HL_CHECK(p.tokens > 0, "feature presence: no tokens in the data");
  for (int64_t j = 0; j < F; ++j) p.mean_activation[j] /= double(p.tokens), p.firing_frequency[j] /= double(p.tokens);
  return p;
}

ForwardHook sae_splice_edited(const Sae& sae, const std::vector<int>& features, float value, bool keep_error) {
  for (int j : features) check_feature(sae, j);
  // f -> f * keep + set: the edited features' activations replaced by `value`
  Tensor keep = Tensor::ones({sae.cfg.d_sae}), set = Tensor::zeros({sae.cfg.d_sae});
  for (int j : features) keep.data()[j] = 0.f, set.data()[j] = value;
  return [sae, keep, set, keep_error](const Tensor& x, const std::string& name) {
    const Tensor rows = sae_rows(x, sae.cfg.d_in, name);  // (N, d_in)
    const Tensor f = sae.encode(rows);                     // (N, d_sae)
    const Tensor edited = add(mul(f, keep), set);
    if (!keep_error) return reshape(sae.reconstruct(rows, edited), x.shape());
    // with the error kept: x + x_hat(edited) - x_hat(f) = x + (edited - f) W_dec (times the
    // row's std with layer_norm)
    Tensor delta = matmul(sub(edited, f), sae.W_dec);
    if (sae.layer_norm()) {
      Tensor scale;
      sae.normalize_input(rows, &scale);
      delta = mul(delta, scale);
    }
    const Tensor out = add(rows, delta);
    return reshape(out, x.shape());
  };
}

FeatureAblation feature_ablation_effects(TransformerLM& model, const Sae& sae, const std::vector<Batch>& data,
                                         const std::vector<int>& features, bool keep_error) {
  check_sae_hook(model, sae);
  for (int j : features) check_feature(sae, j);
  auto loss_with = [&](const std::vector<int>& edited) {
    throw_if_stopped();
    Hooks hooks;
    hooks.add_forward(sae.cfg.hook_name, sae_splice_edited(sae, edited, 0.f, keep_error));
    return evaluate(model, data, false, &hooks).loss;
  };
  FeatureAblation r;
  r.features = features;
  r.base_loss = loss_with({});
  for (int j : features) r.loss_change.push_back(loss_with({j}) - r.base_loss);
  return r;
}

}  // namespace hl
