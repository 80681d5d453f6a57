// nn basics: Module (hierarchical named parameters, train/eval), Linear, Embedding,
// LayerNorm, Dropout, initialisers.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "ops.h"
#include "tensor.h"

namespace hl {

// Parameters and submodules are members of the derived class, registered by pointer, so a
// Module is neither copyable nor movable. Names join with dots: "blocks.0.attn.W_Q.weight".
class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  Tensor parameter(const std::string& name) const;  // throws naming the missing parameter
  void zero_grad();
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

 protected:
  void register_parameter(const std::string& name, Tensor* t);  // marks it requires_grad
  void register_module(const std::string& name, Module* m);

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

// Puts a module in eval mode for a scope and restores its previous mode.
class EvalScope {
 public:
  explicit EvalScope(Module& m) : m_(m), was_(m.training()) { m_.eval(); }
  ~EvalScope() { m_.train(was_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Module& m_;
  bool was_;
};

// Initialisers (seeded through the library's Rng).
void init_normal(Tensor& t, Rng& rng, float std = 0.02f);
void init_xavier_uniform(Tensor& t, Rng& rng);  // (out, in): U(+-sqrt(6/(in+out)))

// While one lives, the initialisers on this thread leave their tensor's memory as it is: for a
// model whose every parameter is loaded from a file next (GPT-2 small's 163 M normal draws
// were two thirds of its load time).
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;
  // Whether one lives on this thread (a constructor need not copy what the load overwrites).
  static bool active();

 private:
  bool was_;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng, float init_std = 0.02f);
  Tensor forward(const Tensor& x) const { return linear(x, weight, bias); }
  Tensor weight;  // (out, in)
  Tensor bias;    // (out) or undefined
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Rng& rng, float init_std = 0.02f);
  Tensor forward(const Ids& ids) const { return embedding(weight, ids); }
  Tensor weight;  // (num, dim)
};

// The forms of a model's normalisation (the config's `normalization`): LayerNorm (centred,
// weight and bias), RMSNorm (x / rms(x) * weight) and RMSNorm1p (x / rms(x) * (1 + weight), as
// Gemma).
enum class NormKind { LayerNorm, RMSNorm, RMSNorm1p };

// A model's normalisation module in any of the NormKind forms: one type, so every block and
// analysis that reads ln1/ln2/ln_f handles all of them.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f, NormKind kind = NormKind::LayerNorm);
  Tensor forward(const Tensor& x) const;
  bool centred() const { return kind == NormKind::LayerNorm; }
  double gain(int64_t d) const;  // what feature d is multiplied by after normalising: w[d] or 1 + w[d]
  Tensor weight;  // (dim)
  Tensor bias;    // (dim); undefined for the RMS forms
  float eps;
  NormKind kind;
};

class Dropout : public Module {
 public:
  Dropout(float p, Rng* rng) : p(p), rng_(rng) {}
  Tensor forward(const Tensor& x) const {
    if (!training() || p == 0.f) return x;
    HL_CHECK(rng_ != nullptr, "Dropout: p = ", p, " needs a random generator");
    return dropout(x, p, *rng_, true);
  }
  float p;

 private:
  Rng* rng_;
};

}  // namespace hl
