// The padding of a batch of rows of different lengths, as the forward takes it: key_padding
// (B, T), 1 = padding. The analyses measure each row as if it ran alone by moving its tokens to
// its first columns (left-aligned): a left-padded row then reads as a right-padded one, whose
// tokens a causal model computes before the padding and never with it. Header-only: datasets/
// uses it and links no model code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lib/core.h"

namespace hl {

// Checks key_padding (B, T) row by row: values 0 or 1, at least one token, the tokens in one run
// (padding on the left, the right or both; none between tokens). Returns each row's padding
// before its first token. `what` leads the messages (e.g. "edges: attention_mask").
inline std::vector<int64_t> leading_padding(std::span<const float> key_padding, int64_t B, int64_t T, const std::string& what) {
  if (static_cast<int64_t>(key_padding.size()) != B * T)
    fail(what, ": ", key_padding.size(), " values for ids of (", B, ", ", T, ")");
  std::vector<int64_t> lead(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    const float* p = key_padding.data() + b * T;
    int64_t first = 0, last = T;  // the row's tokens: columns first..last-1
    for (int64_t t = 0; t < T; ++t)
      if (p[t] != 0.f && p[t] != 1.f) fail(what, ": values are 1 (token) or 0 (padding)");
    while (first < T && p[first] != 0.f) ++first;
    if (first == T) fail(what, ": row ", b, " has no token (every entry is 0)");
    while (p[last - 1] != 0.f) --last;
    for (int64_t t = first; t < last; ++t)
      if (p[t] != 0.f)
        fail(what, ": row ", b, " has padding at column ", t, " between its tokens: pad each row on one side (its tokens in one run)");
    lead[static_cast<size_t>(b)] = first;
  }
  return lead;
}

inline bool any_shift(std::span<const int64_t> shift) {
  return std::any_of(shift.begin(), shift.end(), [](int64_t s) { return s != 0; });
}

// Row b of x (B, T, inner) turned by[b] columns to the left: its first by[b] columns (the
// leading padding) move to its end. rotate_rows_right undoes it.
template <class V>
void rotate_rows_left(V* x, int64_t T, int64_t inner, std::span<const int64_t> by) {
  for (size_t b = 0; b < by.size(); ++b) {
    V* row = x + static_cast<int64_t>(b) * T * inner;
    std::rotate(row, row + by[b] * inner, row + T * inner);
  }
}
template <class V>
void rotate_rows_right(V* x, int64_t T, int64_t inner, std::span<const int64_t> by) {
  for (size_t b = 0; b < by.size(); ++b) {
    V* row = x + static_cast<int64_t>(b) * T * inner;
    std::rotate(row, row + (T - by[b]) * inner, row + T * inner);
  }
}

}  // namespace hl
