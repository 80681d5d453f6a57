// bf16 products through oneDNN (Debian's libdnnl-dev): OpenBLAS 0.3.21 has no sbgemm, and
// oneDNN's brgemm kernels run vdpbf16ps (AVX512_BF16) or AMX tiles, whichever the CPU has.
#include "bf16.h"

#include <immintrin.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core.h"
#include "parallel.h"

namespace hl {

namespace {
thread_local Precision current_precision = Precision::Float32;
}

std::string_view precision_name(Precision p) { return p == Precision::Bf16 ? "bf16" : "float32"; }

Precision parse_precision(std::string_view s, std::string_view what) {
  if (s == "float32") return Precision::Float32;
  if (s == "bf16") return Precision::Bf16;
  fail(what, ": '", s, "' is not a precision (float32 or bf16)");
}

Precision matmul_precision() { return current_precision; }

PrecisionScope::PrecisionScope(Precision p) : previous_(current_precision) {
  if (p == Precision::Bf16) require_bf16_cpu();
  current_precision = p;
}
PrecisionScope::~PrecisionScope() { current_precision = previous_; }

std::string bf16_unsupported_reason() {
  static const std::string reason = [] {
    const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    if ((isa & bf16) == bf16) return std::string();
    return std::string("precision bf16 needs the CPU's AVX512_BF16 instructions (vdpbf16ps, vcvtne2ps2bf16), "
                       "which this CPU lacks (oneDNN finds ") +
           (isa >= static_cast<unsigned>(dnnl::cpu_isa::avx512_core) ? "avx512_core" : "no AVX-512") +
           "); emulated bf16 is slower than float32: use precision float32";
  }();
  return reason;
}

void require_bf16_cpu() {
  const std::string reason = bf16_unsupported_reason();
  if (!reason.empty()) throw Error(reason);
}

uint16_t to_bf16(float x) {
  uint32_t bits;
  __builtin_memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round half to even
  return static_cast<uint16_t>(bits >> 16);
}

namespace {
// Built for AVX512_BF16 whatever the compile flags: only reached after require_bf16_cpu.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void convert_range(const float* src, uint16_t* dst,
                                                                                  int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, reinterpret_cast<const __m512i&>(h));
  }
  for (; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<const __m256i&>(h));
  }
}
}  // namespace

void convert_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  require_bf16_cpu();
  parallel_ranges(n, n, [src, dst](int64_t lo, int64_t hi) { convert_range(src + lo, dst + lo, hi - lo); });
}

namespace {
dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

using MatmulKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

// The primitive for one shape, strides and beta: created on first use and kept (a training run
// meets a few dozen shapes).
const dnnl::matmul& matmul_for(const MatmulKey& key) {
  static std::mutex mutex;
  static std::map<MatmulKey, dnnl::matmul> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto [ta, tb, M, N, K, lda, ldb, ldc, accumulate] = key;
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  const md a({M, K}, dt::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const md b({K, N}, dt::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const md c({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (accumulate) {  // C += A B: oneDNN's sum post-op reads C before writing it
    dnnl::post_ops ops;
    ops.append_sum(1.f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return cache.emplace(key, dnnl::matmul(pd)).first->second;
}
}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  HL_CHECK(beta == 0.f || beta == 1.f, "gemm_bf16: beta must be 0 or 1, got ", beta);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum
    if (beta == 0.f)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return;
  }
  const MatmulKey key{trans_a, trans_b, M, N, K, lda, ldb, ldc, beta == 1.f};
  const dnnl::matmul& prim = matmul_for(key);
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  dnnl::engine& engine = cpu_engine();
  const dnnl::memory a(md({M, K}, dt::bf16, trans_a ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1}),
                       engine, const_cast<uint16_t*>(A));
  const dnnl::memory b(md({K, N}, dt::bf16, trans_b ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1}),
                       engine, const_cast<uint16_t*>(B));
  const dnnl::memory c(md({M, N}, dt::f32, dnnl::memory::dims{ldc, 1}), engine, C);
  dnnl::stream stream(engine);
  prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  stream.wait();
}

}  // namespace hl
