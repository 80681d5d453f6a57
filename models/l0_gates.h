// Hard-concrete L0 gates on heads (Louizos et al. 2018, as Voita et al. 2019 prune heads with
// them). Each head has a learned log_a; during training its gate is a sample
//   s = sigmoid((log u - log(1 - u) + log_a) / beta),  u ~ U(eps, 1 - eps)
//   g = clip(s * (r - l) + l, 0, 1)
// which is exactly 0 or exactly 1 with positive probability, and differentiable in log_a
// elsewhere; at evaluation g = clip(sigmoid(log_a) * (r - l) + l, 0, 1). The penalty
//   sum over heads of P(g != 0) = sigmoid(log_a - beta * log(-l / r))
// is the expected number of open heads. Built from existing ops (clip = relu(x) - relu(x - 1)),
// so the gradients are those the op gradchecks prove.
#pragma once
#include <vector>

#include "models/transformer.h"

namespace hl {

struct HardConcrete {
  float beta = 0.33f, l = -0.1f, r = 1.1f;
  float eps = 1e-6f;  // u is drawn from [eps, 1 - eps]
};

// g for log_a (any shape) and noise = log u - log(1 - u) (same shape); differentiable in log_a.
Tensor hard_concrete_gate(const Tensor& log_a, const Tensor& noise, const HardConcrete& hc);
// The evaluation gate (no noise).
Tensor hard_concrete_eval_gate(const Tensor& log_a, const HardConcrete& hc);
// sum of P(g != 0) over the elements of log_a: a one-element tensor, differentiable.
Tensor hard_concrete_penalty(const Tensor& log_a, const HardConcrete& hc);
// Closed forms (u uniform on (0, 1)): P(g == 0) and P(g == 1) for one log_a.
double hard_concrete_p_zero(double log_a, const HardConcrete& hc);
double hard_concrete_p_one(double log_a, const HardConcrete& hc);

// One log_a per head of a model (per layer a (H) leaf that requires grad).
class HeadL0Gates {
 public:
  HeadL0Gates(const ModelConfig& cfg, float init_log_a, HardConcrete hc = {});
  // Draws training gates and puts them into the model's head gates (a graph back to log_a).
  void sample_into(TransformerLM& model, Rng& rng);
  // Puts the evaluation gates into the model (values, no graph).
  void eval_into(TransformerLM& model) const;
  Tensor penalty() const;  // expected number of open heads (one-element tensor)
  std::vector<std::vector<float>> eval_gates() const;  // (layers, heads)
  std::vector<Tensor> log_a;
  HardConcrete hc;
};

}  // namespace hl
