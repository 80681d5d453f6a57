// NumPy broadcasting: align shapes from the right; a dimension of 1 stretches.
#pragma once
#include "core.h"

namespace hl {

struct BroadcastPlan {
  Shape out;
  int64_t stride_a[kMaxDims];  // element strides of a over out's dims, 0 where broadcast
  int64_t stride_b[kMaxDims];
  bool same = false;           // a and b already have out's shape
};

BroadcastPlan plan_broadcast(const char* op, const Shape& a, const Shape& b);

// Calls f(i, ia, ib) for every flat output index i with the matching flat input indices.
template <class F>
void for_each_broadcast(const BroadcastPlan& p, F&& f) {
  const int nd = p.out.ndim;
  const int64_t n = p.out.numel();
  if (nd == 0) {
    if (n) f(int64_t(0), int64_t(0), int64_t(0));
    return;
  }
  int64_t idx[kMaxDims] = {0};
  int64_t ia = 0, ib = 0;
  const int64_t inner = p.out[nd - 1], sa = p.stride_a[nd - 1], sb = p.stride_b[nd - 1];
  for (int64_t i = 0; i < n; i += inner) {
    for (int64_t j = 0; j < inner; ++j) f(i + j, ia + j * sa, ib + j * sb);
    // advance the multi-index over the outer dims
    for (int d = nd - 2; d >= 0; --d) {
      ia += p.stride_a[d];
      ib += p.stride_b[d];
      if (++idx[d] < p.out[d]) break;
      ia -= p.stride_a[d] * p.out[d];
      ib -= p.stride_b[d] * p.out[d];
      idx[d] = 0;
    }
  }
}

}  // namespace hl
