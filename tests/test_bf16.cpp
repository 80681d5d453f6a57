// The bf16 paths (lib/bf16.h): rounding, the oneDNN product and the linear layers under
// PrecisionScope(Bf16), against float64 references with bounds from bf16's rounding.
//
// Operands rounded to 8 significant bits (unit roundoff u = 2^-8) make each product a b off by at
// most (2u + u^2)|a b|; the products of bf16 values are exact in float32 and the sum over K adds
// at most K 2^-24 of sum |a b| (float32 accumulation in any order). So for every element
//   |C - C64| <= ((2u + u^2) + K 2^-24 (1 + u)^2) sum_k |a_ik| |b_kj|
// and, against float64 of the rounded operands, the float32 accumulation term alone.
// The bf16 paths do not call OpenBLAS, so these hold under any OPENBLAS_CORETYPE (CI's three
// kernel sets: the ctest run is repeated with Haswell, SkylakeX and the default).
#define BOOST_TEST_MODULE bf16
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/alloc_counter.h"
#include "lib/autograd.h"
#include "lib/optim.h"
#include "lib/bf16.h"
#include "lib/ops.h"
#include "lib/safetensors.h"
#include "train/snapshots.h"
#include "train/trainer.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff, 2^-8

Rng& rng() {
  static Rng r(42);
  return r;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
double rounded(float x) { return from_bf16(to_bf16(x)); }

// Element (i, j) of op(X) for X row-major at stride ld: (rows, cols) or, transposed, (cols, rows).
double at(const std::vector<float>& X, bool trans, int64_t ld, int64_t i, int64_t j, bool round) {
  const float v = trans ? X[j * ld + i] : X[i * ld + j];
  return round ? rounded(v) : v;
}

struct Bound {
  double worst = 0;  // largest |err| / allowed seen (must stay <= 1)
  void check(double got, double want, double allowed) { worst = std::max(worst, std::abs(got - want) / allowed); }
};

double bf16_bound(int64_t K, double abs_sum) { return ((2 * kU + kU * kU) + K * std::ldexp(1.0, -24) * (1 + kU) * (1 + kU)) * abs_sum + 1e-30; }
double accumulation_bound(int64_t K, double abs_sum) { return K * std::ldexp(1.0, -24) * abs_sum + 1e-30; }

std::vector<float> randn(int64_t n) {
  const Tensor t = Tensor::randn({n}, rng());
  return std::vector<float>(t.data(), t.data() + n);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(rounding)

BOOST_AUTO_TEST_CASE(round_to_nearest_even_exact_values) {
  BOOST_TEST(to_bf16(1.0f) == 0x3F80);
  BOOST_TEST(to_bf16(float_of(0x3F808000)) == 0x3F80);  // 1 + 2^-8: halfway, to the even 1.0
  BOOST_TEST(to_bf16(float_of(0x3F818000)) == 0x3F82);  // 1 + 3 2^-8: halfway, to the even 1 + 2^-6
  BOOST_TEST(to_bf16(float_of(0x3F808001)) == 0x3F81);  // just above halfway: up
  BOOST_TEST(to_bf16(float_of(0x3F807FFF)) == 0x3F80);  // just below: down
  BOOST_TEST(to_bf16(-1.0f) == 0xBF80);
  BOOST_TEST(to_bf16(float_of(0x7F7FFFFF)) == 0x7F80);  // FLT_MAX rounds to infinity
  BOOST_TEST(to_bf16(INFINITY) == 0x7F80);
  BOOST_TEST(std::isnan(from_bf16(to_bf16(NAN))));
  BOOST_TEST(std::isnan(from_bf16(to_bf16(float_of(0x7F800001)))));  // a NaN whose payload is all low bits
}

BOOST_AUTO_TEST_CASE(vector_conversion_equals_the_scalar_definition) {
  PrecisionScope bf16(Precision::Bf16);
  for (int64_t n : {1, 15, 16, 17, 31, 32, 33, 100, 70001}) {  // tails of both widths; 70001 is threaded
    std::vector<float> x = randn(n);
    for (int64_t i = 0; i < n; i += 7) x[i] = float_of(bits_of(x[i]) | 0x8000u);  // ties and above-ties
    std::vector<uint16_t> h(n);
    convert_to_bf16(x.data(), h.data(), n);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += h[i] != to_bf16(x[i]);
    BOOST_TEST(differ == 0, "n = " << n);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(products)

// Every transpose, strides wider than the matrices, beta 0 and 1, with and without a bias.
BOOST_AUTO_TEST_CASE(gemm_bf16_within_the_rounding_bound) {
  PrecisionScope bf16(Precision::Bf16);
  const int64_t M = 37, N = 50, K = 300, pad = 3;
  const std::vector<float> bias = randn(N);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.f, 1.f})
      for (bool with_bias : {false, true}) {
        const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        const std::vector<float> A = randn((ta ? K : M) * lda), B = randn((tb ? N : K) * ldb), C0 = randn(M * ldc);
        std::vector<uint16_t> Ah(A.size()), Bh(B.size());
        convert_to_bf16(A.data(), Ah.data(), static_cast<int64_t>(A.size()));
        convert_to_bf16(B.data(), Bh.data(), static_cast<int64_t>(B.size()));
        std::vector<float> C = C0;
        gemm_bf16(ta, tb, M, N, K, Ah.data(), lda, Bh.data(), ldb, beta, C.data(), ldc, with_bias ? bias.data() : nullptr);
        Bound exact_ops, real_ops;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            const double b = with_bias ? bias[j] : 0.0;  // float32, not rounded
            double sum = beta * C0[i * ldc + j] + b, sum_rounded = sum, abs_sum = std::abs(beta * C0[i * ldc + j]) + std::abs(b);
            for (int64_t k = 0; k < K; ++k) {
              sum += at(A, ta, lda, i, k, false) * at(B, tb, ldb, k, j, false);
              sum_rounded += at(A, ta, lda, i, k, true) * at(B, tb, ldb, k, j, true);
              abs_sum += std::abs(at(A, ta, lda, i, k, false) * at(B, tb, ldb, k, j, false));
            }
            exact_ops.check(C[i * ldc + j], sum_rounded, accumulation_bound(K + 2, abs_sum * (1 + 3 * kU)));
            real_ops.check(C[i * ldc + j], sum, bf16_bound(K + 2, abs_sum));
          }
        BOOST_TEST_MESSAGE("gemm_bf16 ta " << ta << " tb " << tb << " beta " << beta << " bias " << with_bias
                                              << ": error / bound " << exact_ops.worst << " (rounded operands), "
                                              << real_ops.worst << " (float64)");
        BOOST_TEST(exact_ops.worst <= 1.0, "ta " << ta << " tb " << tb << " beta " << beta << " bias " << with_bias);
        BOOST_TEST(real_ops.worst <= 1.0, "ta " << ta << " tb " << tb << " beta " << beta << " bias " << with_bias);
        BOOST_TEST(real_ops.worst > 0.0);  // the operands were rounded: not float32's result
        // the padding between rows is never written
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = N; j < ldc; ++j) BOOST_TEST(C[i * ldc + j] == C0[i * ldc + j]);
      }
}

BOOST_AUTO_TEST_CASE(bf16_is_refused_outside_a_bf16_cpu_only) {
  // On this machine (AVX512_BF16) nothing is refused; the refusal itself is tested through the
  // command line with DNNL_MAX_CPU_ISA=AVX512_CORE (tests/cli_test.sh).
  if (bf16_unsupported_reason().empty()) BOOST_CHECK_NO_THROW(PrecisionScope(Precision::Bf16));
  else BOOST_CHECK_THROW(PrecisionScope(Precision::Bf16), Error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(linear_layers)

// y = act(x W^T + b) and its three gradients under bf16, for one weight, stacked weights side by
// side (one block) and apart, against float64 with the bounds above. dU of an activation is
// float32 (its error is float32's, far inside the bound). no_bias_at: that weight has no bias.
void check_linear(int stacked, bool back_to_back, bool act, int no_bias_at = -1) {
  const int64_t R = 40, in = 96, out = 24;
  Tensor x = Tensor::randn({2, R / 2, in}, rng()).requires_grad_();
  std::vector<Tensor> ws, bs;
  Tensor slab = Tensor::randn({stacked * out, in}, rng(), 0.f, 0.2f);
  for (int i = 0; i < stacked; ++i) {
    ws.push_back(back_to_back ? storage_view(slab, i * out * in, {out, in}).requires_grad_()
                              : Tensor::randn({out, in}, rng(), 0.f, 0.2f).requires_grad_());
    bs.push_back(i == no_bias_at ? Tensor() : Tensor::randn({out}, rng()).requires_grad_());
  }
  const int64_t N = stacked * out;
  const Tensor g = Tensor::randn({2, R / 2, N}, rng());
  Tensor y;
  {
    PrecisionScope bf16(Precision::Bf16);
    Bf16EveryProduct every;  // these thin weights would stay float32
    y = act ? linear_act(x, ws[0], bs[0], Activation::Relu) : linear_stacked(x, ws, bs);
  }
  y.backward(g);  // outside the scope: the backward keeps the forward's precision
  auto W = [&](int64_t o, int64_t k) { return static_cast<double>(ws[o / out].data()[(o % out) * in + k]); };
  auto X = [&](int64_t r, int64_t k) { return static_cast<double>(x.data()[r * in + k]); };
  std::vector<double> u(R * N), dU(R * N);
  Bound fwd, dx, dw, db;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < N; ++o) {
      double s = bs[o / out].defined() ? bs[o / out].data()[o % out] : 0.0, a = std::abs(s);
      for (int64_t k = 0; k < in; ++k) s += X(r, k) * W(o, k), a += std::abs(X(r, k) * W(o, k));
      u[r * N + o] = s;
      const double want = act ? std::max(s, 0.0) : s;
      fwd.check(y.data()[r * N + o], want, bf16_bound(in + 1, a));
      // relu's gradient from headlab's own U (a U near 0 may differ in sign from float64's)
      const bool on = act ? y.data()[r * N + o] > 0 : true;
      dU[r * N + o] = on ? g.data()[r * N + o] : 0.0;
    }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < in; ++k) {
      double s = 0, a = 0;
      for (int64_t o = 0; o < N; ++o) s += dU[r * N + o] * W(o, k), a += std::abs(dU[r * N + o] * W(o, k));
      dx.check(x.grad().data()[r * in + k], s, bf16_bound(N, a));
    }
  for (int64_t o = 0; o < N; ++o) {
    for (int64_t k = 0; k < in; ++k) {
      double s = 0, a = 0;
      for (int64_t r = 0; r < R; ++r) s += dU[r * N + o] * X(r, k), a += std::abs(dU[r * N + o] * X(r, k));
      dw.check(ws[o / out].grad().data()[(o % out) * in + k], s, bf16_bound(R, a));
    }
    if (!bs[o / out].defined()) continue;
    double s = 0, a = 0;
    for (int64_t r = 0; r < R; ++r) s += dU[r * N + o], a += std::abs(dU[r * N + o]);
    db.check(bs[o / out].grad().data()[o % out], s, accumulation_bound(R, a));  // db stays float32
  }
  BOOST_TEST_MESSAGE("linear error / bound: y " << fwd.worst << ", dx " << dx.worst << ", dW " << dw.worst << ", db " << db.worst);
  BOOST_TEST(fwd.worst <= 1.0);
  BOOST_TEST(dx.worst <= 1.0);
  BOOST_TEST(dw.worst <= 1.0);
  BOOST_TEST(db.worst <= 1.0);
}

BOOST_AUTO_TEST_CASE(linear_one_weight) { check_linear(1, false, false); }
BOOST_AUTO_TEST_CASE(linear_stacked_side_by_side) { check_linear(3, true, false); }
BOOST_AUTO_TEST_CASE(linear_stacked_apart) { check_linear(3, false, false); }
BOOST_AUTO_TEST_CASE(linear_stacked_one_without_bias) { check_linear(3, false, false, 1); }
BOOST_AUTO_TEST_CASE(linear_act_relu) { check_linear(1, false, true); }

// A smooth activation under bf16 keeps its pre-activation U for the backward in bf16 only, so
// dU = act'(bf16(U)) dY: the derivative moves by at most max|act''| |bf16(U) - U_exact|, where
// U carries the forward's bound e_U plus the rounding kU |U|. That error rides through dX, dW (as
// part of dU, rounded again to bf16) and db (float32 sum). `eval` is the activation's own float32
// evaluation error (fast tanh/exp), far smaller.
void check_linear_act_smooth(Activation act, double (*f)(double), double (*df)(double), double max_d1, double max_d2) {
  const int64_t R = 40, in = 96, N = 48;
  const double eval = 1e-6;
  Tensor x = Tensor::randn({R, in}, rng()).requires_grad_();
  Tensor w = Tensor::randn({N, in}, rng(), 0.f, 0.2f).requires_grad_();
  Tensor b = Tensor::randn({N}, rng()).requires_grad_();
  const Tensor g = Tensor::randn({R, N}, rng());
  Tensor y;
  {
    PrecisionScope bf16(Precision::Bf16);
    Bf16EveryProduct every;
    y = linear_act(x, w, b, act);
  }
  y.backward(g);
  auto W = [&](int64_t o, int64_t k) { return static_cast<double>(w.data()[o * in + k]); };
  auto X = [&](int64_t r, int64_t k) { return static_cast<double>(x.data()[r * in + k]); };
  std::vector<double> dU(R * N), dU_err(R * N);
  Bound fwd, dx, dw, db;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < N; ++o) {
      double u = b.data()[o], a = std::abs(u);
      for (int64_t k = 0; k < in; ++k) u += X(r, k) * W(o, k), a += std::abs(X(r, k) * W(o, k));
      const double e_u = bf16_bound(in + 1, a), G = g.data()[r * N + o];
      fwd.check(y.data()[r * N + o], f(u), max_d1 * e_u + eval * (1 + std::abs(u)));
      dU[r * N + o] = df(u) * G;
      dU_err[r * N + o] = std::abs(G) * (max_d2 * (e_u + kU * (std::abs(u) + e_u)) + eval * (1 + std::abs(u)));
    }
  // got = sum_i dU(e_i) c_i, a bf16 product of dU (which carries dU_err) and c; at(i) = {e_i, c_i}
  auto check_product = [&](Bound& bound, float got, int64_t n, auto at) {
    double s = 0, a = 0, moved = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto [e, c] = at(i);
      s += dU[e] * c, a += std::abs(dU[e] * c), moved += dU_err[e] * std::abs(c);
    }
    bound.check(got, s, bf16_bound(n, a + moved) + moved);
  };
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < in; ++k)
      check_product(dx, x.grad().data()[r * in + k], N, [&](int64_t o) { return std::pair(r * N + o, W(o, k)); });
  for (int64_t o = 0; o < N; ++o) {
    for (int64_t k = 0; k < in; ++k)
      check_product(dw, w.grad().data()[o * in + k], R, [&](int64_t r) { return std::pair(r * N + o, X(r, k)); });
    double s = 0, a = 0, moved = 0;
    for (int64_t r = 0; r < R; ++r) s += dU[r * N + o], a += std::abs(dU[r * N + o]), moved += dU_err[r * N + o];
    db.check(b.grad().data()[o], s, accumulation_bound(R, a + moved) + moved);
  }
  BOOST_TEST_MESSAGE("linear_act error / bound: y " << fwd.worst << ", dx " << dx.worst << ", dW " << dw.worst << ", db " << db.worst);
  BOOST_TEST(fwd.worst <= 1.0);
  BOOST_TEST(dx.worst <= 1.0);
  BOOST_TEST(dw.worst <= 1.0);
  BOOST_TEST(db.worst <= 1.0);
}

double gelu_tanh64(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }
double gelu_tanh64_d(double v) {
  const double c = std::sqrt(2 / M_PI), t = std::tanh(c * (v + 0.044715 * v * v * v));
  return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
}
double silu64(double v) { return v / (1 + std::exp(-v)); }
double silu64_d(double v) {
  const double s = 1 / (1 + std::exp(-v));
  return s * (1 + v * (1 - s));
}
// max |act'| and max |act''| over the reals (float64 autograd on a fine grid)
BOOST_AUTO_TEST_CASE(linear_act_gelu_keeps_a_bf16_pre_activation) {
  check_linear_act_smooth(Activation::GeluTanh, gelu_tanh64, gelu_tanh64_d, 1.1290, 0.7979);
}
BOOST_AUTO_TEST_CASE(linear_act_silu_keeps_a_bf16_pre_activation) {
  check_linear_act_smooth(Activation::Silu, silu64, silu64_d, 1.0999, 0.5);
}

// The precision is the forward's: a float32 forward differentiated inside a bf16 scope is
// float32's bit for bit, and after the scope float32 is back.
BOOST_AUTO_TEST_CASE(scope_restores_and_backward_follows_the_forward) {
  Tensor x = Tensor::randn({64, 32}, rng()).requires_grad_();
  Tensor w = Tensor::randn({48, 32}, rng()).requires_grad_();
  auto grads = [&](bool bf16_forward, bool bf16_backward) {
    x.zero_grad();
    w.zero_grad();
    Tensor y;
    {
      std::optional<PrecisionScope> s;
      std::optional<Bf16EveryProduct> every;
      if (bf16_forward) s.emplace(Precision::Bf16), every.emplace();
      y = linear(x, w, Tensor());
    }
    std::optional<PrecisionScope> s;
    std::optional<Bf16EveryProduct> every;
    if (bf16_backward) s.emplace(Precision::Bf16), every.emplace();
    sum(y).backward();
    std::vector<float> out(y.data(), y.data() + y.numel());
    out.insert(out.end(), w.grad().data(), w.grad().data() + w.numel());
    return out;
  };
  const std::vector<float> f32 = grads(false, false);
  BOOST_TEST(grads(false, true) == f32);
  BOOST_TEST(grads(true, false) == grads(true, true));
  BOOST_TEST(grads(true, false) != f32);
  BOOST_TEST((matmul_precision() == Precision::Float32));
}

// The rule of which products run in bf16 (bf16_pays) depends on the shape alone, and a product it
// leaves in float32 is float32's bit for bit, output and gradients, inside a bf16 scope.
BOOST_AUTO_TEST_CASE(thin_products_stay_float32_bit_for_bit) {
  BOOST_TEST(!bf16_pays(4096, 3 * 64, 64));         // S's W_QKV
  BOOST_TEST(!bf16_pays(4096, 64, 256));            // S's fc2
  BOOST_TEST(bf16_pays(4096, 3 * 256, 256));        // M's W_QKV
  BOOST_TEST(bf16_pays(1024, 50257, 768));          // GPT-2 small's unembedding
  BOOST_TEST(bf16_pays(1, 1024, 256) == bf16_pays(100000, 1024, 256));  // rows do not decide
  enum Mode { Float32, Measured, Every };
  auto run = [&](int64_t out, int64_t in, Mode mode) {
    Rng r(5);
    Tensor x = Tensor::randn({64, in}, r).requires_grad_();
    Tensor w = Tensor::randn({out, in}, r, 0.f, 0.1f).requires_grad_();
    Tensor b = Tensor::randn({out}, r).requires_grad_();
    std::optional<PrecisionScope> s;
    std::optional<Bf16EveryProduct> every;
    if (mode != Float32) s.emplace(Precision::Bf16);
    if (mode == Every) every.emplace();
    Tensor y = linear_act(x, w, b, Activation::GeluTanh);
    sum(y).backward();
    std::vector<float> all = y.to_vector();
    for (const Tensor& t : {x, w, b}) {
      const std::vector<float> g = t.grad().to_vector();
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  const int64_t thin = kBf16MinWidth / 2, wide = kBf16MinWidth;
  BOOST_TEST(run(wide, thin, Measured) == run(wide, thin, Float32));
  BOOST_TEST(run(wide, thin, Every) != run(wide, thin, Float32));  // bf16 when forced
  BOOST_TEST(run(wide, wide, Measured) != run(wide, wide, Float32));
  BOOST_TEST(run(wide, wide, Measured) == run(wide, wide, Every));
}

BOOST_AUTO_TEST_SUITE_END()

// ---- training in bf16 ---------------------------------------------------------------------------

namespace {
TrainArgs bf16_args(const std::string& out, const std::string& precision = "bf16") {
  TrainArgs a;
  a.model.d_model = kBf16MinWidth;  // wide enough for bf16's products (bf16_pays)
  a.model.n_layers = 2;
  a.model.n_heads = 2;
  a.model.d_ff = 4 * kBf16MinWidth;
  a.task = TaskConfig::preset("copy");
  a.task.alphabet = 5;
  a.task.min_len = a.task.max_len = 4;
  a.batch = 32;
  a.steps = 40;
  a.eval_every = 10;
  a.checkpoint_every = 20;
  a.eval_size = 64;
  a.warmup = 5;
  a.threads = 2;
  a.precision = precision;
  a.out = out;
  return a;
}
std::vector<double> held_out_losses(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line).at("loss").get<double>());
  return out;
}
std::vector<std::string> model_bytes(const std::string& file) {
  const SafetensorsFile f = read_safetensors(file);
  std::vector<std::string> out;
  for (const auto& [name, t] : f.tensors) out.push_back(name + std::string(t.bytes.begin(), t.bytes.end()));
  return out;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(training)

// The master weights are float32 and each bf16 product is deterministic for a thread count: a
// resumed bf16 run, and a run continued from one of its snapshots, end bit for bit where the
// uninterrupted run ends.
BOOST_AUTO_TEST_CASE(resume_and_snapshots_of_a_bf16_run_are_bit_exact) {
  const std::string full = fresh_dir("bf16-full"), cut = fresh_dir("bf16-cut"), fork = fresh_dir("bf16-fork"),
                    f32 = fresh_dir("bf16-f32");
  TrainArgs a = bf16_args(full);
  a.snapshot_every = 10;
  Trainer(a).run();
  Trainer(bf16_args(f32, "float32")).run();
  BOOST_TEST(model_bytes(full + "/model.safetensors") != model_bytes(f32 + "/model.safetensors"));  // bf16 was used
  // From the same weights and batches, bf16 follows float32's held-out loss: measured at most
  // 0.99% apart over these 40 steps (0.27-0.99% at the four evaluations; docs/performance.md);
  // 2% allowed.
  const std::vector<double> lb = held_out_losses(full), lf = held_out_losses(f32);
  BOOST_TEST(lb.size() == 4u);
  BOOST_TEST(lf.size() == 4u);
  for (size_t i = 0; i < std::min(lb.size(), lf.size()); ++i) {
    BOOST_TEST_MESSAGE("held-out loss at evaluation " << i << ": bf16 " << lb[i] << ", float32 " << lf[i] << " ("
                                                      << 100 * std::abs(lb[i] - lf[i]) / lf[i] << "% apart)");
    BOOST_TEST(std::abs(lb[i] - lf[i]) <= 0.02 * lf[i]);
  }
  {  // "crash" at step 25, after the step-20 checkpoint
    Trainer t(bf16_args(cut));
    TrainObserver obs;
    obs.on_step = [](int64_t step, int64_t, float, double) {
      if (step == 25) throw std::runtime_error("simulated crash");
    };
    BOOST_CHECK_THROW(t.run(obs), std::runtime_error);
  }
  TrainArgs r = bf16_args(cut);
  r.resume = true;
  Trainer(r).run();
  BOOST_TEST(held_out_losses(full) == held_out_losses(cut), boost::test_tools::per_element());
  BOOST_TEST(model_bytes(full + "/model.safetensors") == model_bytes(cut + "/model.safetensors"));
  // a run directory whose checkpoint is the step-10 snapshot: resume_args reads bf16 from it
  make_dirs(fork);
  fs::copy_file(snapshot_path(full, 10), fork + "/checkpoint.safetensors");
  TrainArgs from_snapshot = resume_args(fork, TrainArgs{}, [](const std::string&) { return false; });
  BOOST_TEST(from_snapshot.precision == "bf16");
  Trainer(from_snapshot).run();
  BOOST_TEST(model_bytes(full + "/model.safetensors") == model_bytes(fork + "/model.safetensors"));
}

// As the float32 step (test_train's a_training_step_allocates_nothing_in_its_steady_state), a bf16
// step of sizes seen before allocates nothing of its own: the rounded operands come from the tensor
// pool, and oneDNN's products run from cached primitives and memory objects with our scratchpad.
// What is left is inside oneDNN 2.6's dnnl_primitive_execute (traced with gdb, docs/performance.md):
// one node per argument of the std::unordered_map it turns the argument array into (4, or 5 with
// a bias), the map's buckets, and one in the matmul kernel (plus one with the sum post-op of beta
// 1): at most 7 per product, none of which its public API lets a caller avoid.
BOOST_AUTO_TEST_CASE(a_bf16_training_step_allocates_only_in_onednns_execute) {
  if (!alloc_counter::available()) return;  // sanitizer builds intercept malloc themselves
  Trainer t(bf16_args(""));
  std::vector<NamedParam> params;
  for (auto& [name, p] : t.model().named_parameters()) params.push_back({name, p, true});
  Adam opt(params, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true);
  std::vector<Batch> draws(10);
  Rng rng(1);
  for (Batch& b : draws) t.task().sample_into(b, 32, rng);
  const PrecisionScope bf16(Precision::Bf16);
  for (int i = 0; i < 20; ++i) train_step(t.model(), opt, draws[i % 10], 1.f);
  const uint64_t before = alloc_counter::count();
  for (int i = 0; i < 10; ++i) train_step(t.model(), opt, draws[i], 1.f);
  const double per_step = (alloc_counter::count() - before) / 10.0;
  // 2 layers of W_QKV, W_O, fc1, fc2 in bf16 (the unembedding, 128 x 5, stays float32): 8 forward
  // products, 8 dX and 8 dW
  const int products = 2 * 4 * 3;
  BOOST_TEST_MESSAGE("bf16 step: " << per_step << " allocations, " << products << " bf16 products");
  BOOST_TEST(per_step <= 7.0 * products);
}

BOOST_AUTO_TEST_CASE(an_unknown_precision_is_refused_naming_the_flag) {
  TrainArgs a = bf16_args("", "fp8");
  BOOST_CHECK_EXCEPTION(a.validate(), Error, [](const Error& e) {
    return std::string(e.what()) == "--precision must be one of float32, bf16, got 'fp8'";
  });
}

BOOST_AUTO_TEST_SUITE_END()

