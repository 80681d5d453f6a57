#include "optim.h"

#include <algorithm>
#include <cmath>

#include "core.h"
#include "fastmath.h"
#include "parallel.h"
#include "profile.h"

namespace hl {

void Optimizer::zero_grad() {
  HL_PROFILE(Optimizer);
  for (auto& p : params_) p.param.zero_grad();
}

namespace {
std::vector<Tensor> zeros_like_all(const std::vector<NamedParam>& ps) {
  std::vector<Tensor> out;
  for (auto& p : ps) out.push_back(Tensor::zeros(p.param.shape()));
  return out;
}
void load_named(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& kind,
                const std::vector<NamedParam>& ps, std::vector<Tensor>& dst) {
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::string key = kind + "." + ps[i].name;
    bool found = false;
    for (auto& [name, t] : state)
      if (name == key) {
        if (t.shape() != ps[i].param.shape())
          fail("optimizer state '", key, "' has shape ", t.shape().str(), ", expected ",
               ps[i].param.shape().str());
        dst[i].copy_from(t);
        found = true;
      }
    if (!found) fail("optimizer state '", key, "' is missing");
  }
}
}  // namespace

SGD::SGD(std::vector<NamedParam> params, float lr_, float momentum, float weight_decay)
    : Optimizer(std::move(params)), momentum(momentum), weight_decay(weight_decay) {
  lr = lr_;
  velocity_ = zeros_like_all(params_);
}

void SGD::step() {
  HL_PROFILE(Optimizer);
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].param.grad();
    if (!g.defined()) continue;
    float *p = params_[i].param.data(), *v = velocity_[i].data();
    const float* G = g.data();
    const float wd = params_[i].decay ? weight_decay : 0.f;
    for (int64_t k = 0, n = g.numel(); k < n; ++k) {
      float d = G[k] + wd * p[k];
      if (momentum != 0.f) {  // PyTorch: buf = momentum*buf + d (first step buf = d)
        v[k] = steps_ == 1 ? d : momentum * v[k] + d;
        d = v[k];
      }
      p[k] -= lr * d;
    }
  }
}

std::vector<std::pair<std::string, Tensor>> SGD::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) out.push_back({"velocity." + params_[i].name, velocity_[i]});
  return out;
}
void SGD::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  load_named(state, "velocity", params_, velocity_);
  steps_ = steps;
}

Adam::Adam(std::vector<NamedParam> params, float lr_, float beta1, float beta2, float eps,
           float weight_decay, bool decoupled)
    : Optimizer(std::move(params)), beta1(beta1), beta2(beta2), eps(eps),
      weight_decay(weight_decay), decoupled(decoupled) {
  lr = lr_;
  m_ = zeros_like_all(params_);
  v_ = zeros_like_all(params_);
}

void Adam::step() {
  HL_PROFILE(Optimizer);
  ++steps_;
  const float bc1 = 1.f - std::pow(beta1, static_cast<float>(steps_));
  const float bc2 = 1.f - std::pow(beta2, static_cast<float>(steps_));
  const float step_size = lr / bc1, inv_sqrt_bc2 = 1.f / std::sqrt(bc2);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].param.grad();
    if (!g.defined()) continue;
    float *p = params_[i].param.data(), *m = m_[i].data(), *v = v_[i].data();
    const float* G = g.data();
    const float wd = params_[i].decay ? weight_decay : 0.f;
    const float shrink = 1.f - lr * wd;
    const int64_t n = g.numel(), chunk = 4096;
    parallel_for((n + chunk - 1) / chunk, n, [&](int64_t c) {
      // locals (bounds, pointers, constants): GCC vectorises nothing it loads through captures
      const int64_t k0 = c * chunk, k1 = std::min(n, (c + 1) * chunk);
      float *ps = p, *ms = m, *vs = v;
      const float* gs = G;
      const float b1 = beta1, b2 = beta2, ss = step_size, ib = inv_sqrt_bc2, e = eps, w = wd, sh = shrink;
      const bool dec = decoupled;
      for (int64_t k = k0; k < k1; ++k) {
        float gk = gs[k];
        if (dec) ps[k] *= sh;
        else gk += w * ps[k];
        ms[k] = b1 * ms[k] + (1.f - b1) * gk;
        vs[k] = b2 * vs[k] + (1.f - b2) * gk * gk;
        ps[k] -= ss * ms[k] / (std::sqrt(vs[k]) * ib + e);
      }
    });
  }
}

std::vector<std::pair<std::string, Tensor>> Adam::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({"exp_avg." + params_[i].name, m_[i]});
    out.push_back({"exp_avg_sq." + params_[i].name, v_[i]});
  }
  return out;
}
void Adam::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  load_named(state, "exp_avg", params_, m_);
  load_named(state, "exp_avg_sq", params_, v_);
  steps_ = steps;
}

namespace {
const Tensor& param_of(const Tensor& t) { return t; }
const Tensor& param_of(const NamedParam& p) { return p.param; }


// Each gradient's lanes on one thread, the gradients shared out by size (GPT-2's embedding alone
// is a third of its 124M), then every lane added in parameter and lane order: one thread's bits.
template <class P>
float grad_norm_of(const std::vector<P>& params) {
  // (parameters, 8), kept so a training step allocates nothing here; named by a reference, since
  // inside the region a thread_local's name is each thread's own
  thread_local std::vector<double> kept;
  std::vector<double>& lanes = kept;
  lanes.assign(params.size() * 8, 0.0);
  int64_t total = 0;
  for (const P& p : params) total += param_of(p).grad().defined() ? param_of(p).numel() : 0;
  run_on_threads(threads_for(total), [&](int t, int n) {
    int64_t start = 0;  // elements before parameter i; it goes to the thread its start falls in
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor g = param_of(params[i]).grad();
      if (!g.defined()) continue;
      if (start * n / std::max<int64_t>(total, 1) == t) dot_into_double_lanes(g.data(), g.data(), g.numel(), &lanes[i * 8]);  // its sum of squares
      start += g.numel();
    }
  });
  double s = 0;
  for (double lane : lanes) s += lane;
  return static_cast<float>(std::sqrt(s));
}

template <class P>
float clip_grad_norm_of(const std::vector<P>& params, float max_norm) {
  HL_PROFILE(Optimizer);
  const float norm = grad_norm_of(params);
  if (max_norm > 0.f && norm > max_norm && std::isfinite(norm)) {
    const float scale = max_norm / (norm + 1e-6f);  // as torch.nn.utils.clip_grad_norm_
    for (const P& p : params) {
      Tensor g = param_of(p).grad();
      if (!g.defined()) continue;
      parallel_ranges(g.numel(), g.numel(), [G = g.data(), scale](int64_t lo, int64_t hi) {
        float* x = G;
        const float c = scale;
        for (int64_t k = lo; k < hi; ++k) x[k] *= c;
      });
    }
  }
  return norm;
}
}  // namespace

float grad_norm(const std::vector<Tensor>& params) { return grad_norm_of(params); }
float clip_grad_norm(const std::vector<Tensor>& params, float max_norm) { return clip_grad_norm_of(params, max_norm); }
float clip_grad_norm(const std::vector<NamedParam>& params, float max_norm) {
  return clip_grad_norm_of(params, max_norm);
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "constant") return ScheduleKind::Constant;
  if (name == "cosine") return ScheduleKind::WarmupCosine;
  if (name == "linear") return ScheduleKind::WarmupLinear;
  fail("unknown schedule '", name, "' (expected constant, cosine or linear)");
}
std::string schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::Constant: return "constant";
    case ScheduleKind::WarmupCosine: return "cosine";
    case ScheduleKind::WarmupLinear: return "linear";
  }
  return "?";
}

float LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (kind == ScheduleKind::Constant) return base_lr;
  const int64_t span = std::max<int64_t>(1, total - warmup);
  const double t = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
  const double min_lr = static_cast<double>(min_ratio) * base_lr;
  const double shape = kind == ScheduleKind::WarmupCosine ? 0.5 * (1.0 + std::cos(M_PI * t)) : 1.0 - t;
  return static_cast<float>(min_lr + (base_lr - min_lr) * shape);
}

}  // namespace hl
