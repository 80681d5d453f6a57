// Branch-free float exp / erf / tanh that the compiler vectorises (AVX2/AVX-512), for the
// fused kernels that call them millions of times per step (GELU, softmax, cross-entropy,
// attention). glibc's expf/erff are scalar calls and dominated the profile. They vectorise
// only with -fno-trapping-math (set in CMakeLists.txt): the selects must be if-converted.
// Accuracy (tests/test_tensor.cpp checks each against libm): exp_fast ~1 ulp on [-86.5, 88.7]
// (0 below, inf above, NaN stays NaN); erf_fast |error| < 5e-7 (Abramowitz & Stegun 7.1.26
// plus float rounding); erf_rational < 4e-7; tanh_fast < 1.5e-7. All well inside float32
// round-off of the outputs they feed.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace hl {

// sum_c a[c] b[c] in 8 double lanes (lane l takes c = l mod 8), added into lanes[0..8): a fixed
// order that vectorises, where one running double sum is a chain of dependent adds (4 cycles each).
inline void dot_into_double_lanes(const float* a, const float* b, int64_t n, double* lanes) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(a[c + l]) * b[c + l];
  for (int l = 0; c + l < n; ++l) lanes[l] += static_cast<double>(a[c + l]) * b[c + l];
}
// The dot of a and b by those lanes, added in a fixed tree.
inline double dot_in_double_lanes(const float* a, const float* b, int64_t n) {
  double lanes[8] = {};
  dot_into_double_lanes(a, b, n, lanes);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

inline float exp_fast(float x) {
  constexpr float kHi = 88.72283f, kLo = -86.5f;
  float xc = x > kHi ? kHi : x;
  xc = xc < kLo ? kLo : xc;
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);  // round(x / ln 2)
  float r = xc - n * 0.693359375f;                               // Cody-Waite: ln 2 in two parts
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;  // Cephes expf minimax on [-ln2/2, ln2/2]
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 126) << 23;  // 2^(n-1), n in [-125, 128]
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float y = e * scale * 2.f;
  y = x > kHi ? INFINITY : y;
  y = x < kLo ? 0.f : y;
  return x != x ? x : y;
}

// erf(x), also handing out exp(-x^2), which it computes anyway (GELU's derivative needs it).
inline float erf_fast(float x, float& exp_neg_x2) {
  const float ax = std::fabs(x);
  const float t = 1.f / (1.f + 0.3275911f * ax);
  const float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  exp_neg_x2 = exp_fast(-ax * ax);
  const float y = 1.f - poly * exp_neg_x2;
  return std::copysign(y, x);
}
inline float erf_fast(float x) {
  float unused;
  return erf_fast(x, unused);
}

// erf(x) as a rational function, odd numerator of degree 13 over an even denominator of degree
// 8 on x clamped to [-4, 4] (the minimax fit used by Eigen and XLA); |error| < 5e-7. No exp:
// about a third fewer operations than erf_fast, for GELU's forward.
inline float erf_rational(float a) {
  const float x = a > 4.f ? 4.f : (a < -4.f ? -4.f : a);  // NaN stays NaN
  const float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p - 2.10102402082508e-06f;
  p = x2 * p - 5.69250639462346e-05f;
  p = x2 * p - 7.34990630326855e-04f;
  p = x2 * p - 2.95459980854025e-03f;
  p = x2 * p - 1.60960333262415e-02f;
  float q = x2 * -1.45660718464996e-05f - 2.13374055278905e-04f;
  q = x2 * q - 1.68282697438203e-03f;
  q = x2 * q - 7.37332916720468e-03f;
  q = x2 * q - 1.42647390514189e-02f;
  return x * p / q;
}

inline float tanh_fast(float x) {
  // tanh x = sign(x) (1 - 2 / (exp(2|x|) + 1)); small |x| by its Taylor series (no cancellation).
  const float ax = std::fabs(x);
  const float big = 1.f - 2.f / (exp_fast(2.f * ax) + 1.f);
  const float x2 = ax * ax;
  const float small = ax * (1.f + x2 * (-1.f / 3.f + x2 * (2.f / 15.f + x2 * (-17.f / 315.f))));
  return std::copysign(ax < 0.125f ? small : big, x);
}

// Sums of short rows (softmax over 33 keys, layer norm over 64 features). With AVX-512 the 16
// lanes are combined by a tree of shuffles; GCC's `omp simd reduction` ends in 16 dependent
// scalar adds, which on such rows cost as much as the arithmetic (S: ~3% of a step each).
#ifdef __AVX512F__
inline __mmask16 first_lanes(int64_t count) {  // lanes [0, count) of 16
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}
// sum of x[0, n)
inline float sum_lanes(const float* x, int64_t n) {
  __m512 s = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(first_lanes(n - j), x + j));
  return _mm512_reduce_add_ps(s);
}
// sum of (x[j] - c)^2 over [0, n)
inline float sum_sq_dev_lanes(const float* x, int64_t n, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  __m512 s = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = first_lanes(n - j);
    const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + j), vc);
    s = _mm512_fmadd_ps(d, d, s);
  }
  return _mm512_reduce_add_ps(s);
}
// max of x[0, n) (-inf when n <= 0)
inline float max_lanes(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16)
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), first_lanes(n - j), x + j));
  return _mm512_reduce_max_ps(m);
}
// sum of a[j] b[j] over [0, n)
inline float dot_lanes(const float* a, const float* b, int64_t n) {
  __m512 s = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = first_lanes(n - j);
    s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + j), _mm512_maskz_loadu_ps(k, b + j), s);
  }
  return _mm512_reduce_add_ps(s);
}
#else
inline float max_lanes(const float* x, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}
inline float dot_lanes(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}
inline float sum_lanes(const float* x, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += x[j];
  return s;
}
inline float sum_sq_dev_lanes(const float* x, int64_t n, float c) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += (x[j] - c) * (x[j] - c);
  return s;
}
#endif

}  // namespace hl
