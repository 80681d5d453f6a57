// Rotary position embeddings: the op that turns q's and k's heads by their rows' positions, one
// pass over the buffer forward (in place on a packed qkv: v's columns are not touched) and one
// in backward (the gradient turns back by the same angle).
#include <cmath>

#include "lib/autograd.h"
#include "lib/parallel.h"
#include "lib/profile.h"
#include "models/attention.h"

namespace hl {

namespace {
thread_local RotaryTableSharing* sharing = nullptr;  // the innermost alive on this thread
}  // namespace

RotaryTableSharing::RotaryTableSharing() : outer_(sharing) { sharing = this; }
RotaryTableSharing::~RotaryTableSharing() { sharing = outer_; }

Tensor rotary_table(int64_t positions, const RotaryArgs& a) {
  if (sharing)
    for (const RotaryTableSharing::Entry& e : sharing->tables_)
      if (e.positions == positions && e.dim == a.rot_dim() && e.theta == a.theta) return e.table;
  const int64_t half = a.rot_dim() / 2;
  Tensor t = Tensor::empty({positions, 2 * half});
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * std::pow(static_cast<double>(a.theta), -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
      t.data()[p * 2 * half + i] = static_cast<float>(std::cos(angle));
      t.data()[p * 2 * half + half + i] = static_cast<float>(std::sin(angle));
    }
  if (sharing) sharing->tables_.push_back({positions, a.rot_dim(), a.theta, t});
  return t;
}

namespace {

// Turns the first `heads` heads of each of `rows` rows of `in` (row stride W) into `out` by
// +angle (sign 1) or back by -angle (sign -1, the backward); other columns copied unless
// in == out. The pair of column i is i + half (rotate-half) or, interleaved, columns 2i, 2i+1.
void turn(const float* in, float* out, int64_t rows, int64_t W, int heads, const int32_t* pos, int64_t n_pos,
          const float* table, const RotaryArgs& a, float sign, bool accumulate) {
  const int64_t dh = a.d_head, half = a.rot_dim() / 2, rotated = heads * dh;
  parallel_for(rows, rows * W, [&](int64_t r) {
    const float* x = in + r * W;
    float* y = out + r * W;
    const float* c = table + static_cast<int64_t>(pos[r % n_pos]) * 2 * half;
    const float* s = c + half;
    for (int h = 0; h < heads; ++h) {
      const float* xh = x + h * dh;
      float* yh = y + h * dh;
      const int64_t step = a.interleaved ? 2 : 1, other = a.interleaved ? 1 : half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = xh[i * step], x2 = xh[i * step + other], sn = sign * s[i];
        const float y1 = x1 * c[i] - x2 * sn, y2 = x2 * c[i] + x1 * sn;
        if (accumulate) {
          yh[i * step] += y1;
          yh[i * step + other] += y2;
        } else {
          yh[i * step] = y1;
          yh[i * step + other] = y2;
        }
      }
      if (in != out || accumulate)  // the unturned columns of a partial rotary
        for (int64_t j = 2 * half; j < dh; ++j) yh[j] = accumulate ? yh[j] + xh[j] : xh[j];
    }
    if (in != out || accumulate)
      for (int64_t j = rotated; j < W; ++j) y[j] = accumulate ? y[j] + x[j] : x[j];
  });
}

}  // namespace

Tensor rotary(const Tensor& x, int heads, std::span<const int32_t> pos, const Tensor& table, const RotaryArgs& a,
              bool in_place) {
  HL_PROFILE(Attention);  // part of attention's work (bench --profile; it was counted nowhere)
  const int64_t half = a.rot_dim() / 2;
  if (x.ndim() < 2 || a.d_head < 1 || heads < 1 || heads * a.d_head > x.size(-1))
    fail("rotary: ", heads, " heads of d_head ", a.d_head, " do not fit in ", x.shape().str());
  if (a.rot_dim() % 2 || a.rot_dim() > a.d_head)
    fail("rotary: rotary_dim ", a.rot_dim(), " must be even and at most d_head ", a.d_head);
  if (table.ndim() != 2 || table.size(1) != 2 * half) fail("rotary: table ", table.shape().str(), " is not (positions, ", 2 * half, ")");
  const int64_t W = x.size(-1), rows = x.numel() / W, n_pos = static_cast<int64_t>(pos.size());
  if (n_pos < 1 || rows % n_pos) fail("rotary: ", n_pos, " positions for ", rows, " rows of ", x.shape().str());
  for (int32_t p : pos)
    if (p < 0 || p >= table.size(0)) fail("rotary: position ", p, " outside 0..", table.size(0) - 1, " (max_seq_len)");
  Tensor out = in_place ? storage_view(x, 0, x.shape()) : Tensor::empty(x.shape());
  turn(x.data(), out.data(), rows, W, heads, pos.data(), n_pos, table.data(), a, 1.f, false);
  if (needs_graph({&x})) {
    // the positions backward turns by, kept in a pooled buffer (no heap allocation per step)
    Tensor saved = Tensor::empty({n_pos});
    int32_t* sp = reinterpret_cast<int32_t*>(saved.data());
    std::copy(pos.begin(), pos.end(), sp);
    attach(out, "rotary", {x}, [x, saved, table, a, heads, rows, W, n_pos](TensorImpl& self) {
      HL_PROFILE(Attention);
      bool fresh = false;
      float* gx = grad_buffer_for_overwrite(x, fresh);
      if (!gx) return;
      turn(self.grad->data(), gx, rows, W, heads, reinterpret_cast<const int32_t*>(saved.data()), n_pos, table.data(), a, -1.f,
           !fresh);
    });
  }
  return out;
}

}  // namespace hl
