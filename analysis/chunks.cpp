#include "analysis/chunks.h"

#include <algorithm>
#include <cstdlib>
#include <omp.h>

namespace hl {

int64_t rows_per_pass(const ModelConfig& cfg, int64_t rows, int64_t T, bool with_grads) {
  rows = std::max<int64_t>(1, rows);
  int64_t per = 0;
  if (const char* forced = std::getenv("HEADLAB_TEST_ROWS_PER_PASS"); forced && *forced) {
    per = std::atoll(forced);
  } else {
    // the estimate is affine in the rows: the parameters, then a cost per row
    const double fixed = estimate_step_bytes(cfg, 0, T, with_grads);
    const double per_row = std::max(1.0, estimate_step_bytes(cfg, 1, T, with_grads) - fixed);
    per = static_cast<int64_t>(kChunkBytes / per_row);
  }
  // a row's numbers do not depend on the rows beside it only while every matrix product takes the
  // kernel the whole batch takes; the kernels switch at a few hundred rows of tokens (small_gemm_wins,
  // lib/ops_matmul.cpp), so no chunk has fewer than kChunkMinTokens / 2 tokens (row_chunks halves at worst)
  // (and the products split their rows over the threads, so each thread's share must stay that large)
  const int64_t min_tokens = kChunkMinTokens * std::max(1, omp_get_max_threads() / 2);
  const int64_t least = (min_tokens + std::max<int64_t>(1, T) - 1) / std::max<int64_t>(1, T);
  return std::clamp<int64_t>(std::max(per, least), 1, rows);
}

std::vector<std::pair<int64_t, int64_t>> row_chunks(int64_t rows, int64_t per) {
  // chunks of equal size (within a row), none a small remainder
  const int64_t n = (rows + std::max<int64_t>(1, per) - 1) / std::max<int64_t>(1, per);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t k = 0, b = 0; k < n; ++k) {
    const int64_t e = rows * (k + 1) / n;
    out.push_back({b, e});
    b = e;
  }
  return out;
}

Ids slice_rows(const Ids& ids, int64_t begin, int64_t end) {
  Shape s = ids.shape;
  const int64_t per = s.numel() / std::max<int64_t>(1, s[0]);
  s[0] = end - begin;
  return Ids(s, std::vector<int32_t>(ids.data.begin() + begin * per, ids.data.begin() + end * per));
}

double chunked_pass_bytes(const ModelConfig& cfg, int64_t rows, int64_t T, bool with_grads, double per_row_bytes) {
  const int64_t per = rows_per_pass(cfg, rows, T, with_grads);
  // beyond the loaded model: a chunk's activations (with their gradients), and with gradients the
  // parameters' too (a backward fills them as a by-product); not the weights again, nor the two
  // Adam moments estimate_step_bytes counts for training
  const double params = estimate_step_bytes(cfg, 0, T, false);
  const double acts = estimate_step_bytes(cfg, per, T, with_grads) - estimate_step_bytes(cfg, 0, T, with_grads);
  return acts + (with_grads ? params : 0.0) + static_cast<double>(rows) * (per_row_bytes + 8.0 * static_cast<double>(T));
}

}  // namespace hl
