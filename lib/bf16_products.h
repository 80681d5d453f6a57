// Which linear products run in bf16 under Precision::Bf16 (lib/bf16.h), and oneDNN's float32
// matmul for comparing with OpenBLAS's sgemm.
//
// bf16 gains only where the faster dot product outweighs rounding the operands and oneDNN's
// call: the rule below was measured per shape with `headlab bench --products` (docs/performance.md).
// It depends on the shape alone, so a layer always makes the same choice, and a product it leaves
// in float32 is float32's bit for bit.
#pragma once
#include <cstdint>

namespace hl {

// A linear layer (x (rows, in) times W^T (in, out), and its two backward products) runs in bf16
// when both sides of its weight are at least this wide.
inline constexpr int64_t kBf16MinWidth = 128;
bool bf16_pays(int64_t rows, int64_t out, int64_t in);

// Whether this thread runs a linear product of this shape in bf16: the precision
// (matmul_precision), then the rule, unless a Bf16EveryProduct scope is open.
bool bf16_product(int64_t rows, int64_t out, int64_t in);

// Inside it, every linear product under Precision::Bf16 runs in bf16, whatever its shape: for
// tests of the bf16 path on small shapes and for measuring bf16 on any shape.
class Bf16EveryProduct {
 public:
  Bf16EveryProduct();
  ~Bf16EveryProduct();
  Bf16EveryProduct(const Bf16EveryProduct&) = delete;
  Bf16EveryProduct& operator=(const Bf16EveryProduct&) = delete;

 private:
  bool previous_;
};

// C (M, N) = op(A) op(B) + beta C as gemm_bf16 (lib/bf16.h), beta 0 or 1, with float32 operands
// through oneDNN's float32 matmul.
void gemm_onednn_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace hl
