// Per-head weight analyses: gradient and weight norms of each head's blocks of W_Q, W_K, W_V,
// W_O, and the singular values of each head's QK and OV circuits (Elhage et al. 2021),
// through LAPACK. Functions of the model that return data; files are the caller's business.
#pragma once
#include <string>
#include <vector>

#include "models/transformer.h"

namespace hl {

struct HeadNormRow {
  int64_t step;
  int layer, head;
  std::string matrix;  // W_Q, W_K, W_V, W_O
  double grad_norm, weight_norm;
};

// Per-head Frobenius norms of the current gradients and weights of every attention layer:
// row blocks of W_Q (per head), W_K and W_V (per kv head), column blocks of W_O.
std::vector<HeadNormRow> head_gradient_norms(const TransformerLM& model, int64_t step);

// Singular values (descending, min(rows, cols) of them) of a dense row-major matrix (LAPACK dgesvd).
std::vector<double> singular_values(std::vector<double> m, int rows, int cols);
// Singular values of W_QK = W_Q^h^T W_K^h or W_OV = W_O^h W_V^h (d_model x d_model, rank <= d_head),
// from the d_head x d_head core of the low-rank product (QR of each factor, LAPACK dgeqrf).
std::vector<double> qk_circuit_singular_values(const TransformerLM& model, int layer, int head);
std::vector<double> ov_circuit_singular_values(const TransformerLM& model, int layer, int head);
double stable_rank(const std::vector<double>& singular_values);  // sum s^2 / s_max^2

}  // namespace hl
