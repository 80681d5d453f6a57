#include "models/padding.h"

#include "lib/core.h"

namespace hl {

std::vector<int64_t> leading_padding(std::span<const float> key_padding, int64_t B, int64_t T, const std::string& what) {
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

}  // namespace hl
