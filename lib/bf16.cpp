// bf16 products through oneDNN (Debian's libdnnl-dev): OpenBLAS 0.3.21 has no sbgemm, and
// oneDNN's brgemm kernels run vdpbf16ps (AVX512_BF16) or AMX tiles, whichever the CPU has.
#include "bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "core.h"
#include "parallel.h"

namespace hl {

namespace {
thread_local Precision current_precision = Precision::Float32;
thread_local bool every_product = false;  // Bf16EveryProduct
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

bool bf16_pays(int64_t /*rows*/, int64_t out, int64_t in) { return std::min(out, in) >= kBf16MinWidth; }

bool bf16_product(int64_t rows, int64_t out, int64_t in) {
  if (current_precision != Precision::Bf16) return false;
  return every_product || bf16_pays(rows, out, in);
}

Bf16EveryProduct::Bf16EveryProduct() : previous_(every_product) { every_product = true; }
Bf16EveryProduct::~Bf16EveryProduct() { every_product = previous_; }

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

// (trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, operands bf16 (else float32), bias)
using MatmulKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool>;

// One shape's product, ready to run: the primitive and its memory objects, whose data handles
// are set per call. The scratchpad is ours (scratchpad_mode::user): in library mode oneDNN
// makes a scratchpad object on every execute, and a training step runs a few hundred products.
struct OnednnMatmul {
  dnnl::matmul prim;
  dnnl::memory a, b, c, bias, scratch;
  size_t scratch_bytes = 0;
};

// Created on first use and kept, per thread (the memory objects hold one call's pointers; a
// training run meets a few dozen shapes).
OnednnMatmul& matmul_for(const MatmulKey& key) {
  thread_local std::map<MatmulKey, OnednnMatmul> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto [ta, tb, M, N, K, lda, ldb, ldc, accumulate, bf16, has_bias] = key;
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  const dt in = bf16 ? dt::bf16 : dt::f32;
  const md a({M, K}, in, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const md b({K, N}, in, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const md c({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
  const md bias = has_bias ? md({1, N}, dt::f32, dnnl::memory::dims{N, 1}) : md();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {  // C += A B: oneDNN's sum post-op reads C before writing it
    dnnl::post_ops ops;
    ops.append_sum(1.f);
    attr.set_post_ops(ops);
  }
  dnnl::engine& engine = cpu_engine();
  const dnnl::matmul::primitive_desc pd(has_bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c),
                                        attr, engine);
  OnednnMatmul m;
  m.prim = dnnl::matmul(pd);
  m.a = dnnl::memory(a, engine, DNNL_MEMORY_NONE);
  m.b = dnnl::memory(b, engine, DNNL_MEMORY_NONE);
  m.c = dnnl::memory(c, engine, DNNL_MEMORY_NONE);
  if (has_bias) m.bias = dnnl::memory(bias, engine, DNNL_MEMORY_NONE);
  m.scratch = dnnl::memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
  m.scratch_bytes = pd.scratchpad_desc().get_size();
  return cache.emplace(key, std::move(m)).first->second;
}

// This thread's scratchpad, grown to the largest a product has asked for.
void* scratchpad(size_t bytes) {
  thread_local std::vector<std::byte> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.empty() ? nullptr : buf.data();
}

void check(dnnl_status_t s, const char* what) { HL_CHECK(s == dnnl_success, "oneDNN ", what, " failed: status ", static_cast<int>(s)); }
}  // namespace

namespace {
void run_matmul(bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                const void* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  HL_CHECK(beta == 0.f || beta == 1.f, "oneDNN matmul: beta must be 0 or 1, got ", beta);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = (beta == 0.f ? 0.f : C[i * ldc + j]) + (bias ? bias[j] : 0.f);
    return;
  }
  OnednnMatmul& m = matmul_for({trans_a, trans_b, M, N, K, lda, ldb, ldc, beta == 1.f, bf16, bias != nullptr});
  // The C API with the arguments on the stack: the C++ execute() builds an unordered_map per call.
  check(dnnl_memory_set_data_handle(m.a.get(), const_cast<void*>(A)), "set_data_handle");
  check(dnnl_memory_set_data_handle(m.b.get(), const_cast<void*>(B)), "set_data_handle");
  check(dnnl_memory_set_data_handle(m.c.get(), C), "set_data_handle");
  check(dnnl_memory_set_data_handle(m.scratch.get(), scratchpad(m.scratch_bytes)), "set_data_handle");
  if (bias) check(dnnl_memory_set_data_handle(m.bias.get(), const_cast<float*>(bias)), "set_data_handle");
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, m.a.get()},
                                  {DNNL_ARG_WEIGHTS, m.b.get()},
                                  {DNNL_ARG_DST, m.c.get()},
                                  {DNNL_ARG_SCRATCHPAD, m.scratch.get()},
                                  {DNNL_ARG_BIAS, bias ? m.bias.get() : nullptr}};
  thread_local dnnl::stream stream(cpu_engine());
  check(dnnl_primitive_execute(m.prim.get(), stream.get(), bias ? 5 : 4, args), "matmul");
  check(dnnl_stream_wait(stream.get()), "stream wait");
}
}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  run_matmul(true, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
}

void gemm_onednn_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  run_matmul(false, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, nullptr);
}

}  // namespace hl
