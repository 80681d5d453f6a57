// Float64 references with round-off bounds (tests/roundoff.h) for the model layers: linear,
// layer norm, activations, multi-head attention with projections, and the whole LM forward.
// Written from the formulas of docs/formats.md, sharing no code with models/.
#pragma once
#include <map>

#include "models/transformer.h"
#include "tests/reference_attention.h"

namespace roundoff {

inline Mat mat(const std::vector<Bounded>& values, int64_t cols) {
  Mat m(static_cast<int64_t>(values.size()) / cols, cols);
  m.a = values;
  return m;
}

// x (R, in) W^T (+ b): W (out, in) and b (out) are float32 parameters.
inline Mat linear(const Mat& x, const hl::Tensor& w, const hl::Tensor& b) {
  Mat y = matmul(x, from_tensor(w), false, true);
  if (b.defined())
    for (int64_t r = 0; r < y.rows; ++r)
      for (int64_t j = 0; j < y.cols; ++j) y(r, j) = y(r, j) + exact(b.data()[j]);
  return y;
}

// Over each row: (x - mean) / sqrt(biased var + eps) * w + b.
inline Mat layer_norm(const Mat& x, const hl::LayerNorm& ln) {
  Mat y(x.rows, x.cols);
  const Bounded D = exact(static_cast<double>(x.cols));
  for (int64_t r = 0; r < x.rows; ++r) {
    std::vector<Bounded> row(x.a.begin() + r * x.cols, x.a.begin() + (r + 1) * x.cols), sq;
    const Bounded mean = sum(row) / D;
    for (const Bounded& v : row) sq.push_back((v - mean) * (v - mean));
    const Bounded rstd = exact(1) / sqrt(sum(sq) / D + exact(ln.eps));
    for (int64_t j = 0; j < x.cols; ++j) {
      Bounded v = (row[static_cast<size_t>(j)] - mean) * rstd;
      if (ln.weight.defined()) v = v * exact(ln.weight.data()[j]);
      if (ln.bias.defined()) v = v + exact(ln.bias.data()[j]);
      y(r, j) = v;
    }
  }
  return y;
}

inline Bounded activation(Bounded v, hl::Activation a) {
  switch (a) {
    case hl::Activation::Relu:  // where the sign is uncertain the float result is v or 0
      if (v.v > v.e) return v;
      if (v.v < -v.e) return exact(0);
      return {std::max(v.v, 0.0), v.e + std::fabs(v.v)};
    case hl::Activation::GeluErf: return exact(0.5) * v * (exact(1) + erf(v * double(hl::act::kInvSqrt2)));
    case hl::Activation::GeluTanh: {
      const Bounded inner = (v + v * v * v * double(hl::act::kGeluCoeff)) * double(hl::act::kSqrt2OverPi);
      return exact(0.5) * v * (exact(1) + tanh(inner));
    }
  }
  return v;
}

inline Mat add(const Mat& a, const Mat& b) {
  Mat c = a;
  for (size_t i = 0; i < c.a.size(); ++i) c.a[i] = a.a[i] + b.a[i];
  return c;
}

// The float64 reference of MultiHeadAttention::forward (self-attention, biases if any) and,
// with `up`, the gradients of its parameters by name.
struct MhaRef {
  std::vector<Bounded> out;  // (B*T, d_model)
  std::map<std::string, std::vector<Bounded>> grads;
};
inline MhaRef bounded_mha(const hl::MultiHeadAttention& mha, const Mat& X, int64_t B, int64_t T, bool causal,
                          const hl::Tensor& up = hl::Tensor(), const hl::Tensor& key_padding = hl::Tensor()) {
  const hl::AttentionConfig& c = mha.cfg;
  const int64_t D = c.d_model;
  auto project = [&](const hl::Linear& lin) { return linear(X, lin.weight, lin.bias); };
  AttnSpec s;
  s.B = B, s.Tq = s.Tk = T, s.H = c.n_heads, s.Hkv = c.kv_heads(), s.dh = c.head_dim(), s.causal = causal;
  for (float g : mha.gates.to_vector()) s.gates.push_back(g);
  if (key_padding.defined())  // (B, T), nonzero = hidden key
    for (float p : key_padding.to_vector()) s.key_padded.push_back(p != 0.f);
  const Mat q = project(mha.W_Q), k = project(mha.W_K), v = project(mha.W_V), Wo = from_tensor(mha.W_O.weight);
  std::vector<Bounded> dz;
  Mat Up;
  if (up.defined()) {
    Up = from_tensor(up, D);
    dz = matmul(Up, Wo).a;  // dL/dz = up W_O (B*T, H*dh)
  }
  const AttnRef a = reference_attention(s, q.a, k.a, v.a, dz);
  const Mat Z = mat(a.out, s.H * s.dh);
  const Mat out = linear(Z, mha.W_O.weight, mha.W_O.bias);
  MhaRef r;
  r.out = out.a;
  if (!up.defined()) return r;
  auto grads_of = [&](const std::string& name, const Mat& dy, const Mat& in) {  // dW = dy^T in, db = sum dy
    r.grads[name + ".weight"] = matmul(dy, in, true, false).a;
    std::vector<Bounded> db;
    for (int64_t j = 0; j < dy.cols; ++j) {
      std::vector<Bounded> col;
      for (int64_t i = 0; i < dy.rows; ++i) col.push_back(dy(i, j));
      db.push_back(sum(col));
    }
    r.grads[name + ".bias"] = db;
  };
  grads_of("W_O", Up, Z);
  grads_of("W_Q", mat(a.dq, q.cols), X);
  grads_of("W_K", mat(a.dk, k.cols), X);
  grads_of("W_V", mat(a.dv, v.cols), X);
  return r;
}


// Logits (B*T, vocab) of model.forward(ids) (with key_padding (B, T) if given): embeddings,
// blocks (pre- or post-norm), final norm, head. No dropout (evaluation).
inline Mat bounded_logits(const hl::TransformerLM& m, const hl::Ids& ids, const hl::Tensor& key_padding = hl::Tensor()) {
  const int64_t B = ids.shape[0], T = ids.shape[1], D = m.cfg.d_model;
  Mat x(B * T, D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < D; ++j) {
        const Bounded tok = exact(m.tok_emb.weight.at({ids.at(b, t), j}));
        const Bounded pos = exact(m.pos_emb ? m.pos_emb->weight.at({t, j}) : m.sinusoid.at({t, j}));
        x(b * T + t, j) = tok + pos;
      }
  for (const auto& blk : m.blocks) {
    auto attn = [&](const Mat& in) { return mat(bounded_mha(blk->attn, in, B, T, true, hl::Tensor(), key_padding).out, D); };
    auto ffn = [&](const Mat& in) {
      Mat h = linear(in, blk->ffn->fc1.weight, blk->ffn->fc1.bias);
      for (Bounded& v : h.a) v = activation(v, blk->ffn->act);
      return linear(h, blk->ffn->fc2.weight, blk->ffn->fc2.bias);
    };
    if (blk->norm == hl::Norm::Pre) {
      const Mat mid = add(x, attn(layer_norm(x, blk->ln1)));
      x = blk->ffn ? add(mid, ffn(layer_norm(mid, *blk->ln2))) : mid;  // attention-only: no MLP
    } else {
      const Mat mid = layer_norm(add(x, attn(x)), blk->ln1);
      x = blk->ffn ? layer_norm(add(mid, ffn(mid)), *blk->ln2) : mid;
    }
  }
  if (m.ln_f) x = layer_norm(x, *m.ln_f);
  return linear(x, m.head.weight, m.head.bias);
}

}  // namespace roundoff
