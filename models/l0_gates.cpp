#include "models/l0_gates.h"

#include <cmath>

namespace hl {

namespace {
// clip(x, 0, 1) as relu(x) - relu(x - 1): exact 0 below 0, exact 1 above 1, gradient 1 between
Tensor clip01(const Tensor& x) { return sub(relu(x), relu(add_scalar(x, -1.f))); }
double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double logit_d(double p) { return std::log(p / (1.0 - p)); }
}  // namespace

Tensor hard_concrete_gate(const Tensor& log_a, const Tensor& noise, const HardConcrete& hc) {
  const Tensor s = sigmoid(mul_scalar(add(log_a, noise), 1.f / hc.beta));
  return clip01(add_scalar(mul_scalar(s, hc.r - hc.l), hc.l));
}

Tensor hard_concrete_eval_gate(const Tensor& log_a, const HardConcrete& hc) {
  return clip01(add_scalar(mul_scalar(sigmoid(log_a), hc.r - hc.l), hc.l));
}

Tensor hard_concrete_penalty(const Tensor& log_a, const HardConcrete& hc) {
  return sum(sigmoid(add_scalar(log_a, -hc.beta * std::log(-hc.l / hc.r))));
}

// g == 0 when s <= t0 = -l / (r - l), i.e. logit(u) <= beta * logit(t0) - log_a
double hard_concrete_p_zero(double log_a, const HardConcrete& hc) {
  return sigmoid_d(hc.beta * logit_d(-hc.l / (hc.r - hc.l)) - log_a);
}
// g == 1 when s >= t1 = (1 - l) / (r - l)
double hard_concrete_p_one(double log_a, const HardConcrete& hc) {
  return 1.0 - sigmoid_d(hc.beta * logit_d((1.0 - hc.l) / (hc.r - hc.l)) - log_a);
}

HeadL0Gates::HeadL0Gates(const ModelConfig& cfg, float init_log_a, HardConcrete h) : hc(h) {
  for (int l = 0; l < cfg.n_layers; ++l) log_a.push_back(Tensor::full({cfg.n_heads}, init_log_a).requires_grad_());
}

void HeadL0Gates::sample_into(TransformerLM& model, Rng& rng) {
  for (size_t l = 0; l < log_a.size(); ++l) {
    Tensor noise = Tensor::empty(log_a[l].shape());
    for (int64_t h = 0; h < noise.numel(); ++h) {
      const double u = hc.eps + (1.0 - 2.0 * hc.eps) * rng.uniform();
      noise.data()[h] = static_cast<float>(std::log(u) - std::log1p(-u));
    }
    model.gates(static_cast<int>(l)) = hard_concrete_gate(log_a[l], noise, hc);
  }
}

void HeadL0Gates::eval_into(TransformerLM& model) const {
  NoGradGuard ng;
  for (size_t l = 0; l < log_a.size(); ++l) model.gates(static_cast<int>(l)) = hard_concrete_eval_gate(log_a[l], hc).clone();
}

Tensor HeadL0Gates::penalty() const {
  Tensor total;
  for (const Tensor& a : log_a) total = total.defined() ? add(total, hard_concrete_penalty(a, hc)) : hard_concrete_penalty(a, hc);
  return total;
}

std::vector<std::vector<float>> HeadL0Gates::eval_gates() const {
  NoGradGuard ng;
  std::vector<std::vector<float>> g;
  for (const Tensor& a : log_a) g.push_back(hard_concrete_eval_gate(a, hc).to_vector());
  return g;
}

}  // namespace hl
