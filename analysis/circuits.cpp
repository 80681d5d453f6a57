#include "analysis/circuits.h"

#include <lapacke.h>

#include <algorithm>
#include <cmath>

namespace hl {

namespace {

double frob(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(t.data()[i]) * t.data()[i];
  return std::sqrt(s);
}

std::vector<double> to_double(const Tensor& t) { return std::vector<double>(t.data(), t.data() + t.numel()); }

std::vector<double> transpose(const std::vector<double>& a, int rows, int cols) {
  std::vector<double> t(a.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// (rows x inner) * (inner x cols), row-major.
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int rows, int inner, int cols) {
  std::vector<double> c(static_cast<size_t>(rows) * cols, 0.0);
  for (int i = 0; i < rows; ++i)
    for (int t = 0; t < inner; ++t) {
      const double v = a[i * inner + t];
      for (int j = 0; j < cols; ++j) c[i * cols + j] += v * b[t * cols + j];
    }
  return c;
}

// R (k x k, upper triangular) of A = Q R for a row-major (rows x k) matrix, rows >= k.
std::vector<double> qr_r(std::vector<double> a, int rows, int k) {
  std::vector<double> tau(static_cast<size_t>(k));
  const lapack_int info = LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, rows, k, a.data(), k, tau.data());
  if (info != 0) fail("circuits: LAPACK dgeqrf failed (info ", info, ")");
  std::vector<double> r(static_cast<size_t>(k) * k, 0.0);
  for (int i = 0; i < k; ++i)
    for (int j = i; j < k; ++j) r[i * k + j] = a[i * k + j];
  return r;
}

// Singular values of X Y for X (D x k) and Y (k x D) given as Y^T (D x k): those of the k x k
// core R_x R_y^T, since X Y = Q_x (R_x R_y^T) Q_y^T with orthonormal Q_x, Q_y.
std::vector<double> low_rank_product_svals(const std::vector<double>& X, const std::vector<double>& YT, int D, int k) {
  if (D < k) fail("circuits: d_model ", D, " is below d_head ", k);
  const std::vector<double> rx = qr_r(X, D, k), ry = qr_r(YT, D, k);
  std::vector<double> core(static_cast<size_t>(k) * k, 0.0);
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j)
      for (int t = 0; t < k; ++t) core[i * k + j] += rx[i * k + t] * ry[j * k + t];
  return singular_values(core, k, k);
}

}  // namespace

std::vector<double> singular_values(std::vector<double> m, int rows, int cols) {
  const int n = std::min(rows, cols);
  std::vector<double> s(static_cast<size_t>(n)), superb(static_cast<size_t>(std::max(1, n - 1)));
  if (n == 0) return s;
  const lapack_int info =
      LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'N', rows, cols, m.data(), cols, s.data(), nullptr, 1, nullptr, 1, superb.data());
  if (info != 0) fail("singular_values: LAPACK dgesvd did not converge (info ", info, ")");
  return s;  // descending
}

double stable_rank(const std::vector<double>& sv) {
  if (sv.empty() || sv[0] == 0) return 0;
  double s = 0;
  for (double v : sv) s += v * v;
  return s / (sv[0] * sv[0]);
}

namespace {

// The model's rotation of a d_head query vector at a key offset, R (dh x dh, row-major: q' = R q),
// as its own rotary op turns it (pairing, rotary_dim, theta, the float32 cos/sin table): the op
// turns the rows of the identity into the rows of R^T, exactly (each entry a table value or 0).
std::vector<double> rotation(const MultiHeadAttention& attn, int64_t offset) {
  const int64_t dh = attn.cfg.head_dim();
  Tensor eye = Tensor::zeros({dh, dh});
  for (int64_t i = 0; i < dh; ++i) eye.data()[i * dh + i] = 1.f;
  const int32_t pos = static_cast<int32_t>(offset);
  const Tensor rt = rotary(eye, 1, std::span<const int32_t>(&pos, 1), attn.rotary_cos_sin, attn.cfg.rope);
  return transpose(to_double(rt), static_cast<int>(dh), static_cast<int>(dh));
}

void check_offset(const ModelConfig& c, int64_t offset, const char* what) {
  if (offset < 0 || offset >= c.max_seq_len)
    fail(what, ": offset ", offset, " is outside the key offsets 0..", c.max_seq_len - 1, " (max_seq_len ", c.max_seq_len, ")");
}

}  // namespace

std::vector<double> qk_circuit_singular_values(const TransformerLM& model, int layer, int head, std::optional<int64_t> offset) {
  const auto& attn = model.blocks.at(layer)->attn;
  const int64_t dh = attn.cfg.head_dim(), D = attn.cfg.d_model;
  const int kv = head / (attn.cfg.n_heads / attn.cfg.kv_heads());
  if (offset) check_offset(model.cfg, *offset, "qk_circuit_singular_values");
  // W_QK = W_Q^h^T W_K^h (D x D) = X Y with X = W_Q^h^T (D x dh), Y = W_K^h (dh x D)
  const std::vector<double> X = transpose(to_double(head_rows(attn.W_Q.weight, head, dh)), dh, D);
  const std::vector<double> YT = transpose(to_double(head_rows(attn.W_K.weight, kv, dh)), dh, D);
  if (!attn.cfg.rotary) return low_rank_product_svals(X, YT, static_cast<int>(D), static_cast<int>(dh));
  // Rotated: X(o) = X R(o)^T = Q_x (R_x R(o)^T), so W_QK(o) = Q_x (R_x R(o)^T R_y^T) Q_y^T and
  // its singular values are those of the dh x dh core R_x R(o)^T R_y^T.
  const int k = static_cast<int>(dh);
  if (D < dh) fail("circuits: d_model ", D, " is below d_head ", dh);
  const std::vector<double> rx = qr_r(X, static_cast<int>(D), k), ryt = transpose(qr_r(YT, static_cast<int>(D), k), k, k);
  const int64_t first = offset.value_or(0), last = offset ? *offset + 1 : model.cfg.max_seq_len;
  std::vector<double> mean(static_cast<size_t>(k), 0.0);
  for (int64_t o = first; o < last; ++o) {
    const std::vector<double> core = matmul(matmul(rx, transpose(rotation(attn, o), k, k), k, k, k), ryt, k, k, k);
    const std::vector<double> sv = singular_values(core, k, k);
    for (int i = 0; i < k; ++i) mean[i] += sv[i];
  }
  for (double& v : mean) v /= static_cast<double>(last - first);
  return mean;
}

std::vector<double> ov_circuit_singular_values(const TransformerLM& model, int layer, int head) {
  const auto& attn = model.blocks.at(layer)->attn;
  const int64_t dh = attn.cfg.head_dim(), D = attn.cfg.d_model;
  const int kv = head / (attn.cfg.n_heads / attn.cfg.kv_heads());
  // W_OV = W_O^h W_V^h (D x D) = X Y with X = W_O^h (D x dh), Y = W_V^h (dh x D)
  const std::vector<double> X = to_double(head_cols(attn.W_O.weight, head, dh));
  const std::vector<double> YT = transpose(to_double(head_rows(attn.W_V.weight, kv, dh)), dh, D);
  return low_rank_product_svals(X, YT, static_cast<int>(D), static_cast<int>(dh));
}

std::vector<std::complex<double>> ov_circuit_eigenvalues(const TransformerLM& model, int layer, int head) {
  const ModelConfig& c = model.cfg;
  if (layer < 0 || layer >= c.n_layers || head < 0 || head >= c.n_heads)
    fail("ov_circuit_eigenvalues: head (", layer, ", ", head, ") is outside ", c.n_layers, " layers x ", c.n_heads, " heads");
  const auto& attn = model.blocks[layer]->attn;
  const int64_t dh = c.head_dim(), D = c.d_model, V = c.vocab_size;
  const int kv = head / (c.n_heads / c.kv_heads());
  const bool fold = c.norm == Norm::Pre;  // ln1 reads the residual before W_V, ln_final before W_U
  const Tensor WV = head_rows(attn.W_V.weight, kv, dh), WO = head_cols(attn.W_O.weight, head, dh);  // (dh, D), (D, dh)
  const float *E = model.tok_emb.weight.data(), *U = model.head.weight.data();                       // (V, D) each
  auto w1 = [&](int64_t d) { return fold ? model.blocks[layer]->ln1.gain(d) : 1.0; };
  // the gains after W_O: the sandwich norm's (ln1_post) and ln_final's, folded as ln1's is
  const LayerNorm* post = model.blocks[layer]->ln1_post.get();
  auto wf = [&](int64_t d) { return (fold && model.ln_f ? model.ln_f->gain(d) : 1.0) * (post ? post->gain(d) : 1.0); };
  // the embeddings as the model reads them (Gemma's sqrt(d_model), rounded to float32 as the forward does)
  const double emb = c.embed_scale ? static_cast<double>(std::sqrt(static_cast<float>(D))) : 1.0;
  // G = W_E W_U restricted to the residual: sum over tokens of E[v]^T U'[v] (D x D), U' = U diag(w_f)
  std::vector<double> G(static_cast<size_t>(D * D), 0.0);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t i = 0; i < D; ++i) {
      const double e = E[v * D + i] * emb;
      for (int64_t j = 0; j < D; ++j) G[i * D + j] += e * U[v * D + j] * wf(j);
    }
  // core = (W_V diag(w_1)) G W_O (dh x dh)
  std::vector<double> VG(static_cast<size_t>(dh * D), 0.0), core(static_cast<size_t>(dh * dh), 0.0);
  for (int64_t a = 0; a < dh; ++a)
    for (int64_t i = 0; i < D; ++i) {
      const double x = WV.data()[a * D + i] * w1(i);
      for (int64_t j = 0; j < D; ++j) VG[a * D + j] += x * G[i * D + j];
    }
  for (int64_t a = 0; a < dh; ++a)
    for (int64_t j = 0; j < D; ++j)
      for (int64_t b = 0; b < dh; ++b) core[a * dh + b] += VG[a * D + j] * WO.data()[j * dh + b];
  const int n = static_cast<int>(dh);
  std::vector<double> wr(static_cast<size_t>(n)), wi(static_cast<size_t>(n));
  const lapack_int info =
      LAPACKE_dgeev(LAPACK_ROW_MAJOR, 'N', 'N', n, core.data(), n, wr.data(), wi.data(), nullptr, 1, nullptr, 1);
  if (info != 0) fail("ov_circuit_eigenvalues: LAPACK dgeev did not converge (info ", info, ")");
  std::vector<std::complex<double>> ev;
  for (int i = 0; i < n; ++i) ev.emplace_back(wr[i], wi[i]);
  return ev;
}

double copying_score(const std::vector<std::complex<double>>& ev) {
  double re = 0, mag = 0;
  for (const auto& l : ev) re += l.real(), mag += std::abs(l);
  return mag > 0 ? re / mag : 0.0;
}

double copying_score(const TransformerLM& model, int layer, int head) {
  return copying_score(ov_circuit_eigenvalues(model, layer, head));
}

std::vector<HeadNormRow> head_gradient_norms(const TransformerLM& model, int64_t step) {
  std::vector<HeadNormRow> rows;
  for (int l = 0; l < static_cast<int>(model.blocks.size()); ++l) {
    const auto& attn = model.blocks[l]->attn;
    const int64_t dh = attn.cfg.head_dim();
    auto add = [&](const char* name, const Tensor& w, int heads, bool cols) {
      const Tensor g = w.grad();
      for (int h = 0; h < heads; ++h) {
        const Tensor wb = cols ? head_cols(w, h, dh) : head_rows(w, h, dh);
        const double gn = g.defined() ? frob(cols ? head_cols(g, h, dh) : head_rows(g, h, dh)) : 0.0;
        rows.push_back({step, l, h, name, gn, frob(wb)});
      }
    };
    add("W_Q", attn.W_Q.weight, attn.cfg.n_heads, false);
    add("W_K", attn.W_K.weight, attn.cfg.kv_heads(), false);
    add("W_V", attn.W_V.weight, attn.cfg.kv_heads(), false);
    add("W_O", attn.W_O.weight, attn.cfg.n_heads, true);
  }
  return rows;
}

std::vector<HeadNormRow> mlp_gradient_norms(const TransformerLM& model, int64_t step) {
  std::vector<HeadNormRow> rows;
  for (int l = 0; l < static_cast<int>(model.blocks.size()); ++l) {
    const FeedForward* f = model.blocks[l]->ffn.get();
    if (!f) continue;  // attention-only
    auto add = [&](const char* name, const Tensor& w) {
      const Tensor g = w.grad();
      rows.push_back({step, l, -1, name, g.defined() ? frob(g) : 0.0, frob(w)});
    };
    if (f->gate) add("W_gate", f->gate->weight);
    add("W_in", f->fc1.weight);
    add("W_out", f->fc2.weight);
  }
  return rows;
}

double composition_score(const std::vector<double>& A, const std::vector<double>& B, int D) {
  double ab = 0, a = 0, b = 0;
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      double s = 0;
      for (int t = 0; t < D; ++t) s += A[i * D + t] * B[t * D + j];
      ab += s * s;
      a += A[i * D + j] * A[i * D + j];
      b += B[i * D + j] * B[i * D + j];
    }
  return a > 0 && b > 0 ? std::sqrt(ab / (a * b)) : 0.0;
}

namespace {

// A D x D matrix as X Y, X (D x k) and Y (k x D), both row-major.
struct Factored {
  std::vector<double> X, Y;
  int D = 0, k = 0;
  Factored transposed() const { return {transpose(Y, k, D), transpose(X, D, k), D, k}; }
};

// ||X Y||_F^2 = trace((X^T X)(Y Y^T)): k x k Gram matrices instead of the D x D product.
double frob2(const Factored& f) {
  const std::vector<double> gx = matmul(transpose(f.X, f.D, f.k), f.X, f.k, f.D, f.k);
  const std::vector<double> gy = matmul(f.Y, transpose(f.Y, f.k, f.D), f.k, f.D, f.k);
  double s = 0;
  for (int i = 0; i < f.k; ++i)
    for (int j = 0; j < f.k; ++j) s += gx[i * f.k + j] * gy[j * f.k + i];
  return std::max(0.0, s);
}

// F1 F2 = X1 (Y1 X2 Y2): still rank k1.
Factored product(const Factored& f1, const Factored& f2) {
  const std::vector<double> m = matmul(f1.Y, f2.X, f1.k, f1.D, f2.k);  // k1 x k2
  return {f1.X, matmul(m, f2.Y, f1.k, f2.k, f1.D), f1.D, f1.k};
}

Factored ov_factors(const TransformerLM& model, int layer, int head) {
  const auto& attn = model.blocks.at(layer)->attn;
  const int64_t dh = attn.cfg.head_dim(), D = attn.cfg.d_model;
  const int kv = head / (attn.cfg.n_heads / attn.cfg.kv_heads());
  return {to_double(head_cols(attn.W_O.weight, head, dh)), to_double(head_rows(attn.W_V.weight, kv, dh)),
          static_cast<int>(D), static_cast<int>(dh)};
}
// W_QK = X Y with X = (R(offset) W_Q^h)^T = W_Q^h^T R(offset)^T (D x dh) and Y = W_K^h (dh x D):
// the rows of X are d_head vectors, each turned as a query `offset` positions after the key.
Factored qk_factors(const TransformerLM& model, int layer, int head, int64_t offset = 0) {
  const auto& attn = model.blocks.at(layer)->attn;
  const int64_t dh = attn.cfg.head_dim(), D = attn.cfg.d_model;
  const int kv = head / (attn.cfg.n_heads / attn.cfg.kv_heads());
  std::vector<double> X = transpose(to_double(head_rows(attn.W_Q.weight, head, dh)), dh, D);
  if (attn.cfg.rotary && offset != 0) {
    const int k = static_cast<int>(dh);
    X = matmul(X, transpose(rotation(attn, offset), k, k), static_cast<int>(D), k, k);
  }
  return {X, to_double(head_rows(attn.W_K.weight, kv, dh)), static_cast<int>(D), static_cast<int>(dh)};
}

double score(const Factored& b, const Factored& a) {
  const double na = frob2(a), nb = frob2(b);
  return na > 0 && nb > 0 ? std::sqrt(frob2(product(b, a)) / (na * nb)) : 0.0;
}

// sqrt(num / (n1 n2)), 0 when a norm is 0: score()'s ratio from squared norms.
double ratio(double num, double n1, double n2) { return n1 > 0 && n2 > 0 ? std::sqrt(std::max(0.0, num) / (n1 * n2)) : 0.0; }

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A rotation's non-zeros by row (at most two a row: a turned pair, or 1 for a dim that does not turn).
struct SparseRows {
  std::vector<std::vector<std::pair<int, double>>> rows;  // rows[i]: (j, R[i][j]) for R[i][j] != 0
  explicit SparseRows(const std::vector<double>& R, int k) : rows(static_cast<size_t>(k)) {
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j)
        if (R[i * k + j] != 0) rows[i].emplace_back(j, R[i * k + j]);
  }
};
// R G R^T, or with `transposed` R^T G R (k x k): O(k^2) through R's non-zeros.
std::vector<double> conjugate(const SparseRows& R, const std::vector<double>& G, int k, bool transposed) {
  std::vector<double> RG(static_cast<size_t>(k) * k, 0.0), out(static_cast<size_t>(k) * k, 0.0);
  for (int i = 0; i < k; ++i)
    for (const auto& [j, v] : R.rows[i]) {  // v = R[i][j]
      const int dst = transposed ? j : i, src = transposed ? i : j;  // (R^T G)[j] += R[i][j] G[i]; (R G)[i] += R[i][j] G[j]
      for (int c = 0; c < k; ++c) RG[dst * k + c] += v * G[src * k + c];
    }
  for (int i = 0; i < k; ++i)
    for (const auto& [j, v] : R.rows[i]) {  // out[:, j] += R[i][j] RG[:, i] (R^T on the right); out[:, i] += R[i][j] RG[:, j]
      const int dst = transposed ? j : i, src = transposed ? i : j;
      for (int r = 0; r < k; ++r) out[r * k + dst] += v * RG[r * k + src];
    }
  return out;
}

// Q- and K-composition of a rotary layer pair, averaged over offsets 0..n-1, through d_head x d_head
// Gram matrices (per offset O(dh^2) per head pair, so the mean over a long context stays cheap):
// with A(o) = R(o) W_Q W_Q^T R(o)^T and B(o) = R(o)^T W_K W_K^T R(o),
//   ||W_QK(o)||^2 = <A(o), W_K W_K^T>,  ||W_QK(o) W_OV||^2 = <A(o), N N^T>, N = W_K W_OV,
//   ||W_QK(o)^T W_OV||^2 = <B(o), P P^T>, P = W_Q W_OV.
void mean_rotary_qk_composition(const TransformerLM& model, int layer_a, int layer_b, int64_t n, CompositionScores& c) {
  const auto& attn = model.blocks.at(layer_b)->attn;
  const int H = model.cfg.n_heads, k = static_cast<int>(attn.cfg.head_dim()), D = static_cast<int>(attn.cfg.d_model);
  std::vector<Factored> ov(static_cast<size_t>(H));
  std::vector<double> nov(static_cast<size_t>(H));
  for (int a = 0; a < H; ++a) ov[a] = ov_factors(model, layer_a, a), nov[a] = frob2(ov[a]);
  auto gram = [&](const std::vector<double>& m) { return matmul(m, transpose(m, k, D), k, D, k); };  // M M^T, M (k x D)
  std::vector<std::vector<double>> gq(H), gk(H);
  std::vector<std::vector<std::vector<double>>> nn(H, std::vector<std::vector<double>>(H)), pp = nn;  // [b][a]
  for (int b = 0; b < H; ++b) {
    const Factored qk = qk_factors(model, layer_b, b);  // X = W_Q^T, Y = W_K
    const std::vector<double> wq = transpose(qk.X, D, k);
    gq[b] = gram(wq), gk[b] = gram(qk.Y);
    for (int a = 0; a < H; ++a) {
      nn[b][a] = gram(matmul(matmul(qk.Y, ov[a].X, k, D, k), ov[a].Y, k, k, D));
      pp[b][a] = gram(matmul(matmul(wq, ov[a].X, k, D, k), ov[a].Y, k, k, D));
    }
  }
  for (auto* g : {&c.q, &c.k})
    for (auto& row : *g) std::fill(row.begin(), row.end(), 0.0);
  for (int64_t o = 0; o < n; ++o) {
    const SparseRows R(rotation(attn, o), k);
    for (int b = 0; b < H; ++b) {
      const std::vector<double> A = conjugate(R, gq[b], k, false), B = conjugate(R, gk[b], k, true);
      const double nqk = dot(A, gk[b]);
      for (int a = 0; a < H; ++a) {
        c.k[a][b] += ratio(dot(A, nn[b][a]), nqk, nov[a]);
        c.q[a][b] += ratio(dot(B, pp[b][a]), nqk, nov[a]);
      }
    }
  }
  for (auto* g : {&c.q, &c.k})
    for (auto& row : *g)
      for (double& x : row) x /= static_cast<double>(n);
}

}  // namespace

CompositionScores composition_scores(const TransformerLM& model, int layer_a, int layer_b, std::optional<int64_t> offset) {
  const int L = model.cfg.n_layers, H = model.cfg.n_heads;
  if (layer_a < 0 || layer_b >= L || layer_a >= layer_b)
    fail("composition_scores: layers ", layer_a, " -> ", layer_b, " must satisfy 0 <= a < b < ", L);
  if (offset) check_offset(model.cfg, *offset, "composition_scores");
  // one W_QK without rotary positions; on a rotary model without an offset: the mean (below)
  const bool rotary = model.blocks[layer_b]->attn.cfg.rotary;
  const int64_t at = rotary ? offset.value_or(0) : 0;
  CompositionScores c;
  c.q = c.k = c.v = std::vector<std::vector<double>>(H, std::vector<double>(H, 0.0));
  for (int ha = 0; ha < H; ++ha) {
    const Factored ov_a = ov_factors(model, layer_a, ha);
    for (int hb = 0; hb < H; ++hb) {
      const Factored qk_b = qk_factors(model, layer_b, hb, at);
      c.q[ha][hb] = score(qk_b.transposed(), ov_a);
      c.k[ha][hb] = score(qk_b, ov_a);
      c.v[ha][hb] = score(ov_factors(model, layer_b, hb), ov_a);
    }
  }
  if (rotary && !offset) mean_rotary_qk_composition(model, layer_a, layer_b, model.cfg.max_seq_len, c);
  return c;
}

CompositionScores composition_scores_over_offsets(const TransformerLM& model, int layer_a, int layer_b, int64_t n_offsets) {
  if (n_offsets < 1 || n_offsets > model.cfg.max_seq_len)
    fail("composition_scores: ", n_offsets, " key offsets is outside 1..", model.cfg.max_seq_len, " (max_seq_len)");
  CompositionScores c = composition_scores(model, layer_a, layer_b, 0);
  if (model.blocks.at(layer_b)->attn.cfg.rotary) mean_rotary_qk_composition(model, layer_a, layer_b, n_offsets, c);
  return c;
}

std::vector<double> qk_circuit(const TransformerLM& model, int layer, int head, int64_t offset) {
  const ModelConfig& c = model.cfg;
  if (layer < 0 || layer >= c.n_layers || head < 0 || head >= c.n_heads)
    fail("qk_circuit: head (", layer, ", ", head, ") is outside ", c.n_layers, " layers x ", c.n_heads, " heads");
  check_offset(c, offset, "qk_circuit");
  const Factored f = qk_factors(model, layer, head, offset);
  return matmul(f.X, f.Y, f.D, f.k, f.D);
}

CompositionBaseline composition_baseline(const ModelConfig& cfg, int models, uint64_t seed) {
  if (models < 1) fail("composition_baseline: at least one model, got ", models);
  ModelConfig c = cfg;  // the widths that set the shapes; nothing else is needed
  c.n_layers = 2, c.vocab_size = 2, c.max_seq_len = 1, c.d_ff = 0;
  std::vector<double> kinds[3];
  for (int i = 0; i < models; ++i) {
    TransformerLM m(c, seed + static_cast<uint64_t>(i));
    const CompositionScores s = composition_scores(m, 0, 1, 0);  // one offset (max_seq_len 1)
    for (int a = 0; a < c.n_heads; ++a)
      for (int b = 0; b < c.n_heads; ++b) {
        kinds[0].push_back(s.q[a][b]);
        kinds[1].push_back(s.k[a][b]);
        kinds[2].push_back(s.v[a][b]);
      }
  }
  CompositionBaseline r{};
  for (int k = 0; k < 3; ++k) {
    std::vector<double>& v = kinds[k];
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    r.mean[k] = sum / static_cast<double>(v.size());
    r.lo[k] = v[static_cast<size_t>(0.025 * static_cast<double>(v.size() - 1) + 0.5)];
    r.hi[k] = v[static_cast<size_t>(0.975 * static_cast<double>(v.size() - 1) + 0.5)];
  }
  return r;
}

}  // namespace hl
