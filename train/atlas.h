// Gradient atlas (train --log-grads N, --dump-grads-at S1,S2): how the gradients of each
// head's W_Q, W_K, W_V (row blocks) and W_O (column block) evolve over training.
//   grad_atlas.csv    step,layer,head,matrix,grad_norm,weight_norm   (Frobenius norms)
//   mlp_grad_atlas.csv step,layer,matrix,grad_norm,weight_norm  (models with MLPs: W_gate, W_in,
//                     W_out of each layer, TransformerLens's names for gate, up (fc1), down (fc2))
//   attn_entropy.csv  step,layer,head,entropy,entropy_norm  (on a fixed held-out probe batch)
//   circuits.csv      step,layer,head,circuit,stable_rank,singular_values (W_QK, W_OV; at dump steps;
//                     rotary: the mean of W_QK(offset)'s over key offsets, analysis/circuits.h)
//   grads/step_N.safetensors   every gradient (grad.<name>) at dump steps
//   (the command line draws grad_atlas.png and attn_entropy.png from these rows at the end)
// With GQA, W_K and W_V rows are reported per kv head (head = kv head index).
#pragma once
#include <string>
#include <vector>

#include "analysis/circuits.h"
#include "datasets/task.h"
#include "models/transformer.h"

namespace hl {

class GradAtlas {
 public:
  GradAtlas(std::string out, int64_t every, std::vector<int64_t> dump_at, bool resume);
  void set_probe(const Batch& probe) { probe_ = probe; has_probe_ = true; }
  void observe(int64_t step, TransformerLM& model);  // after backward, before the optimizer step
  const std::string& out() const { return out_; }
  // CSV lines without their header (cli/atlas_plots.h draws them)
  const std::vector<std::string>& norm_rows() const { return norm_rows_; }
  const std::vector<std::string>& entropy_rows() const { return entropy_rows_; }
  const std::vector<std::string>& mlp_norm_rows() const { return mlp_norm_rows_; }

 private:
  void write_csvs() const;
  std::string out_;
  int64_t every_;
  std::vector<int64_t> dump_at_;
  bool first_ = true, has_probe_ = false;
  Batch probe_;
  std::vector<std::string> norm_rows_, entropy_rows_, circuit_rows_, mlp_norm_rows_;  // CSV lines without header
};

}  // namespace hl
