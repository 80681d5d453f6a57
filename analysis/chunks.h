// Batched passes in chunks of rows. An analysis that runs the model over every example runs it
// over chunks of rows instead, so its memory is bounded by one chunk's, not --examples, and a stop
// request is answered between chunks (throw_if_stopped), not after a pass over every example.
// A row's numbers in a forward pass do not depend on the other rows of its batch as long as each
// matrix product takes the same kernel (rows_per_pass keeps chunks large enough for that), and
// results summed over rows carry their running sum from chunk to chunk in row order, so a chunked
// analysis gives, bit for bit, what one batch of every row gives.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "lib/ops.h"
#include "models/transformer.h"

namespace hl {

// The activation memory one chunk's pass may take (an estimate_step_bytes figure).
inline constexpr double kChunkBytes = 64.0 * 1024 * 1024;
// The fewest tokens a chunk's rows hold (rows_per_pass keeps every chunk at half of it or more).
inline constexpr int64_t kChunkMinTokens = 2048;

// Rows of T tokens per chunk: as many as estimate_step_bytes(cfg, rows, T, with_grads) keeps within
// kChunkBytes beyond the parameters, at least kChunkMinTokens tokens' worth for every two threads,
// at most `rows`. HEADLAB_TEST_ROWS_PER_PASS=N (tests only) replaces the budget's count (the least
// still holds), to compare chunkings with one batch.
int64_t rows_per_pass(const ModelConfig& cfg, int64_t rows, int64_t T, bool with_grads);

// [begin, end) row ranges covering 0..rows in order: as few as hold at most `per` rows each, of
// equal sizes (within a row), so no chunk is a remainder of a few rows.
std::vector<std::pair<int64_t, int64_t>> row_chunks(int64_t rows, int64_t per);

// Rows [begin, end) of (B, ...) ids.
Ids slice_rows(const Ids& ids, int64_t begin, int64_t end);

// Bytes an analysis holding `rows` rows of T tokens in chunks needs beyond the loaded model: one
// chunk's pass (its activations; with_grads: their gradients and the parameters' gradients), plus
// the ids and per-row results it keeps for every row (`per_row_bytes` each).
double chunked_pass_bytes(const ModelConfig& cfg, int64_t rows, int64_t T, bool with_grads, double per_row_bytes);

}  // namespace hl
