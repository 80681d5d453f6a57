#include "analysis/matching.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "analysis/detectors.h"
#include "lib/stop.h"

namespace hl {

std::vector<int> hungarian(const std::vector<std::vector<double>>& cost) {
  const int rows = static_cast<int>(cost.size());
  if (rows == 0) return {};
  const int cols = static_cast<int>(cost[0].size());
  for (int r = 0; r < rows; ++r) {
    if (static_cast<int>(cost[r].size()) != cols)
      fail("hungarian: row ", r, " has ", cost[r].size(), " costs, row 0 has ", cols);
    for (double c : cost[r])
      if (!std::isfinite(c)) fail("hungarian: cost in row ", r, " is not finite (", c, ")");
  }
  if (cols == 0) return std::vector<int>(static_cast<size_t>(rows), -1);
  if (rows > cols) {  // assign the columns to rows instead, then invert
    std::vector<std::vector<double>> t(static_cast<size_t>(cols), std::vector<double>(static_cast<size_t>(rows)));
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) t[c][r] = cost[r][c];
    const std::vector<int> col_to_row = hungarian(t);
    std::vector<int> out(static_cast<size_t>(rows), -1);
    for (int c = 0; c < cols; ++c) out[col_to_row[c]] = c;
    return out;
  }
  // Kuhn (1955) and Munkres (1957), in the O(n^2 m) form with row and column potentials u, v
  // (reduced cost a[i][j] - u[i] - v[j] >= 0, zero on the matching) that adds one row at a
  // time along a shortest augmenting path (Dijkstra-like over the columns). 1-based; column 0
  // is the virtual start of each path.
  const int n = rows, m = cols;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> u(n + 1, 0), v(m + 1, 0), minv(m + 1);
  std::vector<int> match(m + 1, 0), way(m + 1, 0);  // match[j]: the row holding column j (0 = free)
  std::vector<char> used(m + 1);
  for (int i = 1; i <= n; ++i) {
    match[0] = i;
    int j0 = 0;
    std::fill(minv.begin(), minv.end(), inf);
    std::fill(used.begin(), used.end(), 0);
    do {
      used[j0] = 1;
      const int i0 = match[j0];
      double delta = inf;
      int j1 = 0;
      for (int j = 1; j <= m; ++j) {
        if (used[j]) continue;
        const double cur = cost[i0 - 1][j - 1] - u[i0] - v[j];
        if (cur < minv[j]) minv[j] = cur, way[j] = j0;
        if (minv[j] < delta) delta = minv[j], j1 = j;
      }
      for (int j = 0; j <= m; ++j) {
        if (used[j]) {
          u[match[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (match[j0] != 0);
    do {  // flip the path
      const int j1 = way[j0];
      match[j0] = match[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  std::vector<int> out(static_cast<size_t>(n), -1);
  for (int j = 1; j <= m; ++j)
    if (match[j] != 0) out[match[j] - 1] = j - 1;
  return out;
}

std::string to_string(MatchBy b) { return b == MatchBy::Pattern ? "pattern" : "weights"; }

MatchBy parse_match_by(const std::string& s) {
  if (s == "pattern") return MatchBy::Pattern;
  if (s == "weights") return MatchBy::Weights;
  fail("match by '", s, "': choose pattern or weights");
}

namespace {

using Matrix = std::vector<std::vector<double>>;

// Row block [r0, r0 + n) of a (rows, cols) row-major weight, as double.
std::vector<double> row_block(const Tensor& w, int64_t r0, int64_t n) {
  const int64_t cols = w.size(1);
  const float* p = w.data() + r0 * cols;
  return std::vector<double>(p, p + n * cols);
}
// Column block [c0, c0 + n) of a (rows, cols) weight, transposed: (n, rows) row-major.
std::vector<double> col_block_t(const Tensor& w, int64_t c0, int64_t n) {
  const int64_t rows = w.size(0), cols = w.size(1);
  std::vector<double> out(static_cast<size_t>(n * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) out[c * rows + r] = w.data()[r * cols + c0 + c];
  return out;
}

// One head's factors, each (d_head, d_model) row-major: W_QK = Q^T K, W_OV = O^T V (O holds
// W_O^h transposed).
struct HeadFactors {
  std::vector<double> Q, K, O, V;
  int64_t dh = 0;
};

std::vector<HeadFactors> head_factors(const TransformerLM& m) {
  const int H = m.cfg.n_heads, group = H / m.cfg.kv_heads();
  const int64_t dh = m.cfg.head_dim();
  std::vector<HeadFactors> out;
  for (const auto& blk : m.blocks) {
    const MultiHeadAttention& at = blk->attn;
    for (int h = 0; h < H; ++h) {
      const int kv = h / group;
      out.push_back({row_block(at.W_Q.weight, h * dh, dh), row_block(at.W_K.weight, kv * dh, dh),
                     col_block_t(at.W_O.weight, h * dh, dh), row_block(at.W_V.weight, kv * dh, dh), dh});
    }
  }
  return out;
}

// <X_a^T Y_a, X_b^T Y_b>_F = sum_ij (X_a X_b^T)_ij (Y_a Y_b^T)_ij: d_head-sized Gram matrices, no
// d_model x d_model product. X, Y are (dh, D) row-major.
double product_inner(const std::vector<double>& Xa, const std::vector<double>& Ya, int64_t dha, const std::vector<double>& Xb,
                     const std::vector<double>& Yb, int64_t dhb, int64_t D) {
  double s = 0;
  for (int64_t i = 0; i < dha; ++i)
    for (int64_t j = 0; j < dhb; ++j) {
      double gx = 0, gy = 0;
      for (int64_t d = 0; d < D; ++d) {
        gx += Xa[i * D + d] * Xb[j * D + d];
        gy += Ya[i * D + d] * Yb[j * D + d];
      }
      s += gx * gy;
    }
  return s;
}

double cosine(double ab, double aa, double bb) { return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0; }

Matrix weight_similarity(const TransformerLM& a, const TransformerLM& b) {
  if (a.cfg.d_model != b.cfg.d_model)
    fail("match by weights: the models' d_model differ (", a.cfg.d_model, " and ", b.cfg.d_model,
         "); their circuits live in different spaces, match by pattern instead");
  const int64_t D = a.cfg.d_model;
  const std::vector<HeadFactors> fa = head_factors(a), fb = head_factors(b);
  auto self = [&](const HeadFactors& f, bool qk) {
    return qk ? product_inner(f.Q, f.K, f.dh, f.Q, f.K, f.dh, D) : product_inner(f.O, f.V, f.dh, f.O, f.V, f.dh, D);
  };
  std::vector<double> qa, oa, qb, ob;
  for (const HeadFactors& f : fa) qa.push_back(self(f, true)), oa.push_back(self(f, false));
  for (const HeadFactors& f : fb) qb.push_back(self(f, true)), ob.push_back(self(f, false));
  Matrix s(fa.size(), std::vector<double>(fb.size()));
  for (size_t i = 0; i < fa.size(); ++i)
    for (size_t j = 0; j < fb.size(); ++j) {
      const HeadFactors &x = fa[i], &y = fb[j];
      const double qk = cosine(product_inner(x.Q, x.K, x.dh, y.Q, y.K, y.dh, D), qa[i], qb[j]);
      const double ov = cosine(product_inner(x.O, x.V, x.dh, y.O, y.V, y.dh, D), oa[i], ob[j]);
      s[i][j] = 0.5 * (qk + ov);
    }
  return s;
}

// 1 - Jensen-Shannon divergence (bits) of two distributions over n keys.
double js_similarity(const float* p, const float* q, int64_t n) {
  double js = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double pj = p[j], qj = q[j], mj = 0.5 * (pj + qj);
    if (pj > 0) js += 0.5 * pj * std::log2(pj / mj);
    if (qj > 0) js += 0.5 * qj * std::log2(qj / mj);
  }
  return 1.0 - std::clamp(js, 0.0, 1.0);
}

Matrix pattern_similarity(TransformerLM& a, TransformerLM& b, const std::vector<Batch>& data) {
  const int La = a.cfg.n_layers, Ha = a.cfg.n_heads, Lb = b.cfg.n_layers, Hb = b.cfg.n_heads;
  const int64_t vocab = std::min(a.cfg.vocab_size, b.cfg.vocab_size);
  Matrix s(static_cast<size_t>(La * Ha), std::vector<double>(static_cast<size_t>(Lb * Hb), 0.0));
  int64_t queries = 0;
  const auto patterns = names_ending_with("attn.hook_pattern");
  for (const Batch& batch : data) {
    throw_if_stopped();
    const int64_t B = batch.size(), T = batch.inputs.shape[1];
    if (T > std::min(a.cfg.max_seq_len, b.cfg.max_seq_len))
      fail("match by pattern: prompts of ", T, " tokens exceed a model's max_seq_len (", a.cfg.max_seq_len, " and ",
           b.cfg.max_seq_len, ")");
    for (int32_t t : batch.inputs.data)
      if (t < 0 || t >= vocab)
        fail("match by pattern: token ", t, " of the prompts is outside a model's vocabulary (", a.cfg.vocab_size, " and ",
             b.cfg.vocab_size, ")");
    const ActivationCache ca = recorded_forward(a, batch, patterns), cb = recorded_forward(b, batch, patterns);
    std::vector<const float*> pa, pb;  // per layer: (B, H, T, T)
    for (int l = 0; l < La; ++l) pa.push_back(ca[attn_hook(l, "pattern")].data());
    for (int l = 0; l < Lb; ++l) pb.push_back(cb[attn_hook(l, "pattern")].data());
    for (int64_t r = 0; r < B; ++r) {
      int64_t n = T;  // this row's length: trailing padding removed
      if (batch.key_padding.defined())
        while (n > 0 && batch.key_padding.at({r, n - 1}) != 0.f) --n;
      for (int64_t i = 0; i < n; ++i) {
        for (int la = 0; la < La; ++la)
          for (int ha = 0; ha < Ha; ++ha) {
            const float* p = pa[la] + ((r * Ha + ha) * T + i) * T;
            std::vector<double>& row = s[la * Ha + ha];
            for (int lb = 0; lb < Lb; ++lb)
              for (int hb = 0; hb < Hb; ++hb) row[lb * Hb + hb] += js_similarity(p, pb[lb] + ((r * Hb + hb) * T + i) * T, n);
          }
        ++queries;
      }
    }
  }
  if (queries == 0) fail("match by pattern: the prompts have no tokens");
  for (auto& row : s)
    for (double& v : row) v /= static_cast<double>(queries);
  return s;
}

}  // namespace

HeadMatch match_heads(TransformerLM& a, TransformerLM& b, const std::vector<Batch>& data, const HeadMatchOptions& o) {
  HeadMatch m;
  m.by = o.by;
  m.across_layers = o.across_layers;
  m.layers_a = a.cfg.n_layers, m.heads_a = a.cfg.n_heads, m.layers_b = b.cfg.n_layers, m.heads_b = b.cfg.n_heads;
  if (!o.across_layers && m.layers_a != m.layers_b)
    fail("match heads within layers: the models have ", m.layers_a, " and ", m.layers_b,
         " layers; match across layers instead");
  m.similarity = o.by == MatchBy::Pattern ? pattern_similarity(a, b, data) : weight_similarity(a, b);
  // Each assignment block: A's heads [a0, a0 + na) against B's [b0, b0 + nb); cost = -similarity.
  auto assign = [&](int a0, int na, int b0, int nb) {
    std::vector<std::vector<double>> cost(static_cast<size_t>(na), std::vector<double>(static_cast<size_t>(nb)));
    for (int i = 0; i < na; ++i)
      for (int j = 0; j < nb; ++j) cost[i][j] = -m.similarity[a0 + i][b0 + j];
    const std::vector<int> col = hungarian(cost);
    std::vector<char> taken(static_cast<size_t>(nb), 0);
    for (int i = 0; i < na; ++i) {
      const int ia = a0 + i;
      if (col[i] < 0) {
        m.unmatched_a.push_back({ia / m.heads_a, ia % m.heads_a});
        continue;
      }
      const int ib = b0 + col[i];
      taken[col[i]] = 1;
      m.pairs.push_back({ia / m.heads_a, ia % m.heads_a, ib / m.heads_b, ib % m.heads_b, m.similarity[ia][ib]});
    }
    for (int j = 0; j < nb; ++j)
      if (!taken[j]) m.unmatched_b.push_back({(b0 + j) / m.heads_b, (b0 + j) % m.heads_b});
  };
  if (o.across_layers)
    assign(0, m.layers_a * m.heads_a, 0, m.layers_b * m.heads_b);
  else
    for (int l = 0; l < m.layers_a; ++l) assign(l * m.heads_a, m.heads_a, l * m.heads_b, m.heads_b);
  for (const HeadPair& p : m.pairs) m.mean_similarity += p.similarity;
  if (!m.pairs.empty()) m.mean_similarity /= static_cast<double>(m.pairs.size());
  return m;
}

HeadRoleScores detector_role_scores(TransformerLM& model, int examples, uint64_t seed) {
  const int k = static_cast<int>(std::min<int64_t>(16, model.cfg.max_seq_len / 2));
  if (k < 2) fail("head roles: the probe needs max_seq_len of 4 or more, the model has ", model.cfg.max_seq_len);
  const std::vector<Batch> probe = varied_repeat_probe(examples, k, static_cast<int>(model.cfg.vocab_size), seed);
  HeadRoleScores r;
  for (Detector d : {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction}) {
    r.detectors.push_back(to_string(d));
    r.scores.push_back(detect_heads(model, probe, d, DetectorOptions{}));
  }
  return r;
}

std::string head_role(const HeadRoleScores& r, int layer, int head, double threshold) {
  std::string best = "none";
  double top = threshold;
  for (size_t d = 0; d < r.detectors.size(); ++d)
    if (r.scores[d][layer][head] >= top) top = r.scores[d][layer][head], best = r.detectors[d];
  return best;
}

std::string head_role(const HeadRoleScores& r, int layer, int head, const std::vector<double>& thresholds) {
  if (thresholds.size() != r.detectors.size())
    fail("head roles: ", thresholds.size(), " thresholds for ", r.detectors.size(), " detectors");
  std::string best = "none";
  double top = -1;
  for (size_t d = 0; d < r.detectors.size(); ++d) {
    const double s = r.scores[d][layer][head];
    if (s > thresholds[d] && s > top) top = s, best = r.detectors[d];  // above chance, not at it
  }
  return best;
}

std::vector<double> random_baseline_thresholds(const ModelConfig& cfg, int examples, uint64_t seed, int models) {
  std::vector<double> t;
  for (int m = 0; m < models; ++m) {
    TransformerLM untrained(cfg, static_cast<uint64_t>(1 + m));
    const HeadRoleScores r = detector_role_scores(untrained, examples, seed);
    t.resize(r.detectors.size(), 0.0);
    for (size_t d = 0; d < r.detectors.size(); ++d)
      for (const auto& row : r.scores[d])
        for (double s : row) t[d] = std::max(t[d], s);
  }
  return t;
}

std::vector<Batch> match_probe(const TransformerLM& a, const TransformerLM& b, int examples, uint64_t seed) {
  const int64_t len = std::min(a.cfg.max_seq_len, b.cfg.max_seq_len);
  const int k = static_cast<int>(std::min<int64_t>(16, len / 2));
  if (k < 2) fail("match by pattern: the probe needs max_seq_len of 4 or more, a model has ", len);
  return varied_repeat_probe(examples, k, static_cast<int>(std::min(a.cfg.vocab_size, b.cfg.vocab_size)), seed);
}

namespace {
int64_t probe_len(int64_t max_seq_len) { return 2 * std::min<int64_t>(16, max_seq_len / 2); }  // varied_repeat_probe's
}  // namespace

MatchCost detector_roles_cost(const TransformerLM& m, int examples) {
  const int64_t n = examples, batch = std::min<int64_t>(64, n);
  const double T = static_cast<double>(probe_len(m.cfg.max_seq_len)), L = m.cfg.n_layers, H = m.cfg.n_heads;
  const double d = static_cast<double>(m.cfg.d_model), V = static_cast<double>(m.cfg.vocab_size);
  MatchCost c;
  c.rows = n;
  c.forward_passes = 3 * ((n + 63) / 64);  // a pass per batch of 64 rows and per detector
  // the probe's inputs and targets (int32); one batch's patterns, about ten d_model-wide
  // activations per layer and the logits (float32)
  c.memory_bytes = 8.0 * static_cast<double>(n) * T + 4.0 * static_cast<double>(batch) * T * (L * H * T + 10 * L * d + V);
  return c;
}

MatchCost match_cost(const TransformerLM& a, const TransformerLM& b, int examples, bool by_pattern) {
  const MatchCost ca = detector_roles_cost(a, examples), cb = detector_roles_cost(b, examples);
  MatchCost c;
  c.rows = examples;
  c.forward_passes = ca.forward_passes + cb.forward_passes;
  c.memory_bytes = std::max(ca.memory_bytes, cb.memory_bytes);  // one model's detectors at a time
  if (by_pattern) {  // the shared probe, read by both models: a pass per batch each
    c.forward_passes += 2 * ((static_cast<int64_t>(examples) + 63) / 64);
    c.memory_bytes += 8.0 * examples * static_cast<double>(probe_len(std::min(a.cfg.max_seq_len, b.cfg.max_seq_len)));
  }
  return c;
}

PairRoles pair_roles(const HeadMatch& m, const HeadRoleScores& a, const HeadRoleScores& b, double threshold) {
  PairRoles r;
  for (const HeadPair& p : m.pairs) {
    r.role_a.push_back(head_role(a, p.layer_a, p.head_a, threshold));
    r.role_b.push_back(head_role(b, p.layer_b, p.head_b, threshold));
    if (r.role_a.back() != "none" && r.role_a.back() == r.role_b.back()) ++r.same_role;
  }
  return r;
}

void permute_heads(TransformerLM& model, int layer, const std::vector<int>& perm) {
  const int L = model.cfg.n_layers, H = model.cfg.n_heads;
  if (layer < 0 || layer >= L) fail("permute_heads: layer ", layer, " is outside 0..", L - 1);
  if (model.cfg.kv_heads() != H) fail("permute_heads: the model shares key/value heads (", model.cfg.kv_heads(), " for ", H, " heads)");
  if (static_cast<int>(perm.size()) != H) fail("permute_heads: ", perm.size(), " entries for ", H, " heads");
  std::vector<char> seen(static_cast<size_t>(H), 0);
  for (int p : perm) {
    if (p < 0 || p >= H || seen[p]) fail("permute_heads: the order is not a permutation of 0..", H - 1);
    seen[p] = 1;
  }
  const int64_t dh = model.cfg.head_dim();
  MultiHeadAttention& at = model.blocks[layer]->attn;
  // (rows, cols) row-major: head blocks of `block` rows each (block = dh rows; or 1 element of a bias)
  auto permute_rows = [&](Tensor& w, int64_t block_rows, int64_t cols) {
    const std::vector<float> old(w.data(), w.data() + w.numel());
    for (int h = 0; h < H; ++h)
      std::copy(old.begin() + perm[h] * block_rows * cols, old.begin() + (perm[h] + 1) * block_rows * cols,
                w.data() + h * block_rows * cols);
  };
  for (Linear* lin : {&at.W_Q, &at.W_K, &at.W_V}) {
    permute_rows(lin->weight, dh, lin->weight.size(1));
    if (lin->bias.defined()) permute_rows(lin->bias, dh, 1);
  }
  Tensor& wo = at.W_O.weight;  // (d_model, H*dh): column blocks
  const int64_t D = wo.size(0);
  const std::vector<float> old(wo.data(), wo.data() + wo.numel());
  for (int64_t r = 0; r < D; ++r)
    for (int h = 0; h < H; ++h)
      std::copy(old.begin() + r * H * dh + perm[h] * dh, old.begin() + r * H * dh + (perm[h] + 1) * dh, wo.data() + r * H * dh + h * dh);
  permute_rows(at.gates, 1, 1);
}

}  // namespace hl
