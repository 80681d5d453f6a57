// bfloat16 mixed precision: the precision of the linear layers' products, which shapes run in
// bf16, the CPU check, the float32 -> bf16 conversion and a bf16 x bf16 -> float32 product through
// oneDNN.
//
// Mixed precision as on accelerators: only the operands of the products are rounded to bf16
// (8 significant bits); the products accumulate in float32 and everything else (weights,
// gradients, optimizer state, norms, softmax, loss, the residual stream) stays float32.
// Like torch.autocast, the precision is a setting of the calling thread (PrecisionScope), read
// by the ops when they run; a backward uses the precision its forward ran in.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace hl {

enum class Precision { Float32, Bf16 };

std::string_view precision_name(Precision p);                 // "float32" | "bf16"
Precision parse_precision(std::string_view s, std::string_view what);  // fails naming `what`

// What a study run in bf16 says beside its results (both doors, the same words).
inline constexpr const char* kBf16ResultsNote =
    "precision bf16: results are approximate (the linear layers' products round their operands to bf16, "
    "8 significant bits, and accumulate in float32)";

// This thread's precision for the linear layers' products (Float32 unless a scope sets it).
Precision matmul_precision();

// Sets this thread's precision until destroyed (then restores the previous one). Bf16 first
// checks the CPU (require_bf16_cpu).
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision previous_;
};

// ---- Which linear products run in bf16 under Precision::Bf16 ---------------------------------
// bf16 gains only where the faster dot product outweighs rounding the operands and oneDNN's call:
// the rule was measured per shape with `headlab bench --products` (docs/performance.md). It
// depends on the shape alone, so a layer always makes the same choice, and a product it leaves in
// float32 is float32's bit for bit.

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

// Empty if this CPU has a native bf16 dot product (AVX512_BF16's vdpbf16ps, or AMX), as oneDNN
// detects it at run time (DNNL_MAX_CPU_ISA lowers it); else the reason, naming the instruction.
// Emulated bf16 is slower than float32, so bf16 is refused rather than emulated.
std::string bf16_unsupported_reason();
void require_bf16_cpu();  // fails with that reason

// Round to nearest even, as vcvtne2ps2bf16 does (NaN stays NaN). The scalar definition.
uint16_t to_bf16(float x);
inline float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// dst[i] = to_bf16(src[i]) for n values, vectorised (vcvtne2ps2bf16) and split over threads.
void convert_to_bf16(const float* src, uint16_t* dst, int64_t n);

// C (M, N) = op(A) op(B) + bias + beta C, beta 0 or 1, with bf16 operands and float32
// accumulation: A is (M, K) at stride lda, or (K, M) when trans_a; B is (K, N) at stride ldb, or
// (N, K) when trans_b; all row-major; bias (N) float32, added to every row, or null. One oneDNN
// matmul primitive per shape, created once and kept.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr);

// C (M, N) = op(A) op(B) + beta C as gemm_bf16, beta 0 or 1, with float32 operands through
// oneDNN's float32 matmul (for comparing with OpenBLAS's sgemm: `headlab bench --products`).
void gemm_onednn_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace hl
