// Bad shapes, axes and indices throw hl::Error whose message names the op and the shapes.
#define BOOST_TEST_MODULE errors
#include <boost/test/unit_test.hpp>

#include "lib/ops.h"

using namespace hl;

namespace {
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}
}  // namespace

BOOST_AUTO_TEST_CASE(matmul_inner_dimensions) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  BOOST_TEST(message_of([&] { matmul(a, b); }) == "matmul: (2,3) x (4,5): inner dimensions differ");
  BOOST_TEST(message_of([&] { matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 4})); }) ==
             "matmul: (2,2,3) x (3,3,4): batch dimensions differ");
  BOOST_TEST(message_of([&] { matmul(Tensor::zeros({3}), b); }) ==
             "matmul: (3) x (4,5): both operands need at least 2 dimensions");
}

BOOST_AUTO_TEST_CASE(broadcast_mismatch) {
  BOOST_TEST(message_of([] { add(Tensor::zeros({2, 3}), Tensor::zeros({4})); }) ==
             "add: (2,3) and (4): shapes cannot be broadcast (dimension 1: 3 vs 4)");
  BOOST_TEST(message_of([] { masked_fill(Tensor::zeros({2, 3}), Tensor::zeros({3, 3}), 0.f); }) ==
             "masked_fill: (2,3) and (3,3): shapes cannot be broadcast (dimension 0: 2 vs 3)");
  BOOST_TEST(message_of([] { masked_fill(Tensor::zeros({3}), Tensor::zeros({2, 3}), 0.f); }) ==
             "masked_fill: mask (2,3) does not broadcast to input (3)");
}

BOOST_AUTO_TEST_CASE(axes_out_of_range) {
  BOOST_TEST(message_of([] { softmax(Tensor::zeros({2, 3}), 2); }) ==
             "softmax: axis 2 out of range for a 2-d tensor");
  BOOST_TEST(message_of([] { sum(Tensor::zeros({2, 3}), {-3}); }) ==
             "sum: axis -3 out of range for a 2-d tensor");
  BOOST_TEST(message_of([] { slice(Tensor::zeros({2, 3}), 1, 2, 5); }) ==
             "slice: [2, 5) out of range for axis 1 of shape (2,3)");
  BOOST_TEST(message_of([] { permute(Tensor::zeros({2, 3}), {0, 0}); }) ==
             "permute: axis 0 repeated for shape (2,3)");
}

BOOST_AUTO_TEST_CASE(indices_out_of_range) {
  BOOST_TEST(message_of([] { embedding(Tensor::zeros({13, 4}), Ids(Shape{2}, {3, 15})); }) ==
             "embedding: index 15 out of range for vocabulary of 13");
  BOOST_TEST(message_of([] { gather_rows(Tensor::zeros({2, 3, 4}), Ids(Shape{2}, {5, 6})); }) ==
             "gather_rows: row 6 outside 0..5");
  BOOST_TEST(message_of([] { cross_entropy(Tensor::zeros({2, 5}), Ids(Shape{2}, {1, 7})); }) ==
             "cross_entropy: target 7 out of range for 5 classes");
  BOOST_TEST(message_of([] { Tensor t = Tensor::zeros({2, 3}); t.at({2, 0}); }) ==
             "at: index 2 out of range for dimension 0 of shape (2,3)");
}

BOOST_AUTO_TEST_CASE(shape_mismatches_in_nn_ops) {
  BOOST_TEST(message_of([] { linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})); }) ==
             "linear: input (2,3) and weight (4,5): input features must equal weight columns (weight is (out, in))");
  BOOST_TEST(message_of([] { layer_norm(Tensor::zeros({2, 3}), Tensor::zeros({4}), Tensor()); }) ==
             "layer_norm: weight (4) does not match input (2,3)");
  BOOST_TEST(message_of([] { reshape(Tensor::zeros({2, 3}), {4, 2}); }) ==
             "reshape: (2,3) to (4,2): element counts differ (6 vs 8)");
  BOOST_TEST(message_of([] { concat({Tensor::zeros({2, 3}), Tensor::zeros({3, 3})}, 1); }) ==
             "concat: (2,3) and (3,3) differ outside axis 1");
  BOOST_TEST(message_of([] { cross_entropy(Tensor::zeros({2, 5}), Ids(Shape{3}, {1, 1, 1})); }) ==
             "cross_entropy: logits (2,5) and targets (3): need one target per row of 5 classes (2 rows)");
}

BOOST_AUTO_TEST_CASE(autograd_misuse) {
  Tensor x = Tensor::zeros({2});
  BOOST_TEST(message_of([&] { x.backward(); }) ==
             "backward: tensor of shape (2) does not require grad (no parameter or input in its graph requires grad)");
  x.requires_grad_();
  Tensor y = mul_scalar(x, 2.f);
  BOOST_TEST(message_of([&] { y.backward(); }) == "backward: a tensor of shape (2) needs an explicit grad_output");
  BOOST_TEST(message_of([&] { y.requires_grad_(false); }) ==
             "requires_grad_: only leaf tensors can change requires_grad (op mul_scalar)");
}
