// The differentiable ops. Each op is one function (in lib/ops_*.cpp) that computes the
// forward, saves what backward needs and attaches the backward right beside it.
//
// HEADLAB_OPS is the op list. tests/test_gradcheck.cpp holds one gradcheck case per entry
// and fails when an entry has none, so an op cannot be added without its gradient test.
#pragma once
#include <functional>
#include <span>
#include <vector>

#include "activations.h"
#include "tensor.h"

namespace hl {

#define HEADLAB_OPS(X)                                                                 \
  X(add) X(sub) X(mul) X(div) X(neg) X(add_scalar) X(mul_scalar) X(pow)                 \
  X(exp) X(log) X(sqrt) X(tanh) X(sigmoid) X(relu) X(gelu_tanh) X(gelu_erf)             \
  X(relu2) X(silu) X(gated_act) X(rms_norm)                                             \
  X(matmul) X(linear) X(linear_stacked) X(linear_act) X(sum) X(mean) X(max)                                             \
  X(softmax) X(log_softmax) X(masked_fill) X(cross_entropy) X(layer_norm)               \
  X(embedding) X(gather_rows) X(dropout) X(reshape) X(permute) X(transpose) X(slice) X(concat) X(split) X(tap)

// Integer indices (token ids, targets): no gradient, so a plain array with a shape.
struct Ids {
  Shape shape;
  std::vector<int32_t> data;
  Ids() = default;
  Ids(const Shape& s, std::vector<int32_t> v);
  explicit Ids(const Shape& s) : shape(s), data(static_cast<size_t>(s.numel()), 0) {}
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  int32_t& at(int64_t i, int64_t j) { return data[static_cast<size_t>(i * shape.back() + j)]; }
  int32_t at(int64_t i, int64_t j) const { return data[static_cast<size_t>(i * shape.back() + j)]; }
};

// ---- elementwise, NumPy broadcasting; gradients summed back to each input's shape ----------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor add_scalar(const Tensor& x, float s);
Tensor mul_scalar(const Tensor& x, float s);
Tensor pow(const Tensor& x, float exponent);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu_tanh(const Tensor& x);  // 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))
Tensor gelu_erf(const Tensor& x);   // 0.5x(1+erf(x/sqrt(2)))
Tensor relu2(const Tensor& x);      // relu(x)^2
Tensor silu(const Tensor& x);       // x sigmoid(x)
// act(gate) * up, elementwise, same shapes: the gated MLP's (SwiGLU, GeGLU) fused middle.
Tensor gated_act(const Tensor& gate, const Tensor& up, Activation act);

// ---- matrix products (cblas_sgemm; transposes are BLAS flags, never copies) ------------------
// a (M,K) x b (K,N) -> (M,N); batched: a (...,M,K) x b (...,K,N) with equal leading dims;
// a (...,M,K) x b (K,N) folds the leading dims of a into M.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x (..., in), weight (out, in) [PyTorch layout], bias (out) or undefined -> (..., out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// Several linears of one input, outputs side by side: x (..., in), weights (out_i, in),
// biases (out_i) or undefined -> (..., sum out_i). One sgemm when the weights are back to back
// in one storage (storage_view), e.g. W_Q, W_K, W_V of self-attention. Recorded as "linear".
constexpr int kMaxStacked = 3;
Tensor linear_stacked(const Tensor& x, std::span<const Tensor> weights, std::span<const Tensor> biases);
// act(linear(x, weight, bias)) in one pass over the output (the FFN's first layer).
Tensor linear_act(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act);

// ---- reductions (axes empty = all axes) --------------------------------------------------------
Tensor sum(const Tensor& x, std::vector<int> axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int> axes = {}, bool keepdim = false);
Tensor max(const Tensor& x, std::vector<int> axes = {}, bool keepdim = false);  // grad to first argmax

// ---- neural-net ops ------------------------------------------------------------------------
// Stable on any axis; a row that is entirely -inf gives zeros (softmax) and no NaN in backward.
Tensor softmax(const Tensor& x, int axis = -1);
Tensor log_softmax(const Tensor& x, int axis = -1);
// Where mask (broadcast to x) is non-zero, the output is `value` and the gradient 0.
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);
// logits (..., C), targets with logits.numel()/C entries; mean over targets != ignore_index.
// Fused log-softmax + NLL. No counted target gives loss 0 and zero gradient.
Tensor cross_entropy(const Tensor& logits, const Ids& targets, int ignore_index = -1);
// Over the last axis; weight and bias (D) may be undefined. Saves mean and rstd.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
// RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight, or * (1 + weight) with
// one_plus (Gemma's form); weight (D). Saves the reciprocal rms per row.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, bool one_plus = false);
// weight (V, D), ids (...) -> (..., D). Backward scatter-adds (repeated ids accumulate).
Tensor embedding(const Tensor& weight, const Ids& ids);
// x viewed as rows of its last axis (R, D) -> (n, D): rows[i] for each i, in order. Backward
// adds each row's gradient back (a repeated row accumulates).
Tensor gather_rows(const Tensor& x, const Ids& rows);
// Inverted dropout with a mask drawn from rng; the identity when !training or p == 0.
Tensor dropout(const Tensor& x, float p, Rng& rng, bool training);

// ---- shape ops -------------------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 allowed; shares storage
Tensor permute(const Tensor& x, const std::vector<int>& perm);
Tensor transpose(const Tensor& x, int axis0, int axis1);
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t end);  // [start, end)
Tensor concat(const std::vector<Tensor>& xs, int axis);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int axis);
// The identity (a view of x's storage) whose backward first hands the incoming gradient to
// on_grad: how backward hooks see dL/d(activation) at a named hook point.
Tensor tap(const Tensor& x, std::function<void(const Tensor& grad)> on_grad);

// ---- operators ---------------------------------------------------------------------------------
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& x, float s) { return add_scalar(x, s); }
inline Tensor operator-(const Tensor& x, float s) { return add_scalar(x, -s); }
inline Tensor operator*(const Tensor& x, float s) { return mul_scalar(x, s); }
inline Tensor operator/(const Tensor& x, float s) { return mul_scalar(x, 1.f / s); }
inline Tensor operator*(float s, const Tensor& x) { return mul_scalar(x, s); }

// ---- helpers shared by ops (not differentiable) ------------------------------------------------
// Row-major sgemm: C = alpha op(A) op(B) + beta C, op(A) (M,K), op(B) (K,N).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

}  // namespace hl
