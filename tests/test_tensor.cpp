#define BOOST_TEST_MODULE tensor
#include <boost/test/unit_test.hpp>

#include "lib/fastmath.h"
#include "lib/ops.h"
#include "lib/rng.h"
#include "tests/roundoff.h"

using namespace hl;

BOOST_AUTO_TEST_CASE(factories_and_access) {
  Tensor z = Tensor::zeros({2, 3});
  BOOST_TEST(z.numel() == 6);
  BOOST_TEST(z.shape() == Shape({2, 3}));
  for (float v : z.to_vector()) BOOST_TEST(v == 0.f);
  BOOST_TEST(Tensor::ones({4}).to_vector() == std::vector<float>(4, 1.f));
  BOOST_TEST(Tensor::full({2}, 2.5f).to_vector() == std::vector<float>(2, 2.5f));
  BOOST_TEST(Tensor::arange(4).to_vector() == (std::vector<float>{0, 1, 2, 3}));
  Tensor t = Tensor::from({2, 3}, {1, 2, 3, 4, 5, 6});
  BOOST_TEST(t.at({1, 0}) == 4.f);
  t.at({0, 2}) = 9.f;
  BOOST_TEST(t.data()[2] == 9.f);
  BOOST_TEST(Tensor::scalar(3.f).item() == 3.f);
  BOOST_TEST(Tensor::scalar(3.f).ndim() == 0);
  BOOST_TEST(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  BOOST_TEST(t.size(-1) == 3);
}

BOOST_AUTO_TEST_CASE(seeded_random_is_reproducible) {
  Rng a(42), b(42), c(43);
  Tensor x = Tensor::randn({100}, a), y = Tensor::randn({100}, b), z = Tensor::randn({100}, c);
  BOOST_TEST(x.to_vector() == y.to_vector());
  BOOST_TEST(x.to_vector() != z.to_vector());
  // Moments of 100k normals / uniforms are close to the distribution's.
  Rng r(7);
  Tensor n = Tensor::randn({100000}, r), u = Tensor::uniform({100000}, r, -1.f, 3.f);
  BOOST_TEST(mean(n).item() == 0.f, boost::test_tools::tolerance(0.02f));
  BOOST_TEST(std::sqrt(mean(mul(n, n)).item()) == 1.f, boost::test_tools::tolerance(0.02f));
  BOOST_TEST(mean(u).item() == 1.f, boost::test_tools::tolerance(0.02f));
  BOOST_TEST(max(u).item() < 3.f);
}

BOOST_AUTO_TEST_CASE(reshape_is_a_view_permute_copies) {
  Tensor x = Tensor::from({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor r = reshape(x, {3, -1});
  BOOST_TEST(r.shape() == Shape({3, 2}));
  BOOST_TEST(r.data() == x.data());
  Tensor t = transpose(x, 0, 1);
  BOOST_TEST(t.shape() == Shape({3, 2}));
  BOOST_TEST(t.to_vector() == (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor a = reshape(Tensor::arange(24), {2, 3, 4});
  Tensor p = permute(a, {2, 0, 1});  // (4,2,3): p[k,i,j] = a[i,j,k]
  BOOST_TEST(p.shape() == Shape({4, 2, 3}));
  BOOST_TEST(p.at({3, 1, 2}) == a.at({1, 2, 3}));
  BOOST_TEST(p.at({1, 0, 2}) == a.at({0, 2, 1}));
}

BOOST_AUTO_TEST_CASE(slice_concat_split) {
  Tensor a = reshape(Tensor::arange(12), {3, 4});
  Tensor s = slice(a, 1, 1, 3);
  BOOST_TEST(s.to_vector() == (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor c = concat({slice(a, 1, 0, 1), slice(a, 1, 1, 4)}, 1);
  BOOST_TEST(c.to_vector() == a.to_vector());
  auto parts = split(a, {1, 2}, 0);
  BOOST_TEST(parts.size() == 2u);
  BOOST_TEST(parts[1].shape() == Shape({2, 4}));
  BOOST_TEST(parts[1].at({0, 0}) == 4.f);
  std::vector<Tensor> many;
  for (int i = 0; i < 7; ++i) many.push_back(Tensor::full({1, 2}, float(i)));
  Tensor m = concat(many, 0);  // more inputs than a node has parents: built as a tree
  BOOST_TEST(m.shape() == Shape({7, 2}));
  BOOST_TEST(m.at({6, 1}) == 6.f);
}

BOOST_AUTO_TEST_CASE(broadcasting_follows_numpy) {
  Tensor a = Tensor::from({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from({2, 1}, {10, 20});
  Tensor c = add(a, b);  // (2,2,3): c[i,j,k] = a[i,0,k] + b[j,0]
  BOOST_TEST(c.shape() == Shape({2, 2, 3}));
  BOOST_TEST(c.at({0, 0, 0}) == 11.f);
  BOOST_TEST(c.at({0, 1, 2}) == 23.f);
  BOOST_TEST(c.at({1, 1, 1}) == 25.f);
  Tensor d = mul(Tensor::from({3}, {1, 2, 3}), Tensor::scalar(2.f));
  BOOST_TEST(d.to_vector() == (std::vector<float>{2, 4, 6}));
}

BOOST_AUTO_TEST_CASE(reductions_values) {
  Tensor a = reshape(Tensor::arange(24), {2, 3, 4});
  BOOST_TEST(sum(a).item() == 276.f);
  Tensor s = sum(a, {1});
  BOOST_TEST(s.shape() == Shape({2, 4}));
  BOOST_TEST(s.at({1, 2}) == 14.f + 18.f + 22.f);
  Tensor m = mean(a, {0, 2}, true);
  BOOST_TEST(m.shape() == Shape({1, 3, 1}));
  BOOST_TEST(m.at({0, 1, 0}) == (4 + 5 + 6 + 7 + 16 + 17 + 18 + 19) / 8.f);
  Tensor mx = max(a, {-1});
  BOOST_TEST(mx.to_vector() == (std::vector<float>{3, 7, 11, 15, 19, 23}));
}

BOOST_AUTO_TEST_CASE(matmul_values_and_transposes) {
  Tensor a = Tensor::from({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from({3, 2}, {7, 8, 9, 10, 11, 12});
  BOOST_TEST(matmul(a, b).to_vector() == (std::vector<float>{58, 64, 139, 154}));
  // a^T a via the flag equals the explicit transpose
  BOOST_TEST(matmul(a, a, true, false).to_vector() == matmul(transpose(a, 0, 1), a).to_vector());
  BOOST_TEST(matmul(a, a, false, true).to_vector() == (std::vector<float>{14, 32, 32, 77}));
  Tensor x = Tensor::from({2, 2}, {1, 0, 0, 1});
  Tensor w = Tensor::from({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor bias = Tensor::from({3}, {0.5f, 0, -1});
  BOOST_TEST(linear(x, w, bias).to_vector() == (std::vector<float>{1.5f, 3, 4, 2.5f, 4, 5}));
}

BOOST_AUTO_TEST_CASE(nn_values) {
  Tensor x = Tensor::from({2, 3}, {1, 2, 3, 0, 0, 0});
  Tensor y = softmax(x, -1);
  const float e1 = std::exp(1.f), e2 = std::exp(2.f), e3 = std::exp(3.f);
  BOOST_TEST(y.at({0, 2}) == e3 / (e1 + e2 + e3), boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(y.at({1, 0}) == 1.f / 3.f, boost::test_tools::tolerance(1e-6f));
  Tensor ln = layer_norm(Tensor::from({1, 4}, {1, 2, 3, 4}), Tensor(), Tensor());
  // mean 2.5, biased var 1.25
  BOOST_TEST(ln.at({0, 0}) == -1.5f / std::sqrt(1.25f + 1e-5f), boost::test_tools::tolerance(1e-5f));
  Ids t(Shape{2}, {2, -1});
  Tensor ce = cross_entropy(x, t, -1);
  BOOST_TEST(ce.item() == std::log(e1 + e2 + e3) - 3.f, boost::test_tools::tolerance(1e-5f));
  BOOST_TEST(gelu_erf(Tensor::scalar(1.f)).item() == 0.8413447f, boost::test_tools::tolerance(1e-5f));
  BOOST_TEST(gelu_tanh(Tensor::scalar(1.f)).item() == 0.8411920f, boost::test_tools::tolerance(1e-5f));
  Tensor w = Tensor::from({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor e = embedding(w, Ids(Shape{1, 2}, {2, 0}));
  BOOST_TEST(e.shape() == Shape({1, 2, 2}));
  BOOST_TEST(e.to_vector() == (std::vector<float>{5, 6, 1, 2}));
  Tensor gr = gather_rows(reshape(w, {1, 3, 2}), Ids(Shape{3}, {2, 2, 0}));  // rows of the last axis
  BOOST_TEST(gr.shape() == Shape({3, 2}));
  BOOST_TEST(gr.to_vector() == (std::vector<float>{5, 6, 5, 6, 1, 2}));
}

BOOST_AUTO_TEST_CASE(fully_masked_softmax_row_has_no_nan) {
  Tensor x = Tensor::from({2, 3}, {1, 2, 3, 4, 5, 6}).requires_grad_();
  Tensor mask = Tensor::from({2, 3}, {0, 1, 1, 1, 1, 1});  // row 1 fully masked
  const float inf = std::numeric_limits<float>::infinity();
  Tensor y = softmax(masked_fill(x, mask, -inf), -1);
  BOOST_TEST(y.at({0, 0}) == 1.f);
  BOOST_TEST(y.at({0, 1}) == 0.f);
  for (int j = 0; j < 3; ++j) BOOST_TEST(y.at({1, j}) == 0.f);
  Rng rng(1);
  y.backward(Tensor::randn({2, 3}, rng));
  for (float g : x.grad().to_vector()) BOOST_TEST(std::isfinite(g));
  Tensor ls = log_softmax(masked_fill(x, mask, -inf), -1);
  BOOST_TEST(ls.at({0, 0}) == 0.f);
}

BOOST_AUTO_TEST_CASE(dropout_is_seeded_and_identity_in_eval) {
  Tensor x = Tensor::ones({1000});
  Rng r1(5), r2(5);
  Tensor a = dropout(x, 0.25f, r1, true), b = dropout(x, 0.25f, r2, true);
  BOOST_TEST(a.to_vector() == b.to_vector());
  int zeros = 0;
  for (float v : a.to_vector()) {
    BOOST_TEST((v == 0.f || v == 1.f / 0.75f));
    zeros += v == 0.f;
  }
  BOOST_TEST(zeros > 200);
  BOOST_TEST(zeros < 300);
  BOOST_TEST(dropout(x, 0.25f, r1, false).same(x));
}

BOOST_AUTO_TEST_CASE(fast_math_matches_libm_within_the_documented_bounds) {
  double worst_exp = 0, worst_erf = 0, worst_erf_rational = 0, worst_tanh = 0, worst_gauss = 0;
  for (double x = -9; x <= 9; x += 1.37e-4) {
    const float xf = static_cast<float>(x);
    float gauss;
    worst_erf = std::max(worst_erf, std::fabs(hl::erf_fast(xf, gauss) - std::erf(double(xf))));
    worst_gauss = std::max(worst_gauss, std::fabs(gauss - std::exp(-double(xf) * xf)));
    worst_erf_rational = std::max(worst_erf_rational, std::fabs(hl::erf_rational(xf) - std::erf(double(xf))));
    worst_tanh = std::max(worst_tanh, std::fabs(hl::tanh_fast(xf) - std::tanh(double(xf))));
  }
  for (double x = -80; x <= 80; x += 1.1e-3) {  // relative: exp spans many decades
    const float xf = static_cast<float>(x);
    const double e = std::exp(double(xf));
    worst_exp = std::max(worst_exp, std::fabs(hl::exp_fast(xf) - e) / e);
  }
  BOOST_TEST(worst_erf < 5e-7);
  BOOST_TEST(worst_gauss < 1e-7);
  BOOST_TEST(worst_erf_rational < 4e-7);
  BOOST_TEST(worst_tanh < 1.5e-7);
  BOOST_TEST(worst_exp < 1.5e-7);  // ~1 ulp
  BOOST_TEST(hl::exp_fast(100.f) == INFINITY);
  BOOST_TEST(hl::exp_fast(-100.f) == 0.f);
  BOOST_TEST(std::isnan(hl::exp_fast(NAN)));
  BOOST_TEST(std::isnan(hl::erf_rational(NAN)));
  BOOST_TEST(hl::erf_rational(30.f) == hl::erf_rational(4.f));
}

// gemm (every product goes through it: OpenBLAS, our small-product kernel (K <= 128 and N <= 128,
// or A transposed with N <= 32 and M <= 128; B transposed only for M >= 4K), or our kernel for NN
// products with 3..8 columns past a multiple of 16) against a float64 product, within gamma(K + 2)
// of the summed magnitudes: every transpose combination, sizes on both sides of each switch
// (16 and 32 columns, 6-row blocks), strided operands, beta 0 (C holds NaN and must not be read)
// and beta 1.
BOOST_AUTO_TEST_CASE(gemm_matches_float64_for_every_shape_class) {
  Rng rng(5);
  struct Sizes { std::vector<int64_t> M, N, K; };
  for (const Sizes& z : {Sizes{{1, 5, 8, 13, 33}, {1, 2, 3, 4, 7, 8, 9, 12, 16, 17, 19, 24, 27, 32, 33, 40}, {1, 7, 32, 33, 70}},
                         Sizes{{130}, {20, 40, 130}, {9, 129}}})
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t M : z.M)
        for (int64_t N : z.N)
          for (int64_t K : z.K)
            for (float beta : {0.f, 1.f}) {
              const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;  // strided
              std::vector<float> A((ta ? K : M) * lda), B((tb ? N : K) * ldb), C(M * ldc);
              for (float& v : A) v = rng.uniform() * 2 - 1;
              for (float& v : B) v = rng.uniform() * 2 - 1;
              for (float& v : C) v = beta == 0.f ? NAN : rng.uniform() * 2 - 1;
              const std::vector<float> C0 = C;
              const float alpha = 0.75f;
              gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
              bool ok = true;
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                  double ref = 0, mag = 0;
                  for (int64_t k = 0; k < K; ++k) {
                    const double a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
                    ref += a * b;
                    mag += std::fabs(a * b);
                  }
                  const double c0 = beta == 0.f ? 0.0 : C0[i * ldc + j];
                  ref = alpha * ref + beta * c0;
                  const double bound = roundoff::gamma(static_cast<double>(K + 2)) * (alpha * mag + std::fabs(c0));
                  ok = ok && std::fabs(C[i * ldc + j] - ref) <= bound;
                }
              for (int64_t i = 0; i < M; ++i)  // the padding between rows of C is untouched
                for (int64_t j = N; j < ldc; ++j)
                  ok = ok && (std::isnan(C0[i * ldc + j]) ? std::isnan(C[i * ldc + j]) : C[i * ldc + j] == C0[i * ldc + j]);
              BOOST_TEST(ok, "gemm ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K << " beta " << beta);
            }
}
