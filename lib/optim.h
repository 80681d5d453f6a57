// Optimizers (SGD with momentum, Adam, AdamW), gradient clipping by global norm, and
// learning-rate schedules. Update rules follow PyTorch's so runs can be compared.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tensor.h"

namespace hl {

struct NamedParam {
  std::string name;
  Tensor param;
  bool decay = true;  // weight decay applies (AdamW can exclude biases, norms, embeddings)
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<NamedParam> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  float lr = 1e-3f;
  int64_t steps() const { return steps_; }
  // State for exact resume: tensors named "<kind>.<param name>" plus the step count.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) = 0;
  const std::vector<NamedParam>& params() const { return params_; }

 protected:
  std::vector<NamedParam> params_;
  int64_t steps_ = 0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<NamedParam> params, float lr, float momentum = 0.f, float weight_decay = 0.f);
  void step() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) override;
  float momentum, weight_decay;

 private:
  std::vector<Tensor> velocity_;
};

// Adam (weight decay added to the gradient, as torch.optim.Adam) or, with decoupled = true,
// AdamW (p *= 1 - lr*wd before the Adam update, as torch.optim.AdamW).
class Adam : public Optimizer {
 public:
  Adam(std::vector<NamedParam> params, float lr, float beta1 = 0.9f, float beta2 = 0.999f,
       float eps = 1e-8f, float weight_decay = 0.f, bool decoupled = false);
  void step() override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) override;
  float beta1, beta2, eps, weight_decay;
  bool decoupled;

 private:
  std::vector<Tensor> m_, v_;
};

// Scales all gradients so their global L2 norm is at most max_norm; returns the norm before.
float clip_grad_norm(const std::vector<Tensor>& params, float max_norm);
float clip_grad_norm(const std::vector<NamedParam>& params, float max_norm);
// Global L2 norm of the gradients (missing gradients count as zero).
float grad_norm(const std::vector<Tensor>& params);

enum class ScheduleKind { Constant, WarmupCosine, WarmupLinear };
ScheduleKind parse_schedule(const std::string& name);
std::string schedule_name(ScheduleKind k);

// lr(step) for step = 0, 1, ...: linear warmup from base/warmup to base over `warmup` steps,
// then constant, cosine or linear decay to min_ratio * base at `total` steps.
struct LrSchedule {
  ScheduleKind kind = ScheduleKind::Constant;
  float base_lr = 1e-3f;
  int64_t warmup = 0;
  int64_t total = 1;
  float min_ratio = 0.f;
  float at(int64_t step) const;
};

}  // namespace hl
