// Float32 results against float64 references whose round-off bounds come from the arithmetic.
//
// headlab runs on Intel and AMD machines whose OpenBLAS kernels (and our thread splits) add
// float32 products in different orders, so two correct computations differ in the last bits
// and a fixed tolerance such as 1e-5 passes on one machine and fails on another. Instead, a
// reference is computed in float64 with the type `Bounded`, which carries beside each value a
// first-order bound on how far ANY float32 evaluation of the same expression can be from it:
//
//   - a sum or dot product of K terms, in any order:    gamma(K) * sum |terms|
//     (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Lemma 3.1 and 3.5),
//     plus the errors already carried by the terms;
//   - one + - * /:                                       u |result|, plus the operands' errors
//     propagated to first order;
//   - exp and the fast erf/tanh approximations:          their documented accuracy
//     (lib/fastmath.h, checked against libm in test_tensor).
//
// A float32 result `got` of the same expression then satisfies |got - ref.v| <= ref.e; two
// float32 results of it (two code paths) differ by at most 2 ref.e. The bounds are worst case
// (K u, where typical errors grow like sqrt(K) u), yet a real bug (a wrong index, a missing
// term, a sign) moves results by O(|value|), far above them.
#pragma once
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lib/tensor.h"

namespace roundoff {

constexpr double u = 0x1p-24;  // float32 unit round-off
inline double gamma(double k) { return k * u / (1 - k * u); }

// Accuracy of headlab's fast functions (lib/fastmath.h; test_tensor checks them against libm).
constexpr double kExpRel = 1.5e-7;        // exp_fast, relative
constexpr double kErfAbs = 5e-7;          // erf_fast and erf_rational, absolute
constexpr double kTanhAbs = 1.5e-7;       // tanh_fast, absolute

struct Bounded {
  double v = 0;  // exact value (to float64 accuracy)
  double e = 0;  // bound on |float32 evaluation - v|
};

inline Bounded exact(double x) { return {x, 0}; }  // a float32 input: stored exactly
inline Bounded rounded(double v, double e) { return {v, e + u * std::fabs(v)}; }
inline Bounded operator+(Bounded a, Bounded b) { return rounded(a.v + b.v, a.e + b.e); }
inline Bounded operator-(Bounded a, Bounded b) { return rounded(a.v - b.v, a.e + b.e); }
inline Bounded operator-(Bounded a) { return {-a.v, a.e}; }
inline Bounded operator*(Bounded a, Bounded b) {
  return rounded(a.v * b.v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e);
}
inline Bounded operator/(Bounded a, Bounded b) {
  const double q = a.v / b.v;
  return rounded(q, (a.e + std::fabs(q) * b.e) / std::fabs(b.v));
}
inline Bounded operator*(Bounded a, double c) { return a * Bounded{c, u * std::fabs(c)}; }  // c a float32 constant
inline Bounded sqrt(Bounded a) {
  const double r = std::sqrt(a.v);
  return rounded(r, r > 0 ? a.e / (2 * r) : std::sqrt(a.e));
}
inline Bounded exp(Bounded a) {
  const double y = std::exp(a.v);
  return {y, y * (std::expm1(a.e) + kExpRel) + u * y};
}
inline Bounded log(Bounded a) {  // glibc's logf: < 1 ulp; d log = da / a
  const double y = std::log(a.v);
  return {y, a.e / a.v + 2 * u * std::fabs(y) + u};
}
inline Bounded erf(Bounded a) {  // erf' <= 2/sqrt(pi)
  return {std::erf(a.v), 1.1283791670955126 * a.e + kErfAbs};
}
inline Bounded tanh(Bounded a) {  // tanh' <= 1
  return {std::tanh(a.v), a.e + kTanhAbs};
}

// Sum of K terms in any order: the terms' own errors plus gamma(K-1) sum |terms|.
inline Bounded sum(const std::vector<Bounded>& terms) {
  double v = 0, e = 0, mag = 0;
  for (const Bounded& t : terms) v += t.v, e += t.e, mag += std::fabs(t.v);
  const double k = static_cast<double>(terms.size());
  return {v, e + gamma(std::max(k - 1, 0.0)) * mag};
}
// sum_k a[k * sa] b[k * sb], K products then K-1 additions in any order: gamma(K) sum |a b|.
inline Bounded dot(const Bounded* a, int64_t sa, const Bounded* b, int64_t sb, int64_t K) {
  double v = 0, e = 0, mag = 0;
  for (int64_t k = 0; k < K; ++k) {
    const Bounded &x = a[k * sa], &y = b[k * sb];
    v += x.v * y.v;
    mag += std::fabs(x.v * y.v);
    e += std::fabs(x.v) * y.e + std::fabs(y.v) * x.e;
  }
  return {v, e + gamma(static_cast<double>(K)) * mag};
}

// A row-major float64 matrix of Bounded values.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<Bounded> a;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), a(static_cast<size_t>(r * c)) {}
  Bounded& operator()(int64_t i, int64_t j) { return a[static_cast<size_t>(i * cols + j)]; }
  const Bounded& operator()(int64_t i, int64_t j) const { return a[static_cast<size_t>(i * cols + j)]; }
};

// A float32 tensor's values, exactly, viewed as (rows, cols) (rows = numel / cols).
inline Mat from_tensor(const hl::Tensor& t, int64_t cols) {
  Mat m(t.numel() / cols, cols);
  for (int64_t i = 0; i < t.numel(); ++i) m.a[static_cast<size_t>(i)] = exact(t.data()[i]);
  return m;
}
inline Mat from_tensor(const hl::Tensor& t) { return from_tensor(t, t.ndim() ? t.shape().back() : 1); }

// op(A) op(B) with op = transpose when asked: every element a dot product of K terms.
inline Mat matmul(const Mat& A, const Mat& B, bool ta = false, bool tb = false) {
  const int64_t M = ta ? A.cols : A.rows, K = ta ? A.rows : A.cols, N = tb ? B.rows : B.cols;
  Mat C(M, N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const Bounded* a = ta ? &A.a[static_cast<size_t>(i)] : &A.a[static_cast<size_t>(i * A.cols)];
      const Bounded* b = tb ? &B.a[static_cast<size_t>(j * B.cols)] : &B.a[static_cast<size_t>(j)];
      C(i, j) = dot(a, ta ? A.cols : 1, b, tb ? 1 : B.cols, K);
    }
  return C;
}

// Largest |got - ref.v| / bound over the elements (<= 1 passes). `slack` covers the float64
// reference's own rounding, which is orders of magnitude below float32's.
struct Worst {
  double ratio = 0, got = 0, ref = 0, bound = 0;
  int64_t index = -1;
};
inline Worst compare(const float* got, const std::vector<Bounded>& ref, double factor = 1) {
  Worst w;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double bound = factor * ref[i].e + 1e-12 * std::fabs(ref[i].v) + 1e-30;
    const double r = std::fabs(got[i] - ref[i].v) / bound;
    if (!(r <= w.ratio)) w = {r, got[i], ref[i].v, bound, static_cast<int64_t>(i)};
  }
  return w;
}

// BOOST check that a float32 tensor (one evaluation) is within its reference's bound, or that
// it and another float32 evaluation agree within twice the bound (factor 2).
inline void check_within(const hl::Tensor& got, const std::vector<Bounded>& ref, const std::string& what,
                         double factor = 1) {
  BOOST_TEST_REQUIRE(static_cast<size_t>(got.numel()) == ref.size(), what << ": sizes differ");
  const Worst w = compare(got.data(), ref, factor);
  BOOST_TEST(w.ratio <= 1.0, what << ": element " << w.index << " is " << w.got << ", reference " << w.ref
                                  << ", allowed round-off " << w.bound << " (" << w.ratio << "x the bound)");
}
inline void check_within(const hl::Tensor& got, const Mat& ref, const std::string& what, double factor = 1) {
  check_within(got, ref.a, what, factor);
}

}  // namespace roundoff
