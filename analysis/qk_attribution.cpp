#include "analysis/qk_attribution.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "lib/stop.h"
#include "models/attention.h"

namespace hl {

double QkAttribution::sum() const {
  double s = 0;
  for (double v : pairs) s += v;
  return s;
}

std::vector<double> QkAttribution::query_totals() const {
  const size_t C = components.size();
  std::vector<double> t(C, 0.0);
  for (size_t i = 0; i < C; ++i)
    for (size_t j = 0; j < C; ++j) t[i] += pair(i, j);
  return t;
}

std::vector<double> QkAttribution::key_totals() const {
  const size_t C = components.size();
  std::vector<double> t(C, 0.0);
  for (size_t i = 0; i < C; ++i)
    for (size_t j = 0; j < C; ++j) t[j] += pair(i, j);
  return t;
}

QkKeyRule parse_qk_key_rule(const std::string& name) {
  if (name == "source") return QkKeyRule::Source;
  if (name == "previous") return QkKeyRule::Previous;
  if (name == "max") return QkKeyRule::Max;
  fail("qk attribution: unknown key rule '", name, "' (expected source, previous or max)");
}

std::string to_string(QkKeyRule r) {
  return r == QkKeyRule::Source ? "source" : r == QkKeyRule::Previous ? "previous" : "max";
}

QkReduce parse_qk_reduce(const std::string& name) {
  if (name == "mean") return QkReduce::Mean;
  if (name == "sum") return QkReduce::Sum;
  fail("qk attribution: unknown aggregate '", name, "' (expected mean or sum)");
}

std::string to_string(QkReduce r) { return r == QkReduce::Mean ? "mean" : "sum"; }

void check_qk_attribution_model(const ModelConfig& cfg) {
  const char* option = cfg.norm != Norm::Pre  ? "post-norm (norm post): its heads read a normalised sum"
                       : cfg.sandwich_norm    ? "sandwich norms (sandwich_norm): each result is normalised"
                                              : nullptr;
  if (option) fail("qk attribution: the model has ", option, "; the decomposition is exact only without it");
}

std::vector<QkSite> qk_answer_sites(const PatchingInputs& in, QkKeyRule rule) {
  std::vector<QkSite> sites;
  for (size_t i = 0; i < in.answers.size(); ++i) {
    const PatchAnswer& a = in.answers[i];
    if (rule == QkKeyRule::Source) {
      if (i >= in.source_pos.size()) fail("qk attribution: answer ", i, " has no source position (", in.source_pos.size(), " given)");
      sites.push_back({a.row, a.pos, in.source_pos[i]});
    } else if (rule == QkKeyRule::Previous) {
      if (a.pos > 0) sites.push_back({a.row, a.pos, a.pos - 1});
    } else {
      sites.push_back({a.row, a.pos, kMostAttendedKey});
    }
  }
  if (sites.empty()) fail("qk attribution: no (query, key) site in the task's answers (key rule ", to_string(rule), ")");
  return sites;
}

double qk_attribution_memory_bytes(const ModelConfig& cfg, int64_t rows, int64_t T) {
  // a chunk of up to 16 rows: every cached hook of every layer (the results per head dominate)
  const double r = static_cast<double>(std::min<int64_t>(rows, 16)), t = static_cast<double>(T);
  return 4.0 * r * t * static_cast<double>(cfg.n_layers) * (static_cast<double>(cfg.n_heads) * cfg.d_model * 2 + 4.0 * cfg.d_model +
                                                           static_cast<double>(cfg.n_heads) * t);
}

namespace {

// What one chunk of rows gives each site: the parts of q at the query and of k at the key,
// (C, dh) each, as the head computes them from its input.
class SiteDecomposer {
 public:
  SiteDecomposer(TransformerLM& model, int layer, int head) : model_(model), c_(model.cfg), layer_(layer), head_(head) {}

  std::vector<std::string> component_names(bool has_pos) const {
    std::vector<std::string> n = {"tok"};
    if (has_pos) n.push_back("pos");
    for (int l = 0; l < layer_; ++l) {
      for (int h = 0; h < c_.n_heads; ++h) n.push_back("L" + std::to_string(l) + "H" + std::to_string(h));
      if (model_.blocks[l]->attn.W_O.bias.defined()) n.push_back("L" + std::to_string(l) + ".b_O");
      if (c_.has_mlp()) n.push_back("mlp" + std::to_string(l));
    }
    n.push_back("bias");
    return n;
  }

  // the hooks a chunk's run caches
  bool wanted(const std::string& n, bool pattern) const {
    if (n == "hook_embed" || n == "hook_pos_embed" || n == hook_name(layer_, "attn.hook_attn_scores") ||
        n == hook_name(layer_, "hook_resid_pre"))
      return true;
    if (pattern && n == hook_name(layer_, "attn.hook_pattern")) return true;
    for (int l = 0; l < layer_; ++l)
      if (n == hook_name(l, "attn.hook_result") || n == hook_name(l, "hook_mlp_out")) return true;
    return false;
  }

  // The parts of q (which 0) or k (which 1) at position p of row `row` of the cached run: one
  // (dh) vector per component, the bias part last.
  std::vector<std::vector<double>> parts(const ActivationCache& cache, int64_t row, int64_t T, int64_t p, int which) const {
    const int64_t D = c_.d_model, dh = c_.head_dim();
    const LayerNorm& ln = model_.blocks[layer_]->ln1;
    const MultiHeadAttention& attn = model_.blocks[layer_]->attn;
    const Linear& lin = which == 0 ? attn.W_Q : attn.W_K;
    const int64_t r0 = (which == 0 ? head_ : head_ / (c_.n_heads / c_.kv_heads())) * dh;  // its rows of W (GQA: the key head it reads)
    // the components of the stream at (row, p), (D) each
    std::vector<std::vector<double>> comps;
    auto take = [&](const Tensor& t, int64_t offset) { comps.emplace_back(t.data() + offset, t.data() + offset + D); };
    const int64_t bt = (row * T + p) * D;
    take(cache["hook_embed"], bt);
    if (cache.has("hook_pos_embed")) {
      const Tensor& pe = cache["hook_pos_embed"];  // (B, T, D), or one row of positions for all
      take(pe, pe.numel() == T * D ? p * D : bt);
    }
    for (int l = 0; l < layer_; ++l) {
      const Tensor& res = cache[hook_name(l, "attn.hook_result")];  // (B, T, H, D)
      for (int h = 0; h < c_.n_heads; ++h) take(res, ((row * T + p) * c_.n_heads + h) * D);
      const Linear& wo = model_.blocks[l]->attn.W_O;
      if (wo.bias.defined()) take(wo.bias, 0);
      if (c_.has_mlp()) take(cache[hook_name(l, "hook_mlp_out")], bt);
    }
    // ln1's scale of the whole stream, frozen: each component centred (LayerNorm), divided by it, times the gain
    const float* x = cache[hook_name(layer_, "hook_resid_pre")].data() + bt;
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
    std::vector<std::vector<double>> out;
    for (std::vector<double>& u : comps) {
      double m = 0;
      if (ln.centred()) {
        for (double v : u) m += v;
        m /= static_cast<double>(D);
      }
      for (int64_t d = 0; d < D; ++d) u[d] = (u[d] - m) / sigma * ln.gain(d);
      out.push_back(project(u, false));
    }
    std::vector<double> b(static_cast<size_t>(D), 0.0);  // the norm's bias, then the projection's
    if (ln.bias.defined())
      for (int64_t d = 0; d < D; ++d) b[d] = ln.bias.data()[d];
    out.push_back(project(b, true));
    const AttentionConfig& ac = attn.cfg;
    if (ac.qk_norm) {  // RMSNorm over d_head with the run's RMS of the whole q (k), frozen: the parts sum to it
      std::vector<double> whole(static_cast<size_t>(dh), 0.0);
      for (const auto& part : out)
        for (int64_t i = 0; i < dh; ++i) whole[i] += part[i];
      double ms = 0;
      for (double v : whole) ms += v * v;
      const double rms = std::sqrt(ms / static_cast<double>(dh) + ac.norm_eps);
      const Tensor& w = which == 0 ? attn.q_norm->weight : attn.k_norm->weight;
      for (auto& part : out)
        for (int64_t i = 0; i < dh; ++i) part[i] = part[i] / rms * w.data()[i];
    }
    if (ac.rotary) {  // every part turns by position p, with the model's own rotation
      const auto n = static_cast<int64_t>(out.size());
      Tensor t = Tensor::zeros({n, dh});
      for (int64_t k = 0; k < n; ++k)
        for (int64_t i = 0; i < dh; ++i) t.data()[k * dh + i] = static_cast<float>(out[k][i]);
      const int32_t pos[1] = {static_cast<int32_t>(p)};
      const Tensor turned = rotary(t, 1, pos, attn.rotary_cos_sin, ac.rope);
      for (int64_t k = 0; k < n; ++k)
        for (int64_t i = 0; i < dh; ++i) out[k][i] = turned.data()[k * dh + i];
    }
    return out;
  }

 private:
  TransformerLM& model_;
  const ModelConfig& c_;
  int layer_, head_;
};

}  // namespace

QkAttribution qk_attribution(TransformerLM& model, const Ids& ids, int layer, int head, const std::vector<QkSite>& sites, QkReduce reduce) {
  const ModelConfig& c = model.cfg;
  check_qk_attribution_model(c);
  if (ids.shape.ndim != 2) fail("qk attribution: ids ", ids.shape.str(), " must be (B, T)");
  const int64_t B = ids.shape[0], T = ids.shape[1], dh = c.head_dim();
  if (layer < 0 || layer >= c.n_layers) fail("qk attribution: layer ", layer, " is outside 0..", c.n_layers - 1);
  if (head < 0 || head >= c.n_heads) fail("qk attribution: head ", head, " is outside 0..", c.n_heads - 1);
  if (sites.empty()) fail("qk attribution: no (query, key) sites");
  bool any_max = false;
  std::map<int64_t, std::vector<size_t>> by_row;  // row -> its sites, in the given order
  for (size_t s = 0; s < sites.size(); ++s) {
    const QkSite& x = sites[s];
    if (x.row < 0 || x.row >= B) fail("qk attribution: row ", x.row, " is outside 0..", B - 1);
    if (x.query < 0 || x.query >= T) fail("qk attribution: query position ", x.query, " is outside 0..", T - 1);
    if (x.key != kMostAttendedKey && (x.key < 0 || x.key > x.query))
      fail("qk attribution: key position ", x.key, " is outside 0..", x.query, " (the keys query ", x.query, " sees)");
    any_max |= x.key == kMostAttendedKey;
    by_row[x.row].push_back(s);
  }
  EvalScope mode(model);
  NoGradGuard ng;
  SiteDecomposer dec(model, layer, head);
  QkAttribution r;
  r.layer = layer, r.head = head, r.reduce = reduce;
  r.sites = sites;
  const double scale = model.blocks[layer]->attn.cfg.scale != 0.f ? model.blocks[layer]->attn.cfg.scale
                                                                 : 1.0 / std::sqrt(static_cast<double>(dh));
  std::vector<int64_t> rows;
  for (const auto& [row, _] : by_row) rows.push_back(row);
  constexpr size_t kRowsPerChunk = 16;  // bounds the cache (qk_attribution_memory_bytes)
  for (size_t c0 = 0; c0 < rows.size(); c0 += kRowsPerChunk) {
    throw_if_stopped();
    const size_t n = std::min(kRowsPerChunk, rows.size() - c0);
    Ids chunk(Shape{static_cast<int64_t>(n), T});
    for (size_t i = 0; i < n; ++i)
      std::copy(ids.data.begin() + rows[c0 + i] * T, ids.data.begin() + (rows[c0 + i] + 1) * T, chunk.data.begin() + static_cast<int64_t>(i) * T);
    const ActivationCache cache = model.run_with_cache(chunk, [&](const std::string& h) { return dec.wanted(h, any_max); }).second;
    if (r.components.empty()) {
      r.components = dec.component_names(cache.has("hook_pos_embed"));
      r.pairs.assign(r.components.size() * r.components.size(), 0.0);
    }
    const size_t C = r.components.size();
    const Tensor& S = cache[hook_name(layer, "attn.hook_attn_scores")];  // (n, H, T, T)
    for (size_t i = 0; i < n; ++i) {
      const auto row = static_cast<int64_t>(i);
      for (size_t s : by_row[rows[c0 + i]]) {
        QkSite& site = r.sites[s];
        const float* scores = S.data() + ((row * c.n_heads + head) * T + site.query) * T;
        if (site.key == kMostAttendedKey) {
          const float* p = cache[hook_name(layer, "attn.hook_pattern")].data() + ((row * c.n_heads + head) * T + site.query) * T;
          site.key = std::max_element(p, p + site.query + 1) - p;
        }
        if (!std::isfinite(scores[site.key]))
          fail("qk attribution: key position ", site.key, " is masked for query ", site.query, " (outside layer ", layer,
               "'s sliding window)");
        const auto qs = dec.parts(cache, row, T, site.query, 0), ks = dec.parts(cache, row, T, site.key, 1);
        for (size_t a = 0; a < C; ++a)
          for (size_t b = 0; b < C; ++b) {
            double v = 0;
            for (int64_t d = 0; d < dh; ++d) v += qs[a][d] * ks[b][d];
            r.pairs[a * C + b] += v * scale;
          }
        r.score += scores[site.key];
      }
    }
  }
  if (reduce == QkReduce::Mean) {
    const auto n = static_cast<double>(sites.size());
    for (double& v : r.pairs) v /= n;
    r.score /= n;
  }
  return r;
}

QkAttribution qk_attribution(TransformerLM& model, const Ids& ids, int64_t row, int layer, int head, int64_t query, int64_t key) {
  if (ids.shape.ndim == 2 && (row < 0 || row >= ids.shape[0])) fail("qk attribution: row ", row, " is outside 0..", ids.shape[0] - 1);
  if (key == kMostAttendedKey) fail("qk attribution: key position ", key, " is outside 0..", query, " (the keys query ", query, " sees)");
  return qk_attribution(model, ids, layer, head, {QkSite{row, query, key}}, QkReduce::Sum);
}

}  // namespace hl
