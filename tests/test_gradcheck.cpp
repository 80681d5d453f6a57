// Gradchecks for every op in HEADLAB_OPS: non-square shapes, broadcasting, transposed
// operands, and a random upstream gradient (inside hl::gradcheck).
#define BOOST_TEST_MODULE gradcheck
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <limits>

#include "lib/autograd.h"
#include "lib/gradcheck.h"
#include "lib/ops.h"

using namespace hl;

namespace {

struct OpCase {
  std::string what;
  std::vector<Tensor> inputs;
  GradFn fn;
};

Rng& rng() {
  static Rng r(2024);
  return r;
}
Tensor rnd(const Shape& s) { return Tensor::randn(s, rng()).requires_grad_(); }
// Positive values in [0.5, 2): for log, sqrt, pow, divisors.
Tensor pos(const Shape& s) { return Tensor::uniform(s, rng(), 0.5f, 2.f).requires_grad_(); }
// Values at least 0.1 away from 0: no kink of relu within the finite-difference step.
Tensor away_from_zero(const Shape& s) {
  Tensor t = Tensor::randn(s, rng());
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] += t.data()[i] >= 0 ? 0.1f : -0.1f;
  return t.requires_grad_();
}
// Distinct values (spacing 0.1, shuffled): max has a unique, stable argmax.
Tensor distinct(const Shape& s) {
  Tensor t = Tensor::empty(s);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) t.data()[i] = 0.1f * static_cast<float>((i * 7) % n) - 0.05f * n;
  return t.requires_grad_();
}

#define IN(i) in[i]
std::vector<OpCase> cases_for(const std::string& op) {
  std::vector<OpCase> c;
  auto add_case = [&](std::string what, std::vector<Tensor> inputs, GradFn fn) {
    c.push_back({std::move(what), std::move(inputs), std::move(fn)});
  };
  using V = const std::vector<Tensor>&;
  if (op == "add") {
    add_case("same shape", {rnd({3, 4}), rnd({3, 4})}, [](V in) { return add(IN(0), IN(1)); });
    add_case("both broadcast", {rnd({2, 1, 4}), rnd({3, 1})}, [](V in) { return add(IN(0), IN(1)); });
    add_case("trailing bias", {rnd({2, 3, 4}), rnd({4})}, [](V in) { return add(IN(0), IN(1)); });
  } else if (op == "sub") {
    add_case("same shape", {rnd({3, 4}), rnd({3, 4})}, [](V in) { return sub(IN(0), IN(1)); });
    add_case("broadcast", {rnd({2, 3, 4}), rnd({3, 1})}, [](V in) { return sub(IN(0), IN(1)); });
  } else if (op == "mul") {
    add_case("same shape", {rnd({3, 4}), rnd({3, 4})}, [](V in) { return mul(IN(0), IN(1)); });
    add_case("broadcast", {rnd({2, 3, 4}), rnd({1, 3, 1})}, [](V in) { return mul(IN(0), IN(1)); });
    add_case("x*x", {rnd({5, 2})}, [](V in) { return mul(IN(0), IN(0)); });
  } else if (op == "div") {
    add_case("same shape", {rnd({3, 4}), pos({3, 4})}, [](V in) { return div(IN(0), IN(1)); });
    add_case("broadcast", {rnd({2, 3}), pos({3})}, [](V in) { return div(IN(0), IN(1)); });
  } else if (op == "neg") {
    add_case("(3,5)", {rnd({3, 5})}, [](V in) { return neg(IN(0)); });
  } else if (op == "add_scalar") {
    add_case("(3,5)", {rnd({3, 5})}, [](V in) { return add_scalar(IN(0), 1.5f); });
  } else if (op == "mul_scalar") {
    add_case("(3,5)", {rnd({3, 5})}, [](V in) { return mul_scalar(IN(0), -2.5f); });
  } else if (op == "pow") {
    add_case("^2.5", {pos({3, 4})}, [](V in) { return pow(IN(0), 2.5f); });
    add_case("^-1", {pos({4, 3})}, [](V in) { return pow(IN(0), -1.f); });
  } else if (op == "exp") {
    add_case("(4,5)", {rnd({4, 5})}, [](V in) { return exp(IN(0)); });
  } else if (op == "log") {
    add_case("(4,5)", {pos({4, 5})}, [](V in) { return log(IN(0)); });
  } else if (op == "sqrt") {
    add_case("(4,5)", {pos({4, 5})}, [](V in) { return sqrt(IN(0)); });
  } else if (op == "tanh") {
    add_case("(4,5)", {rnd({4, 5})}, [](V in) { return tanh(IN(0)); });
  } else if (op == "sigmoid") {
    add_case("(4,5)", {rnd({4, 5})}, [](V in) { return sigmoid(IN(0)); });
  } else if (op == "relu") {
    add_case("(4,5)", {away_from_zero({4, 5})}, [](V in) { return relu(IN(0)); });
  } else if (op == "gelu_tanh") {
    add_case("(4,5)", {rnd({4, 5})}, [](V in) { return gelu_tanh(IN(0)); });
  } else if (op == "gelu_erf") {
    add_case("(4,5)", {rnd({4, 5})}, [](V in) { return gelu_erf(IN(0)); });
  } else if (op == "matmul") {
    add_case("(3,4)x(4,5)", {rnd({3, 4}), rnd({4, 5})}, [](V in) { return matmul(IN(0), IN(1)); });
    add_case("(4,3)^T x (4,5)", {rnd({4, 3}), rnd({4, 5})}, [](V in) { return matmul(IN(0), IN(1), true, false); });
    add_case("(3,4) x (5,4)^T", {rnd({3, 4}), rnd({5, 4})}, [](V in) { return matmul(IN(0), IN(1), false, true); });
    add_case("(4,3)^T x (5,4)^T", {rnd({4, 3}), rnd({5, 4})}, [](V in) { return matmul(IN(0), IN(1), true, true); });
    add_case("batched", {rnd({2, 3, 4}), rnd({2, 4, 5})}, [](V in) { return matmul(IN(0), IN(1)); });
    add_case("batched ^T ^T", {rnd({2, 4, 3}), rnd({2, 5, 4})}, [](V in) { return matmul(IN(0), IN(1), true, true); });
    add_case("folded (2,3,4)x(4,5)", {rnd({2, 3, 4}), rnd({4, 5})}, [](V in) { return matmul(IN(0), IN(1)); });
    add_case("shared a (3,4)x(2,4,5)", {rnd({3, 4}), rnd({2, 4, 5})}, [](V in) { return matmul(IN(0), IN(1)); });
  } else if (op == "linear") {
    add_case("bias", {rnd({2, 3, 4}), rnd({5, 4}), rnd({5})}, [](V in) { return linear(IN(0), IN(1), IN(2)); });
    add_case("no bias", {rnd({3, 4}), rnd({2, 4})}, [](V in) { return linear(IN(0), IN(1)); });
  } else if (op == "linear_act") {
    add_case("gelu_erf", {rnd({2, 3, 4}), rnd({5, 4}), rnd({5})},
             [](V in) { return linear_act(IN(0), IN(1), IN(2), Activation::GeluErf); });
    add_case("gelu_tanh no bias", {rnd({3, 4}), rnd({6, 4})},
             [](V in) { return linear_act(IN(0), IN(1), Tensor(), Activation::GeluTanh); });
    // relu: x W^T + b kept >= 0.1 from the kink (W = I, b = 0 pass away_from_zero values through)
    Tensor eye = Tensor::zeros({4, 4});
    for (int i = 0; i < 4; ++i) eye.at({i, i}) = 1.f;
    add_case("relu", {away_from_zero({3, 4})}, [eye](V in) {
      return linear_act(IN(0), eye, Tensor::zeros({4}), Activation::Relu);
    });
    add_case("relu2", {away_from_zero({3, 4})}, [eye](V in) {
      return linear_act(IN(0), eye, Tensor::zeros({4}), Activation::Relu2);
    });
    add_case("silu", {rnd({2, 3, 4}), rnd({5, 4}), rnd({5})},
             [](V in) { return linear_act(IN(0), IN(1), IN(2), Activation::Silu); });
  } else if (op == "linear_stacked") {
    // weights back to back in one slab (one sgemm per product) and separate ones (one each)
    Tensor slab = Tensor::randn({(2 + 3 + 2) * 4}, rng());
    Tensor w0 = storage_view(slab, 0, {2, 4}).requires_grad_(), w1 = storage_view(slab, 8, {3, 4}).requires_grad_(),
           w2 = storage_view(slab, 20, {2, 4}).requires_grad_();
    add_case("slab, one bias missing", {rnd({2, 3, 4}), w0, w1, w2, rnd({2}), rnd({2})}, [](V in) {
      const Tensor ws[3] = {IN(1), IN(2), IN(3)}, bs[3] = {IN(4), Tensor(), IN(5)};
      return linear_stacked(IN(0), ws, bs);
    });
    add_case("separate weights", {rnd({5, 4}), rnd({3, 4}), rnd({2, 4}), rnd({3})}, [](V in) {
      const Tensor ws[2] = {IN(1), IN(2)}, bs[2] = {IN(3), Tensor()};
      return linear_stacked(IN(0), ws, bs);
    });
  } else if (op == "sum") {
    add_case("axis 1", {rnd({2, 3, 4})}, [](V in) { return sum(IN(0), {1}); });
    add_case("axes 0,2 keepdim", {rnd({2, 3, 4})}, [](V in) { return sum(IN(0), {0, 2}, true); });
    add_case("all", {rnd({3, 2})}, [](V in) { return sum(IN(0)); });
  } else if (op == "mean") {
    add_case("axis -1", {rnd({2, 3, 4})}, [](V in) { return mean(IN(0), {-1}); });
    add_case("all", {rnd({3, 5})}, [](V in) { return mean(IN(0)); });
  } else if (op == "max") {
    add_case("axis 1", {distinct({3, 5})}, [](V in) { return max(IN(0), {1}); });
    add_case("axes 0,2", {distinct({2, 3, 4})}, [](V in) { return max(IN(0), {0, 2}, true); });
  } else if (op == "softmax") {
    add_case("last axis", {rnd({3, 5})}, [](V in) { return softmax(IN(0), -1); });
    add_case("middle axis", {rnd({2, 4, 3})}, [](V in) { return softmax(IN(0), 1); });
  } else if (op == "log_softmax") {
    add_case("last axis", {rnd({3, 5})}, [](V in) { return log_softmax(IN(0), -1); });
    add_case("first axis", {rnd({4, 3})}, [](V in) { return log_softmax(IN(0), 0); });
  } else if (op == "masked_fill") {
    Tensor m = Tensor::from({3, 4}, {0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0});
    add_case("broadcast mask", {rnd({2, 3, 4})}, [m](V in) { return masked_fill(IN(0), m, -3.f); });
    Tensor m2 = Tensor::from({2, 1, 4}, {1, 0, 0, 0, 0, 0, 1, 1});
    add_case("then softmax", {rnd({2, 3, 4})}, [m2](V in) {
      return softmax(masked_fill(IN(0), m2, -std::numeric_limits<float>::infinity()), -1);
    });
  } else if (op == "cross_entropy") {
    Ids t(Shape{6}, {0, 4, -1, 2, 2, 1});
    add_case("ignore index", {rnd({6, 5})}, [t](V in) { return cross_entropy(IN(0), t, -1); });
    Ids t3(Shape{2, 3}, {1, 0, 4, 3, 3, -100});
    add_case("(2,3,5)", {rnd({2, 3, 5})}, [t3](V in) { return cross_entropy(IN(0), t3, -100); });
  } else if (op == "layer_norm") {
    add_case("affine", {rnd({3, 6}), rnd({6}), rnd({6})}, [](V in) { return layer_norm(IN(0), IN(1), IN(2)); });
    add_case("no bias (2,3,8)", {rnd({2, 3, 8}), rnd({8})}, [](V in) { return layer_norm(IN(0), IN(1), Tensor()); });
  } else if (op == "rms_norm") {
    add_case("(3,6)", {rnd({3, 6}), rnd({6})}, [](V in) { return rms_norm(IN(0), IN(1), 1e-5f); });
    add_case("1 + w, (2,3,8)", {rnd({2, 3, 8}), rnd({8})}, [](V in) { return rms_norm(IN(0), IN(1), 1e-6f, true); });
  } else if (op == "relu2") {
    add_case("(3,5) away from 0", {away_from_zero({3, 5})}, [](V in) { return relu2(IN(0)); });
  } else if (op == "silu") {
    add_case("(4,3)", {rnd({4, 3})}, [](V in) { return silu(IN(0)); });
  } else if (op == "gated_act") {
    add_case("silu (2,3,5)", {rnd({2, 3, 5}), rnd({2, 3, 5})}, [](V in) { return gated_act(IN(0), IN(1), Activation::Silu); });
    add_case("gelu_tanh (3,4)", {rnd({3, 4}), rnd({3, 4})}, [](V in) { return gated_act(IN(0), IN(1), Activation::GeluTanh); });
    add_case("gelu_erf (4,3)", {rnd({4, 3}), rnd({4, 3})}, [](V in) { return gated_act(IN(0), IN(1), Activation::GeluErf); });
    add_case("relu2 (3,4)", {away_from_zero({3, 4}), rnd({3, 4})}, [](V in) { return gated_act(IN(0), IN(1), Activation::Relu2); });
  } else if (op == "embedding") {
    Ids ids(Shape{2, 3}, {1, 4, 1, 0, 6, 1});
    add_case("repeats", {rnd({7, 4})}, [ids](V in) { return embedding(IN(0), ids); });
  } else if (op == "gather_rows") {
    Ids rows(Shape{4}, {5, 0, 5, 2});  // a repeated row accumulates
    add_case("(2,3,4) rows 5,0,5,2", {rnd({2, 3, 4})}, [rows](V in) { return gather_rows(IN(0), rows); });
  } else if (op == "dropout") {
    add_case("p=0.3", {rnd({4, 6})}, [](V in) {
      Rng r(9);  // same mask on every evaluation
      return dropout(IN(0), 0.3f, r, true);
    });
  } else if (op == "reshape") {
    add_case("(2,3,4)->(6,-1)", {rnd({2, 3, 4})}, [](V in) { return reshape(IN(0), {6, -1}); });
  } else if (op == "tap") {
    add_case("(2,3) with a callback", {rnd({2, 3})}, [](V in) { return tap(IN(0), [](const Tensor&) {}); });
  } else if (op == "permute") {
    add_case("(2,3,4) by 2,0,1", {rnd({2, 3, 4})}, [](V in) { return permute(IN(0), {2, 0, 1}); });
  } else if (op == "transpose") {
    add_case("axes 0,2", {rnd({2, 3, 4})}, [](V in) { return transpose(IN(0), 0, 2); });
  } else if (op == "slice") {
    add_case("axis 1 [1,4)", {rnd({3, 5, 2})}, [](V in) { return slice(IN(0), 1, 1, 4); });
  } else if (op == "concat") {
    add_case("axis 1", {rnd({2, 3}), rnd({2, 1}), rnd({2, 4})}, [](V in) { return concat({IN(0), IN(1), IN(2)}, 1); });
    add_case("6 inputs axis 0", {rnd({1, 3}), rnd({2, 3}), rnd({1, 3}), rnd({1, 3}), rnd({3, 3}), rnd({1, 3})},
             [](V in) { return concat(in, 0); });
  } else if (op == "split") {
    add_case("sizes 1,2,3", {rnd({2, 6})}, [](V in) {
      auto p = split(IN(0), {1, 2, 3}, 1);
      return concat({p[2], mul_scalar(p[0], 3.f)}, 1);  // p[1] unused: its gradient is 0
    });
  }
  return c;
}

const std::vector<std::string>& op_names() {
#define HL_NAME(op) #op,
  static const std::vector<std::string> names = {HEADLAB_OPS(HL_NAME)};
#undef HL_NAME
  return names;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_op_in_the_list_has_a_gradcheck) {
  for (const std::string& op : op_names()) {
    BOOST_TEST_CONTEXT("op " << op) { BOOST_TEST(!cases_for(op).empty()); }
  }
}

BOOST_AUTO_TEST_CASE(every_op_passes_gradcheck) {
  for (const std::string& op : op_names())
    for (OpCase& oc : cases_for(op)) {
      GradcheckResult r = gradcheck(oc.fn, oc.inputs);
      BOOST_TEST_CONTEXT("op " << op << " case " << oc.what) {
        BOOST_TEST(r.ok, r.message);
        BOOST_TEST(r.checked > 0);
      }
    }
}

// The checker itself must fail on wrong gradients: a wrong sign, a missing factor of 2.
BOOST_AUTO_TEST_CASE(gradcheck_catches_wrong_backward) {
  auto square_with_bad_grad = [](const Tensor& x, float factor) {
    Tensor y = Tensor::empty(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) y.data()[i] = x.data()[i] * x.data()[i];
    if (needs_graph({&x}))
      attach(y, "bad_square", {x}, [x, factor](TensorImpl& self) {
        float* gx = grad_buffer(x);
        for (int64_t i = 0; i < x.numel(); ++i) gx[i] += factor * x.data()[i] * self.grad->data()[i];
      });
    return y;
  };
  Tensor x = rnd({3, 4});
  BOOST_TEST(gradcheck([&](const std::vector<Tensor>& in) { return square_with_bad_grad(in[0], 2.f); }, {x}).ok);
  BOOST_TEST(!gradcheck([&](const std::vector<Tensor>& in) { return square_with_bad_grad(in[0], 1.f); }, {x}).ok);
  BOOST_TEST(!gradcheck([&](const std::vector<Tensor>& in) { return square_with_bad_grad(in[0], -2.f); }, {x}).ok);
  // transposed operand: using x^T's gradient layout for a non-square input is caught too
  Tensor a = rnd({2, 3}), b = rnd({3, 4});
  auto wrong_matmul = [](const std::vector<Tensor>& in) {
    Tensor y = matmul(in[0].detach(), in[1].detach());
    Tensor a = in[0], b = in[1];
    attach(y, "bad_matmul", {a, b}, [a, b](TensorImpl& self) {
      // correct: dA = dC B^T. Wrong: treat dA as (B dC^T)^T computed with swapped roles.
      float* ga = grad_buffer(a);
      gemm(false, true, 2, 3, 4, 1.f, self.grad->data(), 4, b.data(), 4, 1.f, ga, 3);
      float* gb = grad_buffer(b);
      gemm(true, false, 3, 4, 2, -1.f, a.data(), 3, self.grad->data(), 4, 1.f, gb, 4);  // sign flipped
    });
    return y;
  };
  BOOST_TEST(!gradcheck(wrong_matmul, {a, b}).ok);
}
