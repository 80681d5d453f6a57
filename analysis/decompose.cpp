#include "analysis/decompose.h"
#include "analysis/evaluate.h"

#include <cmath>
#include <cstdio>

#include "lib/fileutil.h"
#include "lib/stop.h"

namespace hl {

namespace {

void check_pre_norm(const TransformerLM& model, const char* what) {
  if (model.cfg.norm != Norm::Pre)
    fail(what, ": needs a pre-norm model (a post-norm model normalises the residual stream after each block, so it "
               "is not a sum of components)");
}

void check_layer(const TransformerLM& model, int layer, const char* what) {
  if (layer < 0 || layer > model.cfg.n_layers)
    fail(what, ": layer ", layer, " is outside 0..", model.cfg.n_layers, " (", model.cfg.n_layers,
         " = the final residual stream; the model has ", model.cfg.n_layers, " layers)");
}

const Tensor& cached(const ActivationCache& cache, const std::string& name, const char* what) {
  if (!cache.has(name))
    fail(what, ": the cache has no ", name, " (run_with_cache with every hook point: names=None from Python, decomposition_hooks() from C++)");
  return cache[name];
}

// The batch size and length of the cached forward (from hook_embed, (B, T, D)).
std::pair<int64_t, int64_t> batch_dims(const ActivationCache& cache, const char* what) {
  const Tensor& e = cached(cache, "hook_embed", what);
  return {e.size(0), e.size(1)};
}

void check_pos(int64_t pos, int64_t T, const char* what) {
  if (pos < -1 || pos >= T) fail(what, ": position ", pos, " is outside 0..", T - 1, " (the cached sequence has ", T, " tokens)");
}

// Builds a stack of components one at a time: add(label, f) with f(b, t) -> pointer to the
// component's D values at (b, t) (floats of the cache).
struct StackBuilder {
  int64_t B, T, D, pos;
  ResidStack s;
  template <class F>
  void add(const std::string& label, F&& at) {
    if (s.labels.empty()) s.values.reserve(static_cast<size_t>(B * (pos < 0 ? T : 1) * D));
    s.labels.push_back(label);
    const int64_t t0 = pos < 0 ? 0 : pos, t1 = pos < 0 ? T : pos + 1;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = t0; t < t1; ++t) {
        const float* v = at(b, t);
        for (int64_t d = 0; d < D; ++d) s.values.push_back(v ? v[d] : 0.0);
      }
  }
  // The last component as a sandwich norm `ln` with the cached divisors `scale` (B, T, 1) makes
  // its share of the norm's output: centred (layer norm), divided, times the gain. Linear in the
  // component for a fixed divisor, so the components still sum to the norm's output once its bias
  // (a component of its own) is added, as TransformerLens's apply_ln_to_stack.
  void through_norm(const LayerNorm& ln, const Tensor& scale) {
    const int64_t t0 = pos < 0 ? 0 : pos, t1 = pos < 0 ? T : pos + 1;
    double* v = s.values.data() + s.values.size() - static_cast<size_t>(B * (t1 - t0) * D);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = t0; t < t1; ++t, v += D) {
        double mu = 0;
        if (ln.centred()) {
          for (int64_t d = 0; d < D; ++d) mu += v[d];
          mu /= static_cast<double>(D);
        }
        const double sc = scale.data()[b * T + t];
        for (int64_t d = 0; d < D; ++d) v[d] = (v[d] - mu) / sc * ln.gain(d);
      }
  }
  ResidStack done() {
    const int64_t C = static_cast<int64_t>(s.labels.size());
    s.shape = pos < 0 ? std::vector<int64_t>{C, B, T, D} : std::vector<int64_t>{C, B, D};
    return std::move(s);
  }
};

// A builder of `components` components, refused first when their doubles would not fit in memory.
StackBuilder builder(int64_t B, int64_t T, int64_t D, int64_t pos, int64_t components, const char* what) {
  check_fits_in_memory(8.0 * static_cast<double>(components) * static_cast<double>(B) * static_cast<double>(pos < 0 ? T : 1) *
                           static_cast<double>(D),
                       std::string(what) + " (" + std::to_string(components) + " components; a pos_slice takes one position)");
  return StackBuilder{B, T, D, pos, {}};
}

// Each head's result, taken through the layer's sandwich norm (ln1_post) when it has one.
void add_heads(StackBuilder& sb, const TransformerLM& model, const ActivationCache& cache, int layer, const char* what) {
  const int H = model.cfg.n_heads;
  const int64_t D = model.cfg.d_model;
  const Tensor& r = cached(cache, hook_name(layer, "attn.hook_result"), what);  // (B, T, H, D)
  const LayerNorm* post = model.blocks[layer]->ln1_post.get();
  const Tensor* scale = post ? &cached(cache, hook_name(layer, "ln1_post.hook_scale"), what) : nullptr;
  for (int h = 0; h < H; ++h) {
    sb.add("L" + std::to_string(layer) + "H" + std::to_string(h),
           [&](int64_t b, int64_t t) { return r.data() + ((b * sb.T + t) * H + h) * D; });
    if (post) sb.through_norm(*post, *scale);
  }
}

}  // namespace

NameFilter decomposition_hooks() {
  return [](const std::string& n) {
    auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
    return n == "hook_embed" || n == "hook_pos_embed" || ends("attn.hook_result") || ends("hook_mlp_out") ||
           ends("hook_resid_pre") || ends("hook_resid_post") || ends("hook_scale");
  };
}

ResidStack decompose_resid(const TransformerLM& model, const ActivationCache& cache, int layer, int64_t pos) {
  const char* what = "decompose_resid";
  check_pre_norm(model, what);
  check_layer(model, layer, what);
  const auto [B, T] = batch_dims(cache, what);
  check_pos(pos, T, what);
  const int64_t D = model.cfg.d_model;
  const bool post_bias = model.cfg.sandwich_norm && model.cfg.normalization == NormKind::LayerNorm;
  const bool o_bias = model.cfg.attn_bias || model.cfg.o_bias;  // W_O's bias, a component of its own
  const int64_t per_layer = model.cfg.n_heads + (o_bias ? 1 : 0) + (post_bias ? 1 : 0) + (model.cfg.has_mlp() ? 1 : 0);
  StackBuilder sb = builder(B, T, D, pos, 2 + layer * per_layer, what);
  const Tensor& e = cached(cache, "hook_embed", what);      // (B, T, D)
  // (T, D), the same for every row; (B, T, D) when the forward had position ids (a padded batch).
  // Rotary and NoPE models add no position embedding: their pos_embed component is zero.
  const bool additive = model.cfg.positions == Positions::Learned || model.cfg.positions == Positions::Sinusoidal;
  const Tensor p = additive ? cached(cache, "hook_pos_embed", what) : Tensor();
  const bool per_row = additive && p.ndim() == 3;
  sb.add("embed", [&](int64_t b, int64_t t) { return e.data() + (b * T + t) * D; });
  sb.add("pos_embed", [&](int64_t b, int64_t t) -> const float* {
    return additive ? p.data() + ((per_row ? b * T : 0) + t) * D : nullptr;
  });
  for (int l = 0; l < layer; ++l) {
    add_heads(sb, model, cache, l, what);
    const Tensor& bias = model.blocks[l]->attn.W_O.bias;  // (D) or undefined
    const LayerNorm* post = model.blocks[l]->ln1_post.get();  // sandwich norm: W_O's bias goes through it too
    if (bias.defined()) {
      sb.add(std::to_string(l) + "_attn_bias", [&](int64_t, int64_t) { return bias.data(); });
      if (post) sb.through_norm(*post, cached(cache, hook_name(l, "ln1_post.hook_scale"), what));
    }
    if (post && post->bias.defined())
      sb.add(std::to_string(l) + "_attn_norm_bias", [&](int64_t, int64_t) { return post->bias.data(); });
    if (model.cfg.has_mlp()) {
      const Tensor& m = cached(cache, hook_name(l, "hook_mlp_out"), what);  // (B, T, D)
      sb.add(std::to_string(l) + "_mlp_out", [&](int64_t b, int64_t t) { return m.data() + (b * T + t) * D; });
    }
  }
  return sb.done();
}

ResidStack stack_head_results(const TransformerLM& model, const ActivationCache& cache, int layer, int64_t pos) {
  const char* what = "stack_head_results";
  check_layer(model, layer, what);
  const auto [B, T] = batch_dims(cache, what);
  check_pos(pos, T, what);
  StackBuilder sb = builder(B, T, model.cfg.d_model, pos, static_cast<int64_t>(layer) * model.cfg.n_heads, what);
  for (int l = 0; l < layer; ++l) add_heads(sb, model, cache, l, what);
  return sb.done();
}

ResidStack accumulated_resid(const TransformerLM& model, const ActivationCache& cache, int layer, int64_t pos) {
  const char* what = "accumulated_resid";
  check_layer(model, layer, what);
  const auto [B, T] = batch_dims(cache, what);
  check_pos(pos, T, what);
  const int64_t D = model.cfg.d_model;
  StackBuilder sb = builder(B, T, D, pos, layer + 1, what);
  for (int l = 0; l <= layer; ++l) {
    const bool final = l == model.cfg.n_layers;
    const Tensor& r = cached(cache, final ? hook_name(l - 1, "hook_resid_post") : hook_name(l, "hook_resid_pre"), what);
    sb.add(final ? "final_post" : std::to_string(l) + "_pre", [&](int64_t b, int64_t t) { return r.data() + (b * T + t) * D; });
  }
  return sb.done();
}

ResidStack apply_ln_to_stack(const TransformerLM& model, const ActivationCache& cache, const ResidStack& stack, int layer,
                             int64_t pos) {
  const char* what = "apply_ln_to_stack";
  check_pre_norm(model, what);
  check_layer(model, layer, what);
  const auto [B, T] = batch_dims(cache, what);
  check_pos(pos, T, what);
  const int64_t D = model.cfg.d_model, C = stack.components();
  const std::vector<int64_t> want = pos < 0 ? std::vector<int64_t>{C, B, T, D} : std::vector<int64_t>{C, B, D};
  if (stack.shape != want || static_cast<int64_t>(stack.values.size()) != C * B * (pos < 0 ? T : 1) * D) {
    std::string got, exp;
    for (int64_t v : stack.shape) got += (got.empty() ? "" : ", ") + std::to_string(v);
    for (size_t i = 1; i < want.size(); ++i) exp += ", " + std::to_string(want[i]);
    fail(what, ": the stack has shape (", got, ") but this cache and position need (components", exp, ")");
  }
  const std::string name = layer == model.cfg.n_layers ? "ln_final.hook_scale" : hook_name(layer, "ln1.hook_scale");
  const Tensor& scale = cached(cache, name, what);  // (B, T, 1)
  const bool centred = model.cfg.normalization == NormKind::LayerNorm;
  ResidStack out = stack;
  const int64_t rows = B * (pos < 0 ? T : 1);  // (b, t) pairs per component
  for (int64_t c = 0; c < C; ++c)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = pos < 0 ? r / T : r, t = pos < 0 ? r % T : pos;
      double* v = out.values.data() + (c * rows + r) * D;
      double mu = 0;  // the RMS forms do not centre
      if (centred) {
        for (int64_t d = 0; d < D; ++d) mu += v[d];
        mu /= static_cast<double>(D);
      }
      const double s = scale.data()[b * T + t];
      for (int64_t d = 0; d < D; ++d) v[d] = (v[d] - mu) / s;
    }
  return out;
}

namespace {
// ln_final's gain (weight, or 1 + weight) * W_U[:, tok] (D), in double; W_U is head.weight (V, D).
std::vector<double> direction(const TransformerLM& model, int32_t tok) {
  const int64_t D = model.cfg.d_model;
  const float* u = model.head.weight.data() + static_cast<int64_t>(tok) * D;
  std::vector<double> dir(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) dir[d] = static_cast<double>(u[d]) * (model.ln_f ? model.ln_f->gain(d) : 1.0);
  return dir;
}

void check_tokens(const TransformerLM& model, const TokenChoice& tk, const std::vector<int64_t>& batch_shape, const char* which) {
  if (!tk.shape.empty() && tk.shape != batch_shape) {
    std::string got, exp;
    for (int64_t v : tk.shape) got += (got.empty() ? "" : ", ") + std::to_string(v);
    for (int64_t v : batch_shape) exp += (exp.empty() ? "" : ", ") + std::to_string(v);
    fail("logit_attrs: ", which, " have shape (", got, ") but the stack's positions are (", exp, "): give one token or one per position");
  }
  int64_t n = 1;
  for (int64_t v : tk.shape) n *= v;
  if (static_cast<int64_t>(tk.ids.size()) != n) fail("logit_attrs: ", which, ": ", tk.ids.size(), " ids for ", n, " positions");
  for (int32_t id : tk.ids)
    if (id < 0 || id >= model.cfg.vocab_size)
      fail("logit_attrs: ", which, ": token ", id, " is outside the vocabulary 0..", model.cfg.vocab_size - 1);
}
}  // namespace

ResidStack logit_attrs(const TransformerLM& model, const ResidStack& scaled, const TokenChoice& tokens, const TokenChoice* incorrect) {
  check_pre_norm(model, "logit_attrs");
  if (scaled.shape.size() < 3) fail("logit_attrs: the stack must be (components, B, T, d_model) or (components, B, d_model)");
  const int64_t D = model.cfg.d_model, C = scaled.shape[0];
  if (scaled.shape.back() != D) fail("logit_attrs: the stack's last axis is ", scaled.shape.back(), ", not d_model ", D);
  const std::vector<int64_t> batch_shape(scaled.shape.begin() + 1, scaled.shape.end() - 1);
  check_tokens(model, tokens, batch_shape, "tokens");
  if (incorrect) check_tokens(model, *incorrect, batch_shape, "incorrect_tokens");
  int64_t rows = 1;
  for (int64_t v : batch_shape) rows *= v;
  ResidStack out;
  out.labels = scaled.labels;
  out.shape = scaled.shape;
  out.shape.pop_back();
  out.values.assign(static_cast<size_t>(C * rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> dir = direction(model, tokens.ids[tokens.shape.empty() ? 0 : r]);
    if (incorrect) {
      const std::vector<double> wrong = direction(model, incorrect->ids[incorrect->shape.empty() ? 0 : r]);
      for (int64_t d = 0; d < D; ++d) dir[d] -= wrong[d];
    }
    for (int64_t c = 0; c < C; ++c) {
      const double* v = scaled.values.data() + (c * rows + r) * D;
      double a = 0;
      for (int64_t d = 0; d < D; ++d) a += v[d] * dir[d];
      out.values[c * rows + r] = a;
    }
  }
  return out;
}

double final_bias_term(const TransformerLM& model, int32_t token, int32_t incorrect) {
  const int64_t D = model.cfg.d_model;
  auto term = [&](int32_t tok) {
    if (tok < 0 || tok >= model.cfg.vocab_size) fail("final_bias_term: token ", tok, " is outside the vocabulary 0..", model.cfg.vocab_size - 1);
    double s = model.head.bias.defined() ? model.head.bias.data()[tok] : 0.0;
    if (model.ln_f && model.ln_f->bias.defined())  // the RMS forms have no bias
      for (int64_t d = 0; d < D; ++d) s += static_cast<double>(model.ln_f->bias.data()[d]) * model.head.weight.data()[tok * D + d];
    return s;
  };
  return term(token) - (incorrect >= 0 ? term(incorrect) : 0.0);
}

std::vector<double> per_token_loss(const Tensor& logits, const Ids& targets) {
  if (logits.ndim() != 3) fail("per_token_loss: logits must be (B, T, vocab), got ", logits.shape().str());
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  if (targets.shape.ndim != 2 || targets.shape[0] != B || targets.shape[1] > T)
    fail("per_token_loss: targets ", targets.shape.str(), " must be (", B, ", at most ", T, ")");
  const int64_t Tt = targets.shape[1];
  std::vector<double> loss(static_cast<size_t>(B * Tt), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tt; ++t) {
      const int32_t y = targets.at(b, t);
      if (y == -1) continue;
      if (y < 0 || y >= V) fail("per_token_loss: target ", y, " at (", b, ", ", t, ") is outside the vocabulary 0..", V - 1);
      const float* z = logits.data() + (b * T + t) * V;
      double m = z[0];
      for (int64_t v = 1; v < V; ++v) m = std::max(m, static_cast<double>(z[v]));
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - m);
      loss[b * Tt + t] = m + std::log(s) - z[y];
    }
  return loss;
}

namespace {
// W_U[:, tok] . ln_final's output at row r (+ the unembedding bias), in double: the logit before
// the final soft-cap.
double logit_before_cap(const TransformerLM& model, const Tensor& normalized, int64_t r, int32_t tok) {
  const int64_t D = model.cfg.d_model;
  double s = model.head.bias.defined() ? model.head.bias.data()[tok] : 0.0;
  for (int64_t d = 0; d < D; ++d) s += static_cast<double>(normalized.data()[r * D + d]) * model.head.weight.data()[tok * D + d];
  return s;
}
}  // namespace

DlaResult direct_logit_attribution(TransformerLM& model, const std::vector<Batch>& data) {
  check_pre_norm(model, "dla");
  check_data_fits_model(data, model.cfg, "dla");  // ids and targets index the model's tables
  EvalScope eval(model);
  NoGradGuard ng;
  const int L = model.cfg.n_layers;
  const int64_t D = model.cfg.d_model;
  DlaResult res;
  for (const Batch& batch : data) {
    throw_if_stopped();
    // with a final soft-cap the components sum to the logit before the cap: made from ln_final's output
    const bool capped = model.cfg.final_softcap > 0.f;
    NameFilter hooks = decomposition_hooks();
    if (capped) hooks = [all = hooks](const std::string& n) { return all(n) || n == "ln_final.hook_normalized"; };
    auto [logits, cache] = model.run_with_cache(batch.inputs, hooks, false, batch.key_padding);
    const int64_t B = batch.inputs.shape[0], T = batch.inputs.shape[1], V = model.cfg.vocab_size;
    std::vector<std::vector<double>> sum;  // [row][component] over the row's counted positions
    std::vector<double> bias(static_cast<size_t>(B), 0.0), logit(static_cast<size_t>(B), 0.0);
    std::vector<int64_t> n(static_cast<size_t>(B), 0);
    for (int64_t t = 0; t < T; ++t) {
      bool any = false;
      for (int64_t b = 0; b < B; ++b) any = any || batch.targets.at(b, t) >= 0;
      if (!any) continue;
      // one position at a time: memory of (C, B, D), whatever the length
      const ResidStack scaled = apply_ln_to_stack(model, cache, decompose_resid(model, cache, L, t), L, t);  // (C, B, D)
      const int64_t C = scaled.components();
      if (res.labels.empty()) {
        res.labels = scaled.labels;
        res.per_row.resize(static_cast<size_t>(C));
        for (const std::string& lab : res.labels) {
          int l = -1, h = -1;
          if (std::sscanf(lab.c_str(), "L%dH%d", &l, &h) != 2) {
            h = -1;
            if (std::sscanf(lab.c_str(), "%d_", &l) != 1) l = -1;
          }
          res.layer.push_back(l);
          res.head.push_back(h);
        }
      }
      sum.resize(static_cast<size_t>(B), std::vector<double>(static_cast<size_t>(C), 0.0));
      for (int64_t b = 0; b < B; ++b) {
        const int32_t y = batch.targets.at(b, t);
        if (y < 0) continue;
        const std::vector<double> dir = direction(model, y);
        for (int64_t c = 0; c < C; ++c) {
          const double* v = scaled.values.data() + (c * B + b) * D;
          double a = 0;
          for (int64_t d = 0; d < D; ++d) a += v[d] * dir[d];
          sum[b][c] += a;
        }
        bias[b] += final_bias_term(model, y);
        logit[b] += capped ? logit_before_cap(model, cache["ln_final.hook_normalized"], b * T + t, y)
                           : logits.data()[(b * T + t) * V + y];
        ++n[b];
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      if (n[b] == 0) continue;  // a row with nothing counted says nothing
      const double k = static_cast<double>(n[b]);
      for (size_t c = 0; c < res.per_row.size(); ++c) res.per_row[c].push_back(sum[b][c] / k);
      res.bias_per_row.push_back(bias[b] / k);
      res.logit_per_row.push_back(logit[b] / k);
      res.positions += n[b];
    }
  }
  if (res.bias_per_row.empty()) fail("dla: the data has no counted target to attribute");
  return res;
}

}  // namespace hl
