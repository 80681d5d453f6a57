// Gradient atlas (train --log-grads N, --dump-grads-at S1,S2): how the gradients of each
// head's W_Q, W_K, W_V (row blocks) and W_O (column block) evolve over training.
//   grad_atlas.csv    step,layer,head,matrix,grad_norm,weight_norm   (Frobenius norms)
//   attn_entropy.csv  step,layer,head,entropy,entropy_norm  (on a fixed held-out probe batch)
//   circuits.csv      step,layer,head,circuit,stable_rank,singular_values (W_QK, W_OV; at dump steps)
//   grads/step_N.safetensors   every gradient (grad.<name>) at dump steps
//   grad_atlas.png, attn_entropy.png  at the end
// With GQA, W_K and W_V rows are reported per kv head (head = kv head index).
#pragma once
#include <string>
#include <vector>

#include "datasets/task.h"
#include "models/transformer.h"

namespace hl {

struct HeadNormRow {
  int64_t step;
  int layer, head;
  std::string matrix;  // W_Q, W_K, W_V, W_O
  double grad_norm, weight_norm;
};

// Per-head Frobenius norms of the current gradients and weights of every attention layer.
std::vector<HeadNormRow> head_gradient_norms(const TransformerLM& model, int64_t step);

// Singular values (descending) of a small dense matrix (rows x cols, row-major).
std::vector<double> singular_values(std::vector<double> m, int rows, int cols);
// Singular values of W_Q^h^T W_K^h (QK circuit) or W_O^h W_V^h (OV circuit), rank <= d_head.
std::vector<double> qk_circuit_singular_values(const TransformerLM& model, int layer, int head);
std::vector<double> ov_circuit_singular_values(const TransformerLM& model, int layer, int head);

class GradAtlas {
 public:
  GradAtlas(std::string out, int64_t every, std::vector<int64_t> dump_at, bool resume);
  void set_probe(const Batch& probe) { probe_ = probe; has_probe_ = true; }
  void observe(int64_t step, TransformerLM& model);  // after backward, before the optimizer step
  void finish();  // plots

 private:
  void write_csvs() const;
  std::string out_;
  int64_t every_;
  std::vector<int64_t> dump_at_;
  bool first_ = true, has_probe_ = false;
  Batch probe_;
  std::vector<std::string> norm_rows_, entropy_rows_, circuit_rows_;  // CSV lines without header
};

}  // namespace hl
