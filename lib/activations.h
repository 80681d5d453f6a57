// The activation functions and their backward (dL/dv from v and dL/dy), written once and used by the elementwise
// ops (relu, gelu_tanh, gelu_erf) and by linear_act's fused epilogue. Branch-free so the
// loops that call them vectorise (see fastmath.h).
#pragma once
#include "fastmath.h"

namespace hl {

// Relu2: relu(v)^2 (ReLU squared); Silu: v sigmoid(v) (SwiGLU's gate)
enum class Activation { GeluTanh, GeluErf, Relu, Relu2, Silu };

namespace act {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

inline float relu(float v) { return v > 0.f ? v : 0.f; }
inline float relu_backward(float v, float g) { return v > 0.f ? g : 0.f; }  // 0 (not NaN) for g = inf, v < 0
inline float relu2(float v) { return v > 0.f ? v * v : 0.f; }
inline float relu2_backward(float v, float g) { return v > 0.f ? 2.f * v * g : 0.f; }

// v sigmoid(v); exp_fast clamps its argument, so a large |v| gives v or 0, never NaN
inline float silu(float v) { return v / (1.f + exp_fast(-v)); }
inline float silu_backward(float v, float g) {
  const float s = 1.f / (1.f + exp_fast(-v));
  return g * s * (1.f + v * (1.f - s));
}

// 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
inline float gelu_tanh(float v) { return 0.5f * v * (1.f + tanh_fast(kSqrt2OverPi * (v + kGeluCoeff * v * v * v))); }
inline float gelu_tanh_backward(float v, float g) {
  const float t = tanh_fast(kSqrt2OverPi * (v + kGeluCoeff * v * v * v));
  const float du = kSqrt2OverPi * (1.f + 3.f * kGeluCoeff * v * v);
  return g * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * du);
}

// 0.5 v (1 + erf(v / sqrt 2))
inline float gelu_erf(float v) { return 0.5f * v * (1.f + erf_rational(v * kInvSqrt2)); }
inline float gelu_erf_backward(float v, float g) {
  float gauss;  // exp(-v^2/2), shared with the erf
  const float e = erf_fast(v * kInvSqrt2, gauss);
  return g * (0.5f * (1.f + e) + v * kInvSqrt2Pi * gauss);
}

}  // namespace act
}  // namespace hl
