// Per-head weight analyses: gradient and weight norms of each head's blocks of W_Q, W_K, W_V,
// W_O, and the singular values of each head's QK and OV circuits (Elhage et al. 2021),
// through LAPACK. Functions of the model that return data; files are the caller's business.
#pragma once
#include <complex>
#include <optional>
#include <string>
#include <vector>

#include "models/transformer.h"

namespace hl {

struct HeadNormRow {
  int64_t step;
  int layer, head;
  std::string matrix;  // W_Q, W_K, W_V, W_O; MLP rows: W_gate, W_in, W_out
  double grad_norm, weight_norm;
};

// Per-head Frobenius norms of the current gradients and weights of every attention layer:
// row blocks of W_Q (per head), W_K and W_V (per kv head), column blocks of W_O.
std::vector<HeadNormRow> head_gradient_norms(const TransformerLM& model, int64_t step);

// Frobenius norms of the current gradients and weights of every layer's MLP matrices, with
// TransformerLens's names: a gated MLP's W_gate (gate, d_ff x d_model), W_in (up, fc1) and W_out
// (down, fc2); a plain MLP's W_in (fc1) and W_out (fc2). head is -1. None for an attention-only
// model.
std::vector<HeadNormRow> mlp_gradient_norms(const TransformerLM& model, int64_t step);

// Singular values (descending, min(rows, cols) of them) of a dense row-major matrix (LAPACK dgesvd).
std::vector<double> singular_values(std::vector<double> m, int rows, int cols);
// Singular values of W_QK = W_Q^h^T W_K^h or W_OV = W_O^h W_V^h (d_model x d_model, rank <= d_head),
// from the d_head x d_head core of the low-rank product (QR of each factor, LAPACK dgeqrf).
// On a rotary model W_QK depends on the key's offset before the query (see composition_scores):
// the singular values of W_QK(offset), or without an offset the mean of each (the i-th largest)
// over offsets 0..max_seq_len-1, what the gradient atlas's circuits.csv records. A model without
// rotary positions has one W_QK, whatever the offset.
std::vector<double> qk_circuit_singular_values(const TransformerLM& model, int layer, int head,
                                               std::optional<int64_t> offset = std::nullopt);
std::vector<double> ov_circuit_singular_values(const TransformerLM& model, int layer, int head);
double stable_rank(const std::vector<double>& singular_values);  // sum s^2 / s_max^2

// Eigenvalues of a head's full OV circuit (Elhage et al. 2021): the map from a source token to
// the logits it raises through the head, W_U W_O^h W_V^h W_E (vocab x vocab, column vectors;
// W_E = tok_emb.weight^T, W_U = head.weight), with the layer norms' weights folded in as
// TransformerLens's fold_ln folds them (ln1's into W_V, ln_final's into W_U; pre-norm models;
// no centring). Its non-zero eigenvalues are those of the d_head x d_head core
// W_V^h W_E W_U W_O^h (AB and BA share them), which is what LAPACK's dgeev is given: d_head
// eigenvalues (the other vocab - d_head are 0), in LAPACK's order.
std::vector<std::complex<double>> ov_circuit_eigenvalues(const TransformerLM& model, int layer, int head);
// Re(sum of eigenvalues) / sum of |eigenvalues|: 1 when the head copies (positive eigenvalues,
// each token raises its own logit), -1 when it suppresses; 0 when every eigenvalue is 0.
double copying_score(const std::vector<std::complex<double>>& eigenvalues);
double copying_score(const TransformerLM& model, int layer, int head);

// ||A B||_F / (||A||_F ||B||_F) of two D x D row-major matrices: 1 when B's output directions are
// A's input directions (e.g. u v^T and v w^T), 0 when orthogonal; unchanged by scaling either.
// 0 when either is zero.
double composition_score(const std::vector<double>& A, const std::vector<double>& B, int D);

// Composition of heads of `layer_a` into heads of a later `layer_b` (Elhage et al. 2021), with
// W_OV = W_O^h W_V^h and W_QK = W_Q^h^T W_K^h (D x D): Q-composition ||W_QK^B^T W_OV^A||,
// K-composition ||W_QK^B W_OV^A||, V-composition ||W_OV^B W_OV^A||, each divided by the two
// norms. Grids [head of layer_a][head of layer_b]. Computed through the d_head-sized factors
// (Gram matrices), never forming D x D products, so any width is cheap.
//
// Under rotary positions a query at position i and a key at j score x_i^T W_Q^T R(j - i) W_K x_j
// (R the rotation of each turned pair by (j - i) theta_k; R(0) = I), so W_QK depends on the
// key's offset before the query, offset = i - j >= 0: W_QK^B(offset) = (R(offset) W_Q^h)^T W_K^h,
// the rotation put on the query side by the model's own rotary op (its pairing, rotary_dim and
// theta). Q- and K-composition are taken with it; V-composition (W_OV, never rotated) is the same
// at every offset. With `offset` the scores at that offset (0..max_seq_len-1; 0 is the unrotated
// W_QK); without one, Q- and K-composition are their mean over offsets 0..max_seq_len-1 (each
// equally: every offset a query may read a key at), what `headlab compose` and the studies report.
// A model without rotary positions has one W_QK: every offset gives its scores, bit for bit.
struct CompositionScores {
  std::vector<std::vector<double>> q, k, v;
};
CompositionScores composition_scores(const TransformerLM& model, int layer_a, int layer_b,
                                     std::optional<int64_t> offset = std::nullopt);
// The mean of composition_scores(model, a, b, offset) over offsets 0..n_offsets-1 (each equally;
// n_offsets 1..max_seq_len); V-composition taken once.
CompositionScores composition_scores_over_offsets(const TransformerLM& model, int layer_a, int layer_b, int64_t n_offsets);
// W_QK of a head at a key offset, dense (D x D, row-major): (R(offset) W_Q^h)^T W_K^h, what
// x_i^T W_QK x_j is the scaled-away score of (before the scale, without biases or QK-norm).
std::vector<double> qk_circuit(const TransformerLM& model, int layer, int head, int64_t offset = 0);

// What composition scores random weights of the same shapes get: the scores between the heads of
// two layers of `models` freshly initialised 2-layer models of cfg's widths (Gaussian weights; the
// scores do not depend on their scale). Per kind (Q, K, V): the mean and the 2.5th and 97.5th
// percentiles, so a score inside that range says nothing about the trained model.
// Scores at one key offset: on a rotary model the mean over offsets of random weights spreads
// less, so this range is the wider (cautious) one for it.
struct CompositionBaseline {
  double mean[3], lo[3], hi[3];  // [0] Q, [1] K, [2] V
};
CompositionBaseline composition_baseline(const ModelConfig& cfg, int models = 20, uint64_t seed = 1);

}  // namespace hl
