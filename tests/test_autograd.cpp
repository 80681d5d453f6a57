#define BOOST_TEST_MODULE autograd
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "lib/autograd.h"
#include "tests/roundoff.h"
#include "lib/ops.h"

using namespace hl;

namespace {
long rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}
}  // namespace

BOOST_AUTO_TEST_CASE(gradient_of_simple_expression) {
  // L = sum(x * y + x) -> dL/dx = y + 1, dL/dy = x
  Tensor x = Tensor::from({3}, {1, 2, 3}).requires_grad_();
  Tensor y = Tensor::from({3}, {4, 5, 6}).requires_grad_();
  sum(add(mul(x, y), x)).backward();
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{5, 6, 7}));
  BOOST_TEST(y.grad().to_vector() == (std::vector<float>{1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(backward_twice_doubles_gradients) {
  Tensor x = Tensor::from({2}, {1, 2}).requires_grad_();
  Tensor loss = sum(mul(x, x));
  loss.backward(Tensor(), /*retain_graph=*/true);
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{2, 4}));
  loss.backward();
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{4, 8}));
  // a fresh graph also accumulates into the leaf until zero_grad
  sum(mul(x, x)).backward();
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{6, 12}));
  x.zero_grad();
  BOOST_TEST(!x.grad().defined());
}

BOOST_AUTO_TEST_CASE(graph_is_freed_by_backward) {
  Tensor x = Tensor::from({2}, {1, 2}).requires_grad_();
  Tensor h = tanh(x);
  Tensor loss = sum(h);
  BOOST_TEST(loss.impl()->n_parents == 1);
  loss.backward();
  BOOST_TEST(loss.impl()->n_parents == 0);
  BOOST_TEST(h.impl()->n_parents == 0);
  BOOST_TEST(!h.grad().defined());  // intermediate gradients are not kept by default
  BOOST_CHECK_EXCEPTION(loss.backward(), Error, [](const Error& e) {
    return std::string(e.what()).find("already freed") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(retain_grad_keeps_an_intermediate_gradient) {
  Tensor x = Tensor::from({1, 3}, {0.1f, 0.2f, 0.3f}).requires_grad_();
  Tensor p = softmax(x, -1);
  p.retain_grad();
  Tensor loss = sum(mul(p, Tensor::from({1, 3}, {1, 2, 3})));
  loss.backward();
  BOOST_TEST(p.grad().to_vector() == (std::vector<float>{1, 2, 3}));
  BOOST_TEST(x.grad().defined());
}

BOOST_AUTO_TEST_CASE(no_grad_records_no_graph) {
  Tensor x = Tensor::from({2}, {1, 2}).requires_grad_();
  const int64_t before = TensorImpl::live_count.load();
  {
    NoGradGuard guard;
    Tensor y = exp(mul(x, x));
    BOOST_TEST(!y.requires_grad());
    BOOST_TEST(y.is_leaf());
    BOOST_TEST(y.impl()->n_parents == 0);
    BOOST_TEST(TensorImpl::live_count.load() == before + 1);  // the intermediate x*x is already gone
  }
  BOOST_TEST(grad_enabled());
  BOOST_TEST(exp(x).requires_grad());
}

BOOST_AUTO_TEST_CASE(detach_cuts_the_graph_and_shares_data) {
  Tensor x = Tensor::from({2}, {1, 2}).requires_grad_();
  Tensor y = mul(x, x);
  Tensor d = y.detach();
  BOOST_TEST(!d.requires_grad());
  BOOST_TEST(d.data() == y.data());
  Tensor loss = sum(mul(d, x));  // gradient flows only through x: dL/dx = d
  loss.backward();
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{1, 4}));
}

BOOST_AUTO_TEST_CASE(non_scalar_backward_needs_grad_output) {
  Tensor x = Tensor::from({2}, {1, 2}).requires_grad_();
  Tensor y = mul_scalar(x, 3.f);
  BOOST_CHECK_THROW(y.backward(), Error);
  y = mul_scalar(x, 3.f);
  y.backward(Tensor::from({2}, {1, -1}));
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{3, -3}));
}

BOOST_AUTO_TEST_CASE(long_chains_need_no_recursion) {
  Tensor x = Tensor::from({1}, {0.5f}).requires_grad_();
  {
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) y = mul_scalar(y, 1.f);
    // dropped without backward: freed iteratively, no stack overflow
  }
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = add_scalar(y, 0.f);
  y.backward();
  BOOST_TEST(x.grad().item() == 1.f);
}

BOOST_AUTO_TEST_CASE(memory_is_flat_over_10k_iterations) {
  Rng rng(3);
  Tensor w = Tensor::randn({32, 16}, rng, 0.f, 0.1f).requires_grad_();
  Tensor b = Tensor::zeros({32}).requires_grad_();
  Tensor x = Tensor::randn({8, 16}, rng);
  Ids t(Shape{8}, {0, 1, 2, 3, 4, 5, 6, 7});
  auto step = [&] {
    Tensor h = gelu_tanh(linear(layer_norm(x, Tensor(), Tensor()), w, b));
    Tensor loss = cross_entropy(softmax(h, -1), t);
    loss.backward();
    w.zero_grad();
    b.zero_grad();
  };
  for (int i = 0; i < 100; ++i) step();
  const int64_t live = TensorImpl::live_count.load();
  const size_t bytes = pool_stats().bytes_live;
  const long rss = rss_kb();
  for (int i = 0; i < 10000; ++i) step();
  BOOST_TEST(TensorImpl::live_count.load() == live);
  BOOST_TEST(pool_stats().bytes_live == bytes);
#ifndef HEADLAB_NO_POOL  // AddressSanitizer's quarantine holds freed memory on purpose
  BOOST_TEST(rss_kb() - rss < 1024);  // KiB
#else
  (void)rss;
#endif
}

BOOST_AUTO_TEST_CASE(storage_views_share_data_and_stacked_linear_gradients_form_one_block) {
  Tensor slab = Tensor::from({10}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  Tensor a = storage_view(slab, 0, {2, 2}).requires_grad_(), b = storage_view(slab, 4, {3, 2}).requires_grad_();
  BOOST_TEST(b.at({0, 1}) == 6.f);
  b.at({0, 1}) = -6.f;  // writes through
  BOOST_TEST(slab.data()[5] == -6.f);
  BOOST_TEST(back_to_back(std::vector<Tensor>{a, b}));
  BOOST_TEST(!back_to_back(std::vector<Tensor>{b, a}));
  BOOST_CHECK_EXCEPTION(storage_view(slab, 6, {3, 2}), Error, [](const Error& e) {
    return std::string(e.what()) == "storage_view: (3,2) at offset 6 does not fit in (10)";
  });
  // y = x [a; b]^T: dA = dY[:, :2]^T x, dB = dY[:, 2:]^T x, one block; a second backward adds
  Tensor x = Tensor::from({1, 2}, {1, -1});
  const Tensor ws[2] = {a, b}, bs[2] = {Tensor(), Tensor()};
  Tensor y = linear_stacked(x, ws, bs);  // (1, 5) = {1-2, 3-4, 5+6, 7-8, 9-10}
  BOOST_TEST(y.to_vector() == (std::vector<float>{-1, -1, 11, -1, -1}));
  const Tensor up = Tensor::from({1, 5}, {1, 2, 3, 4, 5});
  y.backward(up);
  BOOST_TEST(back_to_back(std::vector<Tensor>{a.grad(), b.grad()}));
  BOOST_TEST(a.grad().to_vector() == (std::vector<float>{1, -1, 2, -2}));
  BOOST_TEST(b.grad().to_vector() == (std::vector<float>{3, -3, 4, -4, 5, -5}));
  linear_stacked(x, ws, bs).backward(up);
  BOOST_TEST(a.grad().to_vector() == (std::vector<float>{2, -2, 4, -4}));
  BOOST_TEST(b.grad().to_vector() == (std::vector<float>{6, -6, 8, -8, 10, -10}));
  // gradients that are separate buffers are accumulated one by one
  a.zero_grad();
  b.zero_grad();
  a.impl()->grad = Tensor::zeros({2, 2}).ref();
  linear_stacked(x, ws, bs).backward(up);
  BOOST_TEST(a.grad().to_vector() == (std::vector<float>{1, -1, 2, -2}));
  BOOST_TEST(b.grad().to_vector() == (std::vector<float>{3, -3, 4, -4, 5, -5}));
  BOOST_CHECK_EXCEPTION(linear_stacked(Tensor::zeros({1, 3}), ws, bs), Error, [](const Error& e) {
    return std::string(e.what()) ==
           "linear: input (1,3) and weight (2,2): input features must equal weight columns (weight is (out, in))";
  });
}

BOOST_AUTO_TEST_CASE(threaded_linear_kernels_equal_a_float64_reference) {
  // Shapes big enough for the two-thread paths: row blocks with partial dW summed after a
  // barrier (many rows, small weight) and dW as one product (few rows, big weight); stacked
  // weights in one slab and separate; with and without a fused activation. Every result is
  // compared with a float64 reference within the round-off its arithmetic allows
  // (tests/roundoff.h): the kernels may add in any order, as OpenBLAS does on each CPU.
  using namespace roundoff;
  set_num_threads(2);
  Rng rng(31);
  struct Cfg { const char* what; int64_t R, in; std::vector<int64_t> outs; bool slab; bool gelu; };
  for (const Cfg& c : {Cfg{"partial dW, slab", 707, 24, {8, 16, 8}, true, false},
                       Cfg{"partial dW, separate", 707, 24, {8, 16, 8}, false, false},
                       Cfg{"partial dW, gelu", 707, 24, {40}, true, true},
                       Cfg{"one dW product, slab", 41, 300, {100, 200}, true, false},
                       Cfg{"one dW product, gelu", 41, 300, {300}, false, true}}) {
    int64_t N = 0;
    for (int64_t o : c.outs) N += o;
    Tensor slab = Tensor::randn({N * c.in}, rng);
    std::vector<Tensor> ws, bs;
    int64_t at = 0;
    for (int64_t o : c.outs) {
      Tensor w = c.slab ? storage_view(slab, at, {o, c.in}) : Tensor::randn({o, c.in}, rng);
      ws.push_back(w.requires_grad_());
      bs.push_back(Tensor::randn({o}, rng).requires_grad_());
      at += o * c.in;
    }
    Tensor x = Tensor::randn({c.R, c.in}, rng).requires_grad_();
    Tensor y = c.gelu ? linear_act(x, ws[0], bs[0], Activation::GeluErf) : linear_stacked(x, ws, bs);
    Tensor up = Tensor::randn(y.shape(), rng);
    y.backward(up);

    // float64 reference: U = x W^T + b (R, N); y = U or gelu(U); dU = up or up gelu'(U)
    NoGradGuard ng;
    const Mat X = from_tensor(x), W = from_tensor(concat(ws, 0)), Bias = from_tensor(concat(bs, 0), N),
              Up = from_tensor(up);
    Mat U = matmul(X, W, false, true), Y(c.R, N), dU(c.R, N);
    for (int64_t i = 0; i < c.R; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const Bounded uij = U(i, j) + Bias(0, j);
        U(i, j) = uij;
        if (!c.gelu) {
          Y(i, j) = uij;
          dU(i, j) = Up(i, j);
          continue;
        }
        // as lib/activations.h: 0.5 u (1 + erf(u / sqrt 2)); derivative 0.5 (1 + erf) + u exp(-u^2/2) / sqrt(2 pi)
        const Bounded z = uij * double(act::kInvSqrt2);
        Y(i, j) = exact(0.5) * uij * (exact(1) + erf(z));
        const Bounded gauss = exp(-(z * z));
        dU(i, j) = Up(i, j) * (exact(0.5) * (exact(1) + erf(z)) + uij * double(act::kInvSqrt2Pi) * gauss);
      }
    const Mat dX = matmul(dU, W), dW = matmul(dU, X, true, false);  // (R, in), (N, in)
    std::vector<Bounded> db(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) {
      std::vector<Bounded> col;
      for (int64_t i = 0; i < c.R; ++i) col.push_back(dU(i, j));
      db[static_cast<size_t>(j)] = sum(col);
    }
    BOOST_TEST_CONTEXT(c.what) {
      check_within(y, Y, "output");
      check_within(x.grad(), dX, "dX");
      int64_t row = 0;
      for (size_t i = 0; i < ws.size(); ++i) {
        const int64_t o = c.outs[i];
        check_within(ws[i].grad(), std::vector<Bounded>(dW.a.begin() + row * c.in, dW.a.begin() + (row + o) * c.in), "dW");
        check_within(bs[i].grad(), std::vector<Bounded>(db.begin() + row, db.begin() + row + o), "db");
        row += o;
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(add_hands_its_gradient_buffer_to_the_first_input_safely) {
  // add/sub give their first input the output's gradient buffer instead of a copy: the
  // values must be those of a copy in every aliasing pattern
  Tensor x = Tensor::from({3}, {1, 2, 3}).requires_grad_();
  Tensor up = Tensor::from({3}, {0.5f, -1, 2});
  add(x, x).backward(up);  // x + x: 2 g
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{1, -2, 4}));
  x.zero_grad();
  sub(x, x).backward(up);  // x - x: 0
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{0, 0, 0}));
  x.zero_grad();
  // a residual chain whose middle gradient is retained, backward twice (accumulates)
  Tensor w = Tensor::from({3}, {2, 2, 2}).requires_grad_();
  Tensor h = add(x, mul(x, w));  // h = x + x w
  h.retain_grad();
  Tensor out = add(h, mul(h, w));  // out = h + h w
  out.backward(up, /*retain_graph=*/true);
  BOOST_TEST(h.grad().to_vector() == (std::vector<float>{1.5f, -3, 6}));        // g (1 + w)
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{4.5f, -9, 18}));       // g (1 + w)^2
  out.backward(up);
  BOOST_TEST(h.grad().to_vector() == (std::vector<float>{3, -6, 12}));
  BOOST_TEST(x.grad().to_vector() == (std::vector<float>{9, -18, 36}));
  BOOST_TEST(up.to_vector() == (std::vector<float>{0.5f, -1, 2}));  // grad_output untouched
}

// cross_entropy's backward writes a fresh logits gradient instead of zeroing and adding: rows
// with the ignored target must still come out exactly 0 from a recycled (dirty) buffer, and an
// existing gradient must still be added to.
BOOST_AUTO_TEST_CASE(cross_entropy_writes_a_fresh_gradient_and_adds_to_an_existing_one) {
  const std::vector<float> values{0.5f, -1.f, 2.f, 0.f, 1.5f, 3.f, -2.f, 0.25f, 1.f, -0.5f, 0.f, 1.f, 2.f, 3.f, 4.f};
  const Ids targets(Shape{3}, {1, -100, 4});
  {  // the pool recycles buffers of this size full of NaN, the gradient's among them
    std::vector<Tensor> junk;
    for (int i = 0; i < 8; ++i) {
      junk.push_back(Tensor::empty({3, 5}));
      std::fill(junk.back().data(), junk.back().data() + 15, std::nanf(""));
    }
  }
  Tensor logits = Tensor::from({3, 5}, values).requires_grad_();
  cross_entropy(logits, targets, -100).backward();
  const std::vector<float> g = logits.grad().to_vector();
  for (int r : {0, 2}) {  // (softmax - onehot) / 2 counted rows, in double
    double z = 0;
    for (int c = 0; c < 5; ++c) z += std::exp(static_cast<double>(values[r * 5 + c]));
    for (int c = 0; c < 5; ++c) {
      const double want = (std::exp(static_cast<double>(values[r * 5 + c])) / z - (c == targets.data[r])) / 2;
      BOOST_TEST(std::fabs(g[r * 5 + c] - want) <= 1e-6);
    }
  }
  for (int c = 0; c < 5; ++c) BOOST_TEST(g[5 + c] == 0.f);
  cross_entropy(logits, targets, -100).backward();  // accumulates: exactly twice the first
  const std::vector<float> g2 = logits.grad().to_vector();
  for (size_t i = 0; i < g.size(); ++i) BOOST_TEST(g2[i] == 2 * g[i]);
}
