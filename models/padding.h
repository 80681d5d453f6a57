// The padding of a batch of rows of different lengths, as the forward takes it: key_padding
// (B, T), 1 = padding. The analyses measure each row as if it ran alone by moving its tokens to
// its first columns (left-aligned): a left-padded row then reads as a right-padded one, whose
// tokens a causal model computes before the padding and never with it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace hl {

// Checks key_padding (B, T) row by row: values 0 or 1, at least one token, the tokens in one run
// (padding on the left, the right or both; none between tokens). Returns each row's padding
// before its first token. `what` leads the messages (e.g. "edges: attention_mask").
std::vector<int64_t> leading_padding(std::span<const float> key_padding, int64_t B, int64_t T, const std::string& what);

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
