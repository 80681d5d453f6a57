// Multi-head attention in float64 with round-off bounds (tests/roundoff.h): the reference the
// attention tests compare headlab's fused kernels with. Written as the formulas, loop by
// loop, sharing no code with models/attention*.cpp.
#pragma once
#include <functional>

#include "tests/roundoff.h"

namespace roundoff {

struct AttnSpec {
  int64_t B = 1, Tq = 1, Tk = 1, H = 1, Hkv = 1, dh = 1;
  bool causal = false;
  std::vector<double> gates;                                      // (H) or empty
  std::function<double(int64_t, int64_t, int64_t, int64_t)> mask;  // additive (b, h, i, j) or empty
  std::vector<bool> key_padded;                                   // (B * Tk) or empty
  int64_t group() const { return H / Hkv; }
  bool visible(int64_t b, int64_t i, int64_t j) const {
    if (causal && j > i + (Tk - Tq)) return false;
    return key_padded.empty() || !key_padded[static_cast<size_t>(b * Tk + j)];
  }
};

struct AttnRef {
  std::vector<Bounded> out;          // (B, Tq, H*dh)
  std::vector<Bounded> P;            // (B, H, Tq, Tk)
  std::vector<Bounded> dq, dk, dv;   // like q, k, v (after backward)
  std::vector<Bounded> dgates;       // (H)
  std::vector<Bounded> dP;           // (B, H, Tq, Tk): dL/dP (gate applied), 0 where masked
};

// q (B, Tq, H*dh), k and v (B, Tk, Hkv*dh) as flat row-major vectors. With dout (B, Tq, H*dh)
// non-empty, also the backward.
inline AttnRef reference_attention(const AttnSpec& s, const std::vector<Bounded>& q, const std::vector<Bounded>& k,
                                   const std::vector<Bounded>& v, const std::vector<Bounded>& dout = {}) {
  const int64_t W = s.H * s.dh, Wkv = s.Hkv * s.dh, TT = s.Tq * s.Tk;
  const double scale = static_cast<double>(1.f / std::sqrt(static_cast<float>(s.dh)));  // as headlab: a float
  auto Q = [&](int64_t b, int64_t i, int64_t h) { return &q[static_cast<size_t>((b * s.Tq + i) * W + h * s.dh)]; };
  auto Kp = [&](int64_t b, int64_t j, int64_t g) { return &k[static_cast<size_t>((b * s.Tk + j) * Wkv + g * s.dh)]; };
  auto Vp = [&](int64_t b, int64_t j, int64_t g) { return &v[static_cast<size_t>((b * s.Tk + j) * Wkv + g * s.dh)]; };
  AttnRef r;
  r.out.assign(static_cast<size_t>(s.B * s.Tq * W), Bounded{});
  r.P.assign(static_cast<size_t>(s.B * s.H * TT), Bounded{});
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / s.group();
      for (int64_t i = 0; i < s.Tq; ++i) {
        std::vector<Bounded> sc(static_cast<size_t>(s.Tk));
        Bounded m{-INFINITY, 0};
        bool any = false;
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (!s.visible(b, i, j)) continue;
          Bounded x = dot(Q(b, i, h), 1, Kp(b, j, g), 1, s.dh) * scale;  // scores = scale q k^T
          if (s.mask) x = x + exact(s.mask(b, h, i, j));
          sc[static_cast<size_t>(j)] = x;
          if (!any || x.v > m.v) m.v = x.v;
          m.e = std::max(m.e, x.e);  // the float max of perturbed scores is within max error
          any = true;
        }
        if (!any) continue;  // a fully masked row: zero weights, zero output
        std::vector<Bounded> p(static_cast<size_t>(s.Tk)), vis;
        for (int64_t j = 0; j < s.Tk; ++j)
          if (s.visible(b, i, j)) {
            p[static_cast<size_t>(j)] = exp(sc[static_cast<size_t>(j)] - m);
            vis.push_back(p[static_cast<size_t>(j)]);
          }
        const Bounded inv = exact(1) / sum(vis);
        Bounded* P = &r.P[static_cast<size_t>(((b * s.H + h) * s.Tq + i) * s.Tk)];
        for (int64_t j = 0; j < s.Tk; ++j)
          if (s.visible(b, i, j)) P[j] = p[static_cast<size_t>(j)] * inv;
        for (int64_t d = 0; d < s.dh; ++d) {  // out = g P V
          Bounded o = dot(P, 1, Vp(b, 0, g) + d, Wkv, s.Tk);
          if (!s.gates.empty()) o = o * exact(s.gates[static_cast<size_t>(h)]);
          r.out[static_cast<size_t>((b * s.Tq + i) * W + h * s.dh + d)] = o;
        }
      }
    }
  if (dout.empty()) return r;

  // Backward. U = dO V^T (before the gate); dP = g U; dS = P (dP - rowsum(dP P));
  // dQ = scale dS K; dK = scale dS^T Q; dV = g P^T dO; dg = sum U P.
  r.dP.assign(r.P.size(), Bounded{});
  std::vector<Bounded> dS(r.P.size()), dg_terms;
  r.dgates.assign(static_cast<size_t>(s.H), Bounded{});
  for (int64_t h = 0; h < s.H; ++h) {
    const int64_t g = h / s.group();
    const Bounded gate = s.gates.empty() ? exact(1) : exact(s.gates[static_cast<size_t>(h)]);
    std::vector<Bounded> gate_terms;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.Tq; ++i) {
        const size_t row = static_cast<size_t>(((b * s.H + h) * s.Tq + i) * s.Tk);
        const Bounded* dO = &dout[static_cast<size_t>((b * s.Tq + i) * W + h * s.dh)];
        std::vector<Bounded> dot_terms;
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (!s.visible(b, i, j)) continue;
          const Bounded U = dot(dO, 1, Vp(b, j, g), 1, s.dh);
          gate_terms.push_back(U * r.P[row + j]);
          r.dP[row + j] = s.gates.empty() ? U : U * gate;
          dot_terms.push_back(r.dP[row + j] * r.P[row + j]);
        }
        const Bounded rowdot = sum(dot_terms);
        for (int64_t j = 0; j < s.Tk; ++j)
          if (s.visible(b, i, j)) dS[row + j] = r.P[row + j] * (r.dP[row + j] - rowdot);
      }
    r.dgates[static_cast<size_t>(h)] = sum(gate_terms);
  }
  r.dq.assign(q.size(), Bounded{});
  r.dk.assign(k.size(), Bounded{});
  r.dv.assign(v.size(), Bounded{});
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Tq; ++i)
        for (int64_t d = 0; d < s.dh; ++d) {
          const Bounded* row = &dS[static_cast<size_t>(((b * s.H + h) * s.Tq + i) * s.Tk)];
          r.dq[static_cast<size_t>((b * s.Tq + i) * W + h * s.dh + d)] = dot(row, 1, Kp(b, 0, h / s.group()) + d, Wkv, s.Tk) * scale;
        }
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t g = 0; g < s.Hkv; ++g)
      for (int64_t j = 0; j < s.Tk; ++j)
        for (int64_t d = 0; d < s.dh; ++d) {
          std::vector<Bounded> tk, tv;  // over the query heads of this kv head and the queries
          for (int64_t h = g * s.group(); h < (g + 1) * s.group(); ++h) {
            const Bounded gate = s.gates.empty() ? exact(1) : exact(s.gates[static_cast<size_t>(h)]);
            for (int64_t i = 0; i < s.Tq; ++i) {
              if (!s.visible(b, i, j)) continue;
              const size_t at = static_cast<size_t>(((b * s.H + h) * s.Tq + i) * s.Tk + j);
              tk.push_back(dS[at] * Q(b, i, h)[d]);
              tv.push_back(gate * r.P[at] * dout[static_cast<size_t>((b * s.Tq + i) * W + h * s.dh + d)]);
            }
          }
          r.dk[static_cast<size_t>((b * s.Tk + j) * Wkv + g * s.dh + d)] = sum(tk) * scale;
          r.dv[static_cast<size_t>((b * s.Tk + j) * Wkv + g * s.dh + d)] = sum(tv);
        }
  return r;
}

inline std::vector<Bounded> exact_values(const hl::Tensor& t) { return from_tensor(t, 1).a; }

}  // namespace roundoff
