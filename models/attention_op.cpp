// The fused attention op behind attention(), attention_packed() and attention_varlen(): decides
// per call which path each slice takes and whether P is kept, runs the forward over (batch,
// head) slices and the backward over (batch, kv head) tasks in parallel, and attaches the
// backward. The kernels are in attention_small_head.cpp, attention_long_slice.cpp and
// attention_reference.cpp.
#include <cmath>
#include <functional>
#include <memory>

#include "lib/autograd.h"
#include "lib/broadcast.h"
#include "lib/parallel.h"
#include "lib/profile.h"
#include "models/attention_kernels.h"

namespace hl::attn {

namespace {

// The additive mask's element strides over the scores (B, H, Tq, Tk), 0 on broadcast dims.
MaskStrides mask_strides(const Tensor& mask, const AttnDims& d) {
  const Shape scores{d.B, d.H, d.Tq, d.Tk};
  if (mask.ndim() > 4)
    fail("attention: mask ", mask.shape().str(), " has more than 4 dimensions");
  BroadcastPlan p;
  bool ok = true;
  try {
    p = plan_broadcast("attention", scores, mask.shape());
  } catch (const Error&) {
    ok = false;
  }
  if (!ok || p.out != scores)
    fail("attention: mask ", mask.shape().str(), " does not broadcast to scores (B,H,Tq,Tk) = ",
         scores.str());
  MaskStrides m;
  for (int i = 0; i < 4; ++i) m.s[i] = p.stride_b[i];
  return m;
}

// What backward needs of the less common arguments: where it reports dL/dP (the tensor and the
// callback) and the masks it applies again when it recomputes the weights. Held together so the
// backward closure stays small (one pointer); allocated only when backward reads them (a dL/dP
// sink, or recomputed weights under a mask), so a plain training step allocates nothing here.
struct BackwardExtras {
  Tensor pattern_grad;
  std::function<void(const Tensor&)> on_pattern_grad;
  Tensor key_padding, additive_mask;
  MaskStrides ms;
};
std::shared_ptr<BackwardExtras> backward_extras(const AttentionArgs& a, const MaskStrides& ms, bool recompute) {
  const bool masks = recompute && (a.key_padding.defined() || a.additive_mask.defined());
  if (!a.pattern_grad.defined() && !masks) return nullptr;
  return std::make_shared<BackwardExtras>(
      BackwardExtras{a.pattern_grad, a.on_pattern_grad, a.key_padding, a.additive_mask, ms});
}

// A slice of kLongSlice keys or more takes the long-slice path; each sequence of a varlen call
// decides by its own length.
bool is_long(const AttnDims& ds) { return ds.Tk >= kLongSlice; }

}  // namespace

Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttnDims& d, const AttentionArgs& a,
                       Tensor* pattern, const Tensor& starts_buffer) {
  const bool packed = q.same(k);
  const float scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(d.dh));
  MaskStrides ms;
  if (a.additive_mask.defined()) ms = mask_strides(a.additive_mask, d);
  const float* am = a.additive_mask.defined() ? a.additive_mask.data() : nullptr;
  const bool causal = a.causal;
  const bool drop = a.dropout > 0.f;

  // The small-head kernels take the whole call or none of it: its shapes, no additive mask, no
  // dropout. Their backward (d_head <= 8) reads P with each slice transposed; at d_head 16 the
  // forward hands P over in its usual layout to the sgemm path's backward.
  const bool small_fwd = small_head_takes_forward(d) && !am && !drop;
  const bool small = small_fwd && small_head_takes_backward(d);
  const bool grad = needs_graph({&q, &k, &v, &a.gates});
  // P is kept only where something reads it after the forward. The small-head kernels' backward
  // does (evaluation does not). The sgemm paths' backward reads it unless the long-slice path
  // can compute each block's weights again (long_slices_recompute); `pattern`, a dL/dP sink or
  // dropout need all of P.
  const bool keep_weights = small_fwd ? grad || pattern
                                      : pattern || drop || a.pattern_grad.defined() ||
                                            (grad && !long_slices_recompute(d));
  Tensor P = keep_weights ? Tensor::empty({d.B, d.H, d.Tq, d.Tk}) : Tensor();  // softmax output, saved for backward
  Tensor drop_mask, Pd = P;                                                     // Pd: weights after dropout
  if (drop) {  // drawn sequentially before the parallel loop: deterministic
    drop_mask = Tensor::empty(P.shape());
    Pd = Tensor::empty(P.shape());
    const float keep = 1.f / (1.f - a.dropout);
    float* M = drop_mask.data();
    for (int64_t i = 0, n = P.numel(); i < n; ++i) M[i] = a.rng->uniform() < a.dropout ? 0.f : keep;
  }
  Tensor out = d.starts ? Tensor::empty({d.starts[d.B], d.ldo()})  // (n, H*dh)
                        : Tensor::empty({d.B, d.Tq, d.ldo()});

  const ForwardOperands f{d,
                          scale,
                          causal,
                          q.data() + d.q_off,
                          k.data() + d.k_off,
                          v.data() + d.v_off,
                          P.defined() ? P.data() : nullptr,
                          Pd.defined() ? Pd.data() : nullptr,
                          drop ? drop_mask.data() : nullptr,
                          out.data(),
                          a.gates.defined() ? a.gates.data() : nullptr,
                          a.key_padding.defined() ? a.key_padding.data() : nullptr,
                          am,
                          ms};
  const int64_t TT = d.Tq * d.Tk;
  parallel_for(d.B * d.H, d.B * d.H * TT * d.dh, [&](int64_t bh) {
    const ForwardOperands::Slice s = f.slice(bh / d.H, bh % d.H);
    if (s.ds.Tq == 0) return;
    if (small_fwd) small_head_forward(f, s, small);
    else if (is_long(s.ds)) long_slice_forward(f, s);
    else reference_forward(f, s);
  });
  if (pattern) *pattern = small ? small_head_pattern(P, causal) : P.detach();

  if (grad)
    attach(out, "attention", {q, packed ? Tensor() : k, packed ? Tensor() : v, a.gates},
           [q, k, v, gates = a.gates, P, Pd, drop_mask, extras = backward_extras(a, ms, !keep_weights), d, starts_buffer, scale, causal,
            small](TensorImpl& self) {
             HL_PROFILE(Attention);
             // P not kept (the long-slice path in training): each block's weights are computed again
             const bool recompute = !P.defined();
             bool fresh_q, fresh_k, fresh_v;
             float* dQ = grad_buffer_for_overwrite(q, fresh_q);
             float* dK = grad_buffer_for_overwrite(k, fresh_k);
             float* dV = grad_buffer_for_overwrite(v, fresh_v);
             if (q.same(k)) fresh_k = fresh_v = fresh_q;
             if (dQ) dQ += d.q_off;
             if (dK) dK += d.k_off;
             if (dV) dV += d.v_off;
             float* dG = grad_buffer(gates);
             Tensor work = small || recompute ? Tensor() : Tensor::empty({d.B, d.H, d.Tq, d.Tk});  // dL/dP, then dL/dS
             Tensor gate_part = Tensor::zeros({d.B, d.H});                           // per (b,h) dL/dg
             const BackwardOperands t{
                 d,
                 scale,
                 causal,
                 q.data() + d.q_off,
                 k.data() + d.k_off,
                 v.data() + d.v_off,
                 self.grad->data(),
                 dQ,
                 dK,
                 dV,
                 fresh_q,
                 fresh_k,
                 fresh_v,
                 (dQ && (dQ == dK || dQ == dV)) || (dK && dK == dV),
                 recompute ? nullptr : P.data(),
                 recompute ? nullptr : Pd.data(),
                 work.defined() ? work.data() : nullptr,
                 drop_mask.defined() ? drop_mask.data() : nullptr,
                 gates.defined() ? gates.data() : nullptr,
                 dG ? gate_part.data() : nullptr,
                 extras && extras->pattern_grad.defined() ? extras->pattern_grad.data() : nullptr,
                 extras && extras->key_padding.defined() ? extras->key_padding.data() : nullptr,
                 extras && extras->additive_mask.defined() ? extras->additive_mask.data() : nullptr,
                 extras ? extras->ms : MaskStrides()};
             // Parallel over (batch, kv head): query heads sharing a kv head run in order,
             // so dK and dV rows are never written by two threads.
             parallel_for(d.B * d.Hkv, d.B * d.H * d.Tq * d.Tk * d.dh, [&](int64_t bk) {
               const BackwardOperands::KvSlice kv = t.kv_slice(bk / d.Hkv, bk % d.Hkv);
               if (kv.ds.Tq == 0) return;
               if (small) small_head_backward(t, kv);
               else if (is_long(kv.ds)) long_slice_backward(t, kv);
               else reference_backward(t, kv);
             });
             if (dG)  // fixed-order reduction over the batch
               for (int64_t h = 0; h < d.H; ++h)
                 for (int64_t b = 0; b < d.B; ++b) dG[h] += t.gate_part[b * d.H + h];
             if (t.dP && extras->on_pattern_grad) extras->on_pattern_grad(extras->pattern_grad);
           });
  return out;
}

}  // namespace hl::attn
