#include "nn.h"

#include <cmath>

namespace hl {

void Module::register_parameter(const std::string& name, Tensor* t) {
  if (!t->defined()) return;  // optional parameters (bias off) are simply absent
  t->requires_grad_(true);
  params_.push_back({name, t});
}
void Module::register_module(const std::string& name, Module* m) { children_.push_back({name, m}); }

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params_) out.push_back({prefix + name, *t});
  for (const auto& [name, m] : children_) m->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}
std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}
int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}
Tensor Module::parameter(const std::string& name) const {
  for (auto& [n, t] : named_parameters())
    if (n == name) return t;
  fail("module: no parameter named '", name, "'");
}
void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}
void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

namespace {
thread_local bool skip_init = false;
}
SkipInitGuard::SkipInitGuard() : was_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = was_; }
bool SkipInitGuard::active() { return skip_init; }

void init_normal(Tensor& t, Rng& rng, float std) {
  if (skip_init) return;
  float* p = t.data();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = std * rng.normal();
}
void init_xavier_uniform(Tensor& t, Rng& rng) {
  HL_CHECK(t.ndim() == 2, "init_xavier_uniform: need a 2-d weight, got ", t.shape().str());
  if (skip_init) return;
  const float a = std::sqrt(6.f / static_cast<float>(t.size(0) + t.size(1)));
  float* p = t.data();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = rng.uniform(-a, a);
}

Linear::Linear(int64_t in, int64_t out, bool has_bias, Rng& rng, float init_std) {
  HL_CHECK(in > 0 && out > 0, "Linear: sizes must be positive, got in=", in, " out=", out);
  weight = Tensor::empty({out, in});
  init_normal(weight, rng, init_std);
  if (has_bias) bias = Tensor::zeros({out});
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Embedding::Embedding(int64_t num, int64_t dim, Rng& rng, float init_std) {
  HL_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got ", num, "x", dim);
  weight = Tensor::empty({num, dim});
  init_normal(weight, rng, init_std);
  register_parameter("weight", &weight);
}

LayerNorm::LayerNorm(int64_t dim, float eps, NormKind kind) : eps(eps), kind(kind) {
  HL_CHECK(dim > 0, "LayerNorm: dimension must be positive, got ", dim);
  // every form starts as the identity scale: w = 1, or 1 + w with w = 0
  weight = kind == NormKind::RMSNorm1p ? Tensor::zeros({dim}) : Tensor::ones({dim});
  register_parameter("weight", &weight);
  if (kind == NormKind::LayerNorm) {
    bias = Tensor::zeros({dim});
    register_parameter("bias", &bias);
  }
}

Tensor LayerNorm::forward(const Tensor& x) const {
  if (kind == NormKind::LayerNorm) return layer_norm(x, weight, bias, eps);
  return rms_norm(x, weight, eps, kind == NormKind::RMSNorm1p);
}

double LayerNorm::gain(int64_t d) const {
  return static_cast<double>(weight.data()[d]) + (kind == NormKind::RMSNorm1p ? 1.0 : 0.0);
}

}  // namespace hl
