#include "analysis/qk_attribution.h"

#include <cmath>

namespace hl {

double QkAttribution::sum() const {
  double s = 0;
  for (double v : pairs) s += v;
  return s;
}

void check_qk_attribution_model(const ModelConfig& cfg) {
  const char* option = cfg.norm != Norm::Pre                      ? "post-norm (norm post): its heads read a normalised sum"
                       : cfg.positions == Positions::Rotary      ? "rotary positions (positions rotary): q and k turn by position"
                       : cfg.qk_norm                             ? "QK-norm (qk_norm): q and k are normalised after the projection"
                       : cfg.sandwich_norm                       ? "sandwich norms (sandwich_norm): each result is normalised"
                                                                 : nullptr;
  if (option) fail("qk attribution: the model has ", option, "; the decomposition is exact only without it");
}

QkAttribution qk_attribution(TransformerLM& model, const Ids& ids, int64_t row, int layer, int head, int64_t query, int64_t key) {
  const ModelConfig& c = model.cfg;
  check_qk_attribution_model(c);
  if (ids.shape.ndim != 2) fail("qk attribution: ids ", ids.shape.str(), " must be (B, T)");
  const int64_t B = ids.shape[0], T = ids.shape[1], D = c.d_model, dh = c.head_dim();
  if (row < 0 || row >= B) fail("qk attribution: row ", row, " is outside 0..", B - 1);
  if (layer < 0 || layer >= c.n_layers) fail("qk attribution: layer ", layer, " is outside 0..", c.n_layers - 1);
  if (head < 0 || head >= c.n_heads) fail("qk attribution: head ", head, " is outside 0..", c.n_heads - 1);
  if (query < 0 || query >= T) fail("qk attribution: query position ", query, " is outside 0..", T - 1);
  if (key < 0 || key > query) fail("qk attribution: key position ", key, " is outside 0..", query, " (the keys query ", query, " sees)");
  EvalScope mode(model);
  NoGradGuard ng;
  const std::string at = hook_name(layer, "attn.hook_attn_scores"), pre = hook_name(layer, "hook_resid_pre");
  const ActivationCache cache = model.run_with_cache(ids, [&](const std::string& n) {
    if (n == "hook_embed" || n == "hook_pos_embed" || n == at || n == pre) return true;
    for (int l = 0; l < layer; ++l)
      if (n == hook_name(l, "attn.hook_result") || n == hook_name(l, "hook_mlp_out")) return true;
    return false;
  }).second;
  // the components at position p of the row, (D) each, and their names
  QkAttribution r;
  auto components = [&](int64_t p) {
    std::vector<std::vector<double>> out;
    auto take = [&](const Tensor& t, int64_t offset) { return std::vector<double>(t.data() + offset, t.data() + offset + D); };
    const int64_t bt = (row * T + p) * D;
    out.push_back(take(cache["hook_embed"], bt));
    if (cache.has("hook_pos_embed")) {
      const Tensor& pe = cache["hook_pos_embed"];  // (B, T, D), or one row of positions for all
      out.push_back(take(pe, pe.numel() == T * D ? p * D : bt));
    }
    for (int l = 0; l < layer; ++l) {
      const Tensor& res = cache[hook_name(l, "attn.hook_result")];  // (B, T, H, D)
      for (int h = 0; h < c.n_heads; ++h) out.push_back(take(res, ((row * T + p) * c.n_heads + h) * D));
      const Linear& wo = model.blocks[l]->attn.W_O;
      if (wo.bias.defined()) out.push_back(take(wo.bias, 0));
      if (c.has_mlp()) out.push_back(take(cache[hook_name(l, "hook_mlp_out")], bt));
    }
    return out;
  };
  r.components.push_back("tok");
  if (cache.has("hook_pos_embed")) r.components.push_back("pos");
  for (int l = 0; l < layer; ++l) {
    for (int h = 0; h < c.n_heads; ++h) r.components.push_back("L" + std::to_string(l) + "H" + std::to_string(h));
    if (model.blocks[l]->attn.W_O.bias.defined()) r.components.push_back("L" + std::to_string(l) + ".b_O");
    if (c.has_mlp()) r.components.push_back("mlp" + std::to_string(l));
  }
  r.components.push_back("bias");
  const size_t C = r.components.size();
  const LayerNorm& ln = model.blocks[layer]->ln1;
  const MultiHeadAttention& attn = model.blocks[layer]->attn;
  const int kv = static_cast<int>(head / (c.n_heads / c.kv_heads()));  // the key head it reads
  // each component's part of q (side 0) or k (side 1) at position p: W (ln1 of it, scale frozen)
  auto side = [&](int64_t p, int which) {
    const Linear& lin = which == 0 ? attn.W_Q : attn.W_K;
    const int64_t r0 = (which == 0 ? head : kv) * dh;
    const float* x = cache[pre].data() + (row * T + p) * D;
    double mu = 0, var = 0;
    if (ln.centred()) {
      for (int64_t d = 0; d < D; ++d) mu += x[d];
      mu /= static_cast<double>(D);
    }
    for (int64_t d = 0; d < D; ++d) var += (x[d] - mu) * (x[d] - mu);
    const double sigma = std::sqrt(var / static_cast<double>(D) + ln.eps);
    auto project = [&](const std::vector<double>& u, bool with_bias) {  // W[r0:r0+dh] u (+ b)
      std::vector<double> out(static_cast<size_t>(dh));
      for (int64_t i = 0; i < dh; ++i) {
        const float* w = lin.weight.data() + (r0 + i) * D;
        double s = with_bias && lin.bias.defined() ? lin.bias.data()[r0 + i] : 0.0;
        for (int64_t d = 0; d < D; ++d) s += w[d] * u[d];
        out[i] = s;
      }
      return out;
    };
    std::vector<std::vector<double>> parts;
    for (std::vector<double>& u : components(p)) {
      double m = 0;
      if (ln.centred()) {
        for (double v : u) m += v;
        m /= static_cast<double>(D);
      }
      for (int64_t d = 0; d < D; ++d) u[d] = (u[d] - m) / sigma * ln.gain(d);
      parts.push_back(project(u, false));
    }
    std::vector<double> b(static_cast<size_t>(D), 0.0);  // the norm's bias, then the projection's
    if (ln.bias.defined())
      for (int64_t d = 0; d < D; ++d) b[d] = ln.bias.data()[d];
    parts.push_back(project(b, true));
    return parts;
  };
  const auto qs = side(query, 0), ks = side(key, 1);
  const double scale = c.attn_scale != 0.f ? c.attn_scale : 1.0 / std::sqrt(static_cast<double>(dh));
  r.pairs.assign(C * C, 0.0);
  for (size_t i = 0; i < C; ++i)
    for (size_t j = 0; j < C; ++j) {
      double s = 0;
      for (int64_t d = 0; d < dh; ++d) s += qs[i][d] * ks[j][d];
      r.pairs[i * C + j] = s * scale;
    }
  const Tensor& S = cache[at];  // (B, H, T, T)
  r.score = S.data()[((row * c.n_heads + head) * T + query) * T + key];
  return r;
}

}  // namespace hl
