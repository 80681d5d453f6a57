// Multi-head attention: the worked 5-token example, masks, gates, GQA/MQA, KV cache,
// parameter counts, and gradchecks of the fused op against finite differences and against
// a float64 reference with round-off bounds (tests/reference_attention.h).
#define BOOST_TEST_MODULE attention
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <functional>
#include <map>

#include "lib/autograd.h"
#include "lib/gradcheck.h"
#include "models/attention.h"
#include "tests/reference_model.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;
namespace tt = boost::test_tools;

namespace {

const Tensor Qx = Tensor::from({5, 4}, {1, 0, 1, 0, 0, 2, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1});
const Tensor Kx = Tensor::from({5, 4}, {0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0.5f, 0.5f});
const Tensor Vx = Tensor::from({5, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, .5f, .5f, .5f, .5f});

void check_rows(const Tensor& pattern, int head, const std::vector<std::vector<float>>& rows) {
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j)
      BOOST_TEST(pattern.at({0, head, i, j}) == rows[i][j], tt::tolerance(1e-4f / std::max(rows[i][j], 1e-4f)));
}

Rng& rng() {
  static Rng r(77);
  return r;
}
Tensor rnd(const Shape& s) { return Tensor::randn(s, rng()).requires_grad_(); }

// The float64 reference (tests/reference_attention.h) of attention(q, k, v, a) and, with `up`,
// of its backward; q, k, v (B, T, heads*dh) as the op takes them.
roundoff::AttnRef bounded_attention(const Tensor& q, const Tensor& k, const Tensor& v, int H, int Hkv, bool causal,
                                    const Tensor& gates = Tensor(), const Tensor& up = Tensor(),
                                    const Tensor& mask = Tensor()) {
  roundoff::AttnSpec s;
  s.B = q.size(0), s.Tq = q.size(1), s.Tk = k.size(1), s.H = H, s.Hkv = Hkv, s.dh = q.size(2) / H;
  s.causal = causal;
  if (gates.defined())
    for (float g : gates.to_vector()) s.gates.push_back(g);
  if (mask.defined()) {  // broadcast (..., Tq or 1, Tk or 1) over (B, H, Tq, Tk), aligned right
    const Shape ms = mask.shape();
    s.mask = [ms, data = mask.to_vector()](int64_t b, int64_t h, int64_t i, int64_t j) {
      const int64_t idx[4] = {b, h, i, j};
      int64_t at = 0;
      for (int d = 0; d < ms.ndim; ++d) at = at * ms[d] + (ms[d] == 1 ? 0 : idx[4 - ms.ndim + d]);
      return static_cast<double>(data[static_cast<size_t>(at)]);
    };
  }
  using roundoff::exact_values;
  return roundoff::reference_attention(s, exact_values(q), exact_values(k), exact_values(v),
                                       up.defined() ? exact_values(up) : std::vector<roundoff::Bounded>{});
}

}  // namespace

BOOST_AUTO_TEST_CASE(worked_example_two_heads) {
  auto [out, pattern] = scaled_dot_product_attention(Qx, Kx, Vx, 2);
  BOOST_TEST(pattern.shape() == Shape({1, 2, 5, 5}));
  check_rows(pattern, 0, {{.1237f, .2509f, .2509f, .1237f, .2509f}, {.3664f, .0891f, .3664f, .0891f, .0891f},
                          {.1811f, .1811f, .3673f, .0893f, .1811f}, {.2f, .2f, .2f, .2f, .2f},
                          {.1237f, .2509f, .2509f, .1237f, .2509f}});
  check_rows(pattern, 1, {{.1337f, .2711f, .1337f, .2711f, .1904f}, {.2711f, .1337f, .1337f, .2711f, .1904f},
                          {.1337f, .2711f, .1337f, .2711f, .1904f}, {.1811f, .1811f, .0893f, .3673f, .1811f},
                          {.2711f, .1337f, .1337f, .2711f, .1904f}});
  const std::vector<std::vector<float>> rows = {{.2491f, .3763f, .2289f, .3663f}, {.4109f, .1336f, .2289f, .3663f},
                                                {.2717f, .2717f, .2289f, .3663f}, {.3f, .3f, .1799f, .4579f},
                                                {.2491f, .3763f, .2289f, .3663f}};
  BOOST_TEST(out.shape() == Shape({5, 4}));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) BOOST_TEST(std::fabs(out.at({i, j}) - rows[i][j]) < 1e-4f);
}

BOOST_AUTO_TEST_CASE(worked_example_one_and_four_heads) {
  auto [out1, p1] = scaled_dot_product_attention(Qx, Kx, Vx, 1);  // scale 1/sqrt(4) = 1/2
  BOOST_TEST(std::fabs(p1.at({0, 0, 1, 0}) - .4026f) < 1e-4f);
  BOOST_TEST(std::fabs(p1.at({0, 0, 1, 1}) - .0898f) < 1e-4f);
  BOOST_TEST(std::fabs(p1.at({0, 0, 1, 2}) - .2442f) < 1e-4f);
  auto [out4, p4] = scaled_dot_product_attention(Qx, Kx, Vx, 4);  // d_k = 1
  BOOST_TEST(p4.shape() == Shape({1, 4, 5, 5}));
  // head 0 uses column 0 only: score(i,j) = Q[i,0] K[j,0]
  float e[5], s = 0;
  for (int j = 0; j < 5; ++j) s += e[j] = std::exp(Qx.at({0, 0}) * Kx.at({j, 0}));
  for (int j = 0; j < 5; ++j) BOOST_TEST(p4.at({0, 0, 0, j}) == e[j] / s, tt::tolerance(1e-5f));
}

BOOST_AUTO_TEST_CASE(identical_subspaces_give_identical_patterns) {
  Tensor q = concat({slice(Qx, 1, 0, 2), slice(Qx, 1, 0, 2)}, 1);
  Tensor k = concat({slice(Kx, 1, 0, 2), slice(Kx, 1, 0, 2)}, 1);
  auto [out, p] = scaled_dot_product_attention(q, k, Vx, 2);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) BOOST_TEST(p.at({0, 0, i, j}) == p.at({0, 1, i, j}));
}

BOOST_AUTO_TEST_CASE(parameter_counts) {
  Rng r(0);
  BOOST_TEST(MultiHeadAttention(test_attention({.d_model = 16}), r).num_parameters() == 1024);
  const AttentionConfig big = test_attention({.d_model = 512, .heads = 8});
  BOOST_TEST(MultiHeadAttention(big, r).num_parameters() == 1048576);
  AttentionConfig gqa = big;
  gqa.n_kv_heads = 2;  // K and V shrink to 2*64 rows each
  BOOST_TEST(MultiHeadAttention(gqa, r).num_parameters() == 2 * 512 * 512 + 2 * 128 * 512);
}

BOOST_AUTO_TEST_CASE(rows_sum_to_one_and_causal_zeros) {
  Tensor q = rnd({2, 6, 8}), k = rnd({2, 6, 8}), v = rnd({2, 6, 8});
  AttentionArgs a;
  a.n_heads = 2;
  a.causal = true;
  Tensor p;
  attention(q, k, v, a, &p);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 6; ++i) {
        float s = 0;
        for (int j = 0; j < 6; ++j) {
          s += p.at({b, h, i, j});
          if (j > i) BOOST_TEST(p.at({b, h, i, j}) == 0.f);
        }
        BOOST_TEST(s == 1.f, tt::tolerance(1e-5f));
      }
}

BOOST_AUTO_TEST_CASE(padded_keys_get_zero_weight) {
  Tensor q = rnd({2, 4, 4}), k = rnd({2, 4, 4}), v = rnd({2, 4, 4});
  AttentionArgs a;
  a.n_heads = 2;
  a.key_padding = Tensor::from({2, 4}, {0, 0, 1, 1, 0, 0, 0, 1});
  Tensor p;
  attention(q, k, v, a, &p);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      BOOST_TEST(p.at({0, h, i, 2}) == 0.f);
      BOOST_TEST(p.at({0, h, i, 3}) == 0.f);
      BOOST_TEST(p.at({1, h, i, 3}) == 0.f);
      BOOST_TEST(p.at({1, h, i, 2}) > 0.f);
    }
}

BOOST_AUTO_TEST_CASE(every_mask_broadcast_form_matches_the_full_mask) {
  const int64_t B = 2, H = 2, T = 3;
  Tensor q = rnd({B, T, 4}), k = rnd({B, T, 4}), v = rnd({B, T, 4});
  Tensor m2 = Tensor::randn({T, T}, rng());
  Tensor mb = Tensor::randn({B, 1, 1, T}, rng());
  Tensor mf = Tensor::randn({B, H, T, T}, rng());
  for (const Tensor& m : {m2, mb, mf}) {
    AttentionArgs a;
    a.n_heads = 2;
    a.additive_mask = m;
    Tensor fused = attention(q, k, v, a);
    roundoff::check_within(fused, bounded_attention(q, k, v, 2, 2, false, Tensor(), Tensor(), m).out,
                           "mask " + m.shape().str());
  }
  AttentionArgs bad;
  bad.n_heads = 2;
  bad.additive_mask = Tensor::zeros({3, 2});
  BOOST_CHECK_EXCEPTION(attention(q, k, v, bad), Error, [](const Error& e) {
    return std::string(e.what()) == "attention: mask (3,2) does not broadcast to scores (B,H,Tq,Tk) = (2,2,3,3)";
  });
}

BOOST_AUTO_TEST_CASE(fully_masked_rows_give_zeros_not_nan) {
  Tensor q = rnd({1, 2, 2}), k = rnd({1, 2, 2}), v = rnd({1, 2, 2});
  AttentionArgs a;
  a.n_heads = 1;
  a.key_padding = Tensor::ones({1, 2});
  Tensor out = attention(q, k, v, a);
  for (float x : out.to_vector()) BOOST_TEST(x == 0.f);
  Rng r(1);
  out.backward(Tensor::randn(out.shape(), r));
  for (const Tensor& t : {q, k, v})
    for (float g : t.grad().to_vector()) BOOST_TEST(std::isfinite(g));
}

BOOST_AUTO_TEST_CASE(fused_equals_a_float64_reference_forward_and_backward) {
  // d_head <= 8 takes the small-head kernels (16 query rows per register: 37 rows make a partial
  // first block), 16 the small-head forward with the sgemm path's backward, 9 the sgemm path
  struct Cfg { int H, Hkv; bool causal; int64_t Tq, Tk; };
  for (int64_t dh : {1, 3, 4, 8, 9, 16})
  for (Cfg c : {Cfg{2, 2, false, 5, 5}, Cfg{4, 2, true, 6, 6}, Cfg{4, 1, true, 3, 7}, Cfg{3, 3, false, 4, 2},
                Cfg{2, 1, true, 37, 37}, Cfg{2, 2, false, 20, 37}, Cfg{2, 2, true, 37, 20}}) {
    Tensor q = rnd({2, c.Tq, c.H * dh}), k = rnd({2, c.Tk, c.Hkv * dh}), v = rnd({2, c.Tk, c.Hkv * dh});
    Tensor g = Tensor::uniform({c.H}, rng(), 0.5f, 1.5f).requires_grad_();
    AttentionArgs a;
    a.n_heads = c.H;
    a.n_kv_heads = c.Hkv;
    a.causal = c.causal;
    a.gates = g;
    Tensor up = Tensor::randn({2, c.Tq, c.H * dh}, rng());
    Tensor fused = attention(q, k, v, a);
    fused.backward(up);
    const roundoff::AttnRef ref = bounded_attention(q, k, v, c.H, c.Hkv, c.causal, g, up);
    BOOST_TEST_CONTEXT("d_head " << dh << " H " << c.H << " Hkv " << c.Hkv << " causal " << c.causal << " Tq " << c.Tq
                                  << " Tk " << c.Tk) {
      roundoff::check_within(fused, ref.out, "output");
      roundoff::check_within(q.grad(), ref.dq, "dq");
      roundoff::check_within(k.grad(), ref.dk, "dk");
      roundoff::check_within(v.grad(), ref.dv, "dv");
      roundoff::check_within(g.grad(), ref.dgates, "dgates");
    }
  }
}

// q, k, v (B, T, .) side by side in one packed tensor (B, T, (H + 2 Hkv) dh), as linear_stacked makes it.
Tensor pack_qkv(const Tensor& q, const Tensor& k, const Tensor& v) { return concat({q, k, v}, 2); }

BOOST_AUTO_TEST_CASE(packed_attention_equals_separate_q_k_v_bit_for_bit) {
  struct Cfg { int H, Hkv; bool causal; int64_t T; };
  for (Cfg c : {Cfg{2, 2, false, 5}, Cfg{4, 2, true, 6}, Cfg{4, 1, true, 70}}) {
    const int64_t B = 2, dh = 3;
    Tensor q = rnd({B, c.T, c.H * dh}), k = rnd({B, c.T, c.Hkv * dh}), v = rnd({B, c.T, c.Hkv * dh});
    Tensor qkv = pack_qkv(q, k, v).detach().requires_grad_();
    AttentionArgs a;
    a.n_heads = c.H;
    a.n_kv_heads = c.Hkv;
    a.causal = c.causal;
    a.gates = Tensor::uniform({c.H}, rng(), 0.5f, 1.5f);
    Tensor up = Tensor::randn({B, c.T, c.H * dh}, rng());
    Tensor p1, p2;
    Tensor separate = attention(q, k, v, a, &p1);
    Tensor packed = attention_packed(qkv, a, &p2);
    separate.backward(up);
    packed.backward(up);
    BOOST_TEST(packed.to_vector() == separate.to_vector());
    BOOST_TEST(p2.to_vector() == p1.to_vector());
    BOOST_TEST(qkv.grad().to_vector() == pack_qkv(q.grad(), k.grad(), v.grad()).to_vector());
  }
  AttentionArgs bad;
  bad.n_heads = 2;
  BOOST_CHECK_EXCEPTION(attention_packed(Tensor::zeros({1, 3, 10}), bad), Error, [](const Error& e) {
    return std::string(e.what()) == "attention: packed qkv (1,3,10) is not 2 + 2 x 2 heads of d_head 1";
  });
}

BOOST_AUTO_TEST_CASE(varlen_attention_equals_each_sequence_alone_bit_for_bit) {
  // Sequences of their own lengths packed back to back give what each gives alone as a batch
  // of one (the same kernels over the same rows), in output and every gradient: small-head
  // kernels (d_head 2, 8; 16 forward), the sgemm path (12) and its causal row blocks (length 70), GQA, an
  // empty sequence, key padding.
  struct Cfg { int64_t dh; int H, Hkv; bool causal, padded; };
  for (Cfg c : {Cfg{2, 4, 4, true, false}, Cfg{8, 2, 1, true, true}, Cfg{16, 2, 2, true, true}, Cfg{12, 2, 2, true, false},
                Cfg{12, 4, 2, false, true}}) {
    const std::vector<int32_t> len = {5, 0, 17, 70, 1};
    const int64_t W = (c.H + 2 * c.Hkv) * c.dh, longest = 70;
    int64_t n = 0;
    for (int32_t l : len) n += l;
    Tensor qkv = Tensor::randn({n, W}, rng()).requires_grad_();
    Tensor gates = Tensor::uniform({c.H}, rng(), 0.5f, 1.5f).requires_grad_();
    Tensor pad = Tensor::zeros({static_cast<int64_t>(len.size()), longest});
    if (c.padded)  // hide a few keys of the longer sequences
      for (int64_t b = 0; b < pad.size(0); ++b)
        for (int64_t j = 1; j < len[b]; j += 3) pad.at({b, j}) = 1.f;
    AttentionArgs a;
    a.n_heads = c.H;
    a.n_kv_heads = c.Hkv;
    a.causal = c.causal;
    a.gates = gates;
    if (c.padded) a.key_padding = pad;
    const Tensor up = Tensor::randn({n, c.H * c.dh}, rng());
    Tensor out = attention_varlen(qkv, len, a);
    out.backward(up);
    BOOST_TEST_CONTEXT("d_head " << c.dh << " H " << c.H << " Hkv " << c.Hkv) {
      BOOST_TEST(out.shape() == Shape({n, c.H * c.dh}));
      std::vector<float> want_dgates(static_cast<size_t>(c.H), 0.f);
      int64_t row = 0;
      for (size_t b = 0; b < len.size(); ++b) {
        const int64_t L = len[b];
        if (L == 0) continue;
        Tensor one = reshape(slice(qkv.detach(), 0, row, row + L), {1, L, W}).detach().requires_grad_();
        Tensor g1 = gates.detach().requires_grad_();
        AttentionArgs a1 = a;
        a1.gates = g1;
        if (c.padded) a1.key_padding = slice(slice(pad, 0, b, b + 1), 1, 0, L);
        Tensor alone = attention_packed(one, a1);
        alone.backward(reshape(slice(up, 0, row, row + L), {1, L, c.H * c.dh}));
        BOOST_TEST(slice(out, 0, row, row + L).detach().to_vector() == alone.to_vector());
        BOOST_TEST(slice(qkv.grad(), 0, row, row + L).to_vector() == one.grad().to_vector());
        for (int h = 0; h < c.H; ++h) want_dgates[h] += g1.grad().to_vector()[h];  // in batch order, as the op
        row += L;
      }
      BOOST_TEST(gates.grad().to_vector() == want_dgates);
    }
  }
  AttentionArgs bad;
  bad.n_heads = 2;
  const std::vector<int32_t> len = {2, 2};
  BOOST_CHECK_EXCEPTION(attention_varlen(Tensor::zeros({5, 6}), len, bad), Error, [](const Error& e) {
    return std::string(e.what()) == "attention: sequence lengths add up to 4, qkv has 5 rows";
  });
}

BOOST_AUTO_TEST_CASE(self_attention_takes_the_packed_path_and_matches_the_separate_one) {
  // Self-attention: W_Q, W_K, W_V project with one sgemm into attention_packed; cross-attention
  // takes the path with separate q, k, v tensors. Same outputs and same gradient of every parameter.
  for (int Hkv : {4, 2}) {
    const AttentionConfig cfg = test_attention({.heads = 4, .kv_heads = Hkv, .bias = true});
    Rng r(9);
    MultiHeadAttention mha(cfg, r);
    const Tensor wq = mha.W_Q.weight, wk = mha.W_K.weight, wv = mha.W_V.weight;
    BOOST_TEST(back_to_back(std::vector<Tensor>{wq, wk, wv}));
    Tensor x = Tensor::randn({2, 5, 8}, rng());
    Tensor up = Tensor::randn({2, 5, 8}, rng());
    MultiHeadAttention::Call call;
    call.causal = true;
    Tensor fast = mha.forward(x, Tensor(), call);
    fast.backward(up);
    // the three weight gradients are one block (written by one sgemm)
    BOOST_TEST(back_to_back(std::vector<Tensor>{wq.grad(), wk.grad(), wv.grad()}));
    std::vector<std::vector<float>> grads;
    for (const Tensor& p : mha.parameters()) grads.push_back(p.grad().to_vector());
    mha.zero_grad();
    // the same input as "cross-attention" (x_kv given) takes the path with separate q, k, v
    Tensor slow = mha.forward(x, x, call);
    slow.backward(up);
    // both paths within the round-off of one float64 reference
    const roundoff::MhaRef ref = roundoff::bounded_mha(mha, roundoff::from_tensor(x), 2, 5, true, up);
    BOOST_TEST_CONTEXT("Hkv " << Hkv) {
      roundoff::check_within(fast, ref.out, "packed output");
      roundoff::check_within(slow, ref.out, "separate output");
      size_t which = 0;
      for (auto& [name, p] : mha.named_parameters()) {
        const Tensor fast_grad = Tensor::from(p.shape(), grads[which++]);
        roundoff::check_within(fast_grad, ref.grads.at(name), "packed d" + name);
        roundoff::check_within(p.grad(), ref.grads.at(name), "separate d" + name);
      }
    }
  }
}

namespace {

// One gradcheck case of a model op: a function of the inputs and the inputs.
struct ModelOpCase {
  std::string what;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<Tensor> inputs;
};

// Every configuration of the fused op, as separate q, k, v (attention), as one packed tensor
// (attention_packed), and as sequences of their own lengths packed back to back
// (attention_varlen: no additive mask there, so its cases are its own).
std::vector<ModelOpCase> model_op_cases(const std::string& op) {
  struct Cfg { const char* what; int H, Hkv; bool causal; bool pad; bool mask; float drop; int64_t T; };
  const Cfg cfgs[] = {Cfg{"mha", 2, 2, false, false, false, 0.f, 4}, Cfg{"gqa causal", 4, 2, true, false, false, 0.f, 4},
                      Cfg{"mqa padding", 2, 1, false, true, false, 0.f, 4},
                      Cfg{"additive mask", 2, 2, false, false, true, 0.f, 4},
                      Cfg{"dropout", 2, 2, true, false, false, 0.3f, 4},
                      Cfg{"causal row blocks", 2, 1, true, false, false, 0.f, 66}};
  std::vector<ModelOpCase> cases;
  const int64_t B = 2, dh = 3;
  for (const Cfg& c : cfgs) {
    Tensor pad = Tensor::zeros({B, c.T});
    pad.at({0, c.T - 1}) = 1.f;
    pad.at({1, 1}) = 1.f;
    Tensor mask = Tensor::randn({B, 1, 1, c.T}, rng());
    auto args = [c, pad, mask](const Tensor& gates, Rng& r) {
      AttentionArgs a;
      a.n_heads = c.H;
      a.n_kv_heads = c.Hkv;
      a.causal = c.causal;
      a.gates = gates;
      if (c.pad) a.key_padding = pad;
      if (c.mask) a.additive_mask = mask;
      a.dropout = c.drop;
      a.rng = &r;
      return a;
    };
    Tensor g = Tensor::uniform({c.H}, rng(), 0.5f, 1.5f).requires_grad_();
    if (op == "attention")
      cases.push_back({c.what, [args](const std::vector<Tensor>& in) {
                         Rng r(5);  // the same dropout mask every evaluation
                         return attention(in[0], in[1], in[2], args(in[3], r));
                       },
                       {rnd({B, c.T, c.H * dh}), rnd({B, c.T, c.Hkv * dh}), rnd({B, c.T, c.Hkv * dh}), g}});
    if (op == "attention_packed")
      cases.push_back({c.what, [args](const std::vector<Tensor>& in) {
                         Rng r(5);
                         return attention_packed(in[0], args(in[1], r));
                       },
                       {rnd({B, c.T, (c.H + 2 * c.Hkv) * dh}), g}});
    if (op == "attention_varlen" && !c.mask && c.drop == 0.f) {
      // lengths 3, 0 (an empty sequence) and T: padding, when on, is (3 sequences, longest T)
      const std::vector<int32_t> len = {3, 0, static_cast<int32_t>(c.T)};
      Tensor vpad = Tensor::zeros({3, c.T});
      vpad.at({0, 1}) = 1.f;
      vpad.at({2, c.T - 1}) = 1.f;
      const int64_t n = 3 + c.T;
      cases.push_back({c.what, [c, len, vpad](const std::vector<Tensor>& in) {
                         AttentionArgs a;
                         a.n_heads = c.H;
                         a.n_kv_heads = c.Hkv;
                         a.causal = c.causal;
                         a.gates = in[1];
                         if (c.pad) a.key_padding = vpad;
                         return attention_varlen(in[0], len, a);
                       },
                       {rnd({n, (c.H + 2 * c.Hkv) * dh}), g}});
    }
  }
  if (op == "rotary")  // partial and full rotary dims, both pairings, positions that are not 0..T-1
    for (const bool interleaved : {false, true})
      for (const int64_t dim : {int64_t{0}, int64_t{2}}) {
        RotaryArgs ra;
        ra.d_head = 4, ra.dim = dim, ra.interleaved = interleaved;
        const Tensor table = rotary_table(16, ra);
        const std::vector<int32_t> pos = {3, 7, 11};
        for (const bool in_place : {false, true})
          cases.push_back({std::string(interleaved ? "interleaved" : "half") + (dim ? " partial" : "") + (in_place ? " in place" : ""),
                           [ra, table, pos, in_place](const std::vector<Tensor>& in) {
                             // 3 heads of 4 of 14 columns: 2 pass through (as v in a packed qkv)
                             return rotary(in_place ? mul_scalar(in[0], 1.f) : in[0], 3, pos, table, ra, in_place);
                           },
                           {rnd({2, 3, 14})}});
      }
  return cases;
}

std::vector<std::string> model_op_names() {
#define HL_NAME(op) #op,
  return {HEADLAB_MODEL_OPS(HL_NAME)};
#undef HL_NAME
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_model_op_has_a_gradcheck) {
  // derived from the op list: an op added to HEADLAB_MODEL_OPS without cases fails here
  for (const std::string& op : model_op_names())
    BOOST_TEST_CONTEXT("op " << op) { BOOST_TEST(!model_op_cases(op).empty()); }
}

BOOST_AUTO_TEST_CASE(every_model_op_passes_gradcheck) {
  for (const std::string& op : model_op_names())
    for (ModelOpCase& oc : model_op_cases(op)) {
      GradcheckResult res = gradcheck(oc.fn, oc.inputs);
      BOOST_TEST_CONTEXT("op " << op << " case " << oc.what) {
        BOOST_TEST(res.ok, res.message);
        BOOST_TEST(res.checked > 0);
      }
    }
}

BOOST_AUTO_TEST_CASE(gate_zero_equals_zeroed_wo_columns) {
  Rng r(3);
  const AttentionConfig cfg = test_attention({.heads = 4, .bias = true});
  MultiHeadAttention gated(cfg, r);
  Rng r2(3);
  MultiHeadAttention zeroed(cfg, r2);
  gated.gates.data()[2] = 0.f;
  for (int64_t row = 0; row < 8; ++row)
    for (int64_t c = 2 * 2; c < 3 * 2; ++c) zeroed.W_O.weight.at({row, c}) = 0.f;
  Tensor x = Tensor::randn({2, 5, 8}, rng());
  MultiHeadAttention::Call call;
  call.causal = true;
  Tensor a = gated.forward(x, Tensor(), call), b = zeroed.forward(x, Tensor(), call);
  BOOST_TEST(a.to_vector() == b.to_vector());  // bit for bit
  // zero-ablation through the hook equals gate 0 as well
  Rng r3(3);
  MultiHeadAttention hooked(cfg, r3);
  Hooks hk;
  hk.add_forward("hook_z", [](const Tensor& z, const std::string&) { return replace_head(z, 2); });
  call.hooks = &hk;
  BOOST_TEST(hooked.forward(x, Tensor(), call).to_vector() == a.to_vector());
}

BOOST_AUTO_TEST_CASE(mha_module_gradcheck_all_variants) {
  struct Cfg { const char* what; int64_t d_model; int H, Hkv; int64_t d_head; bool bias; };
  for (Cfg c : {Cfg{"standard", 8, 2, 0, 0, true}, Cfg{"gqa", 8, 4, 2, 0, false}, Cfg{"mqa", 8, 4, 1, 0, true},
                Cfg{"d_head != d_model/H", 6, 2, 0, 5, true}}) {
    const AttentionConfig cfg =
        test_attention({.d_model = c.d_model, .heads = c.H, .kv_heads = c.Hkv, .d_head = c.d_head, .bias = c.bias});
    Rng r(11);
    MultiHeadAttention mha(cfg, r, nullptr);
    for (int h = 0; h < c.H; ++h) mha.gates.data()[h] = 0.5f + 0.25f * h;
    mha.gates.requires_grad_();
    Tensor xq = rnd({2, 3, c.d_model}), xkv = rnd({2, 4, c.d_model});
    std::vector<Tensor> inputs = mha.parameters();
    inputs.push_back(xq);
    inputs.push_back(xkv);
    inputs.push_back(mha.gates);
    auto fn = [&](const std::vector<Tensor>&) {
      MultiHeadAttention::Call call;
      return mha.forward(xq, xkv, call);  // cross-attention: Tq 3, Tk 4
    };
    GradcheckResult res = gradcheck(fn, inputs);
    BOOST_TEST_CONTEXT(c.what) { BOOST_TEST(res.ok, res.message); }
    inputs.erase(inputs.end() - 2);  // self-attention (the packed path): xq only
    auto self_fn = [&](const std::vector<Tensor>&) {
      MultiHeadAttention::Call call;
      call.causal = true;
      return mha.forward(xq, Tensor(), call);
    };
    GradcheckResult self_res = gradcheck(self_fn, inputs);
    BOOST_TEST_CONTEXT(c.what << " self-attention") { BOOST_TEST(self_res.ok, self_res.message); }
  }
}

BOOST_AUTO_TEST_CASE(kv_cache_decoding_equals_full_forward) {
  // d_head 2: the small-head kernels; 12: the sgemm path (scores from a transposed copy of the
  // cache's first kv_len rows)
  for (int64_t d_model : {8, 48}) {
    const AttentionConfig cfg = test_attention({.d_model = d_model, .heads = 4, .kv_heads = 2});
    Rng r(4);
    MultiHeadAttention mha(cfg, r);
    Tensor x = Tensor::randn({2, 6, d_model}, rng());
    NoGradGuard ng;
    MultiHeadAttention::Call full;
    full.causal = true;
    Tensor all = mha.forward(x, Tensor(), full);
    KVCacheLayer cache;
    MultiHeadAttention::Call inc;
    inc.causal = true;
    inc.kv_cache = &cache;
    Tensor first = mha.forward(slice(x, 1, 0, 3), Tensor(), inc);  // a 3-token prompt
    std::vector<Tensor> parts = {first};
    for (int t = 3; t < 6; ++t) parts.push_back(mha.forward(slice(x, 1, t, t + 1), Tensor(), inc));
    Tensor stitched = concat(parts, 1);
    const roundoff::MhaRef ref = roundoff::bounded_mha(mha, roundoff::from_tensor(x), 2, 6, true);
    BOOST_TEST_CONTEXT("d_model " << d_model) {
      roundoff::check_within(all, ref.out, "full forward");
      roundoff::check_within(stitched, ref.out, "decoded with the cache");
      BOOST_TEST(cache.length() == 6);
    }
  }
}

BOOST_AUTO_TEST_CASE(causal_row_blocks_equal_a_float64_reference) {
  // T >= 64 takes the row-blocked causal path that skips masked scores (d_head 12), or the
  // small-head kernels' blocks of 16 rows (d_head 4; 16: forward only); all report dL/dP. Up to
  // 128 keys the sgemm path's score products read a transposed copy of K (and V in backward);
  // past that (T 150) they stay with OpenBLAS.
  for (int64_t T : {70, 150})
  for (int64_t dh : {4, 12, 16})
  for (int Hkv : {2, 1}) {
    const int64_t H = 2;
    Tensor q = rnd({2, T, H * dh}), k = rnd({2, T, Hkv * dh}), v = rnd({2, T, Hkv * dh});
    Tensor g = Tensor::uniform({H}, rng(), 0.5f, 1.5f).requires_grad_();
    AttentionArgs a;
    a.n_heads = H;
    a.n_kv_heads = Hkv;
    a.causal = true;
    a.gates = g;
    a.pattern_grad = Tensor::zeros({2, H, T, T});
    Tensor up = Tensor::randn({2, T, H * dh}, rng());
    Tensor pattern;
    Tensor fused = attention(q, k, v, a, &pattern);
    fused.backward(up);
    const roundoff::AttnRef ref = bounded_attention(q, k, v, H, Hkv, true, g, up);
    BOOST_TEST_CONTEXT("T " << T << " d_head " << dh << " Hkv " << Hkv) {
      roundoff::check_within(fused, ref.out, "output");
      roundoff::check_within(pattern, ref.P, "pattern");
      roundoff::check_within(q.grad(), ref.dq, "dq");
      roundoff::check_within(k.grad(), ref.dk, "dk");
      roundoff::check_within(v.grad(), ref.dv, "dv");
      roundoff::check_within(g.grad(), ref.dgates, "dgates");
      // dL/dP agrees where keys are visible and is exactly 0 where they are masked
      roundoff::check_within(a.pattern_grad, ref.dP, "dL/dP");
    }
  }
}

BOOST_AUTO_TEST_CASE(recomputed_weights_give_the_kept_weights_gradients_bit_for_bit) {
  // Without `pattern` (training) the sgemm path keeps no P: backward computes each block's weights
  // again. Asking for the pattern keeps P (B,H,Tq,Tk) and backward reads it. Both must give the same
  // output and gradients to the bit: one block (T 33, P kept either way), causal row blocks (70),
  // scores through OpenBLAS (150); GQA, key padding, an additive mask, gates with a gradient; one
  // batch entry with one kv head (backward then runs on the caller, the forward in a parallel
  // region, where products split differently: that case keeps P).
  struct Cfg { int64_t dh, T; int H, Hkv; bool causal, padded, masked; int64_t B = 2; };
  for (Cfg c : {Cfg{12, 33, 2, 2, true, false, false}, Cfg{32, 70, 4, 2, true, true, false},
                Cfg{12, 70, 2, 1, false, true, true}, Cfg{32, 150, 2, 2, true, false, true},
                Cfg{24, 40, 3, 3, false, false, false}, Cfg{64, 300, 4, 1, false, false, false, 1}}) {
    const int64_t B = c.B;
    Tensor q0 = Tensor::randn({B, c.T, c.H * c.dh}, rng()), k0 = Tensor::randn({B, c.T, c.Hkv * c.dh}, rng()),
           v0 = Tensor::randn({B, c.T, c.Hkv * c.dh}, rng()), g0 = Tensor::uniform({c.H}, rng(), 0.5f, 1.5f);
    Tensor up = Tensor::randn({B, c.T, c.H * c.dh}, rng());
    Tensor pad, mask;
    if (c.padded) {  // the second sequence's last 5 keys hidden
      std::vector<float> p(static_cast<size_t>(B * c.T), 0.f);
      for (int64_t j = c.T - 5; j < c.T; ++j) p[static_cast<size_t>((B - 1) * c.T + j)] = 1.f;
      pad = Tensor::from({B, c.T}, p);
    }
    if (c.masked) mask = Tensor::randn({c.T, c.T}, rng());
    struct Run { std::vector<float> out, dq, dk, dv, dg; };
    auto run = [&](bool keep_pattern) {
      Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(), v = v0.detach().requires_grad_();
      Tensor g = g0.detach().requires_grad_();
      AttentionArgs a;
      a.n_heads = c.H;
      a.n_kv_heads = c.Hkv;
      a.causal = c.causal;
      a.gates = g;
      a.key_padding = pad;
      a.additive_mask = mask;
      Tensor pattern;
      Tensor out = attention(q, k, v, a, keep_pattern ? &pattern : nullptr);
      out.backward(up);
      return Run{out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector(),
                 g.grad().to_vector()};
    };
    const Run kept = run(true), recomputed = run(false);
    BOOST_TEST_CONTEXT("d_head " << c.dh << " T " << c.T << " H " << c.H << " Hkv " << c.Hkv << " causal " << c.causal
                                  << " padded " << c.padded << " masked " << c.masked) {
      BOOST_TEST(recomputed.out == kept.out);
      BOOST_TEST(recomputed.dq == kept.dq);
      BOOST_TEST(recomputed.dk == kept.dk);
      BOOST_TEST(recomputed.dv == kept.dv);
      BOOST_TEST(recomputed.dg == kept.dg);
    }
  }
}

BOOST_AUTO_TEST_CASE(one_tensor_as_two_of_q_k_v_sums_their_gradients) {
  // attention(x, x, x) and attention(q, x, x): the gradient of x is the sum of what the roles it
  // plays receive (within the float64 reference's bound), on short slices and on long ones, whose
  // gradients are otherwise summed in separate blocks.
  for (int64_t T : {20, 70})
  for (bool all_three : {true, false}) {
    const int64_t B = 2, H = 2, dh = 32;
    Tensor x = rnd({B, T, H * dh}), q = rnd({B, T, H * dh});
    Tensor up = Tensor::randn({B, T, H * dh}, rng());
    AttentionArgs a;
    a.n_heads = H;
    a.causal = true;
    const Tensor& qq = all_three ? x : q;
    Tensor out = attention(qq, x, x, a);
    out.backward(up);
    const roundoff::AttnRef ref = bounded_attention(qq, x, x, H, H, true, Tensor(), up);
    std::vector<roundoff::Bounded> dx(ref.dk.size());
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = ref.dk[i] + ref.dv[i] + (all_three ? ref.dq[i] : roundoff::Bounded{});
    BOOST_TEST_CONTEXT("T " << T << (all_three ? " attention(x, x, x)" : " attention(q, x, x)")) {
      roundoff::check_within(out, ref.out, "output");
      roundoff::check_within(x.grad(), dx, "dx");
      if (!all_three) roundoff::check_within(q.grad(), ref.dq, "dq");
    }
  }
}

BOOST_AUTO_TEST_CASE(long_slices_accumulate_fill_kv_buffers_and_hide_padded_rows) {
  // The long-slice path (T >= 64: contiguous sums, recomputed weights) where its gradients are
  // not fresh or not every row is a key: a second backward into the same tensors doubles the
  // gradient exactly; keys and values in buffers longer than kv_len give, bit for bit, what
  // buffers of exactly kv_len rows give, and 0 on the rows past it; a sequence whose every key is
  // padded gives zeros and no NaN.
  const int64_t B = 2, T = 70, rows = 80, H = 2, dh = 32;
  Tensor q = rnd({B, T, H * dh}), kb = rnd({B, rows, H * dh}), vb = rnd({B, rows, H * dh});
  Tensor k = slice(kb, 1, 0, T).detach().requires_grad_(), v = slice(vb, 1, 0, T).detach().requires_grad_();
  Tensor up = Tensor::randn({B, T, H * dh}, rng());
  AttentionArgs a;
  a.n_heads = H;
  a.causal = true;
  Tensor exact_rows = attention(q, k, v, a);
  exact_rows.backward(up);
  const std::vector<float> dq1 = q.grad().to_vector(), dk1 = k.grad().to_vector(), dv1 = v.grad().to_vector();
  attention(q, k, v, a).backward(up);  // accumulates
  const std::vector<float> dq2 = q.grad().to_vector();
  for (size_t i = 0; i < dq1.size(); ++i) BOOST_TEST_REQUIRE(dq2[i] == 2.f * dq1[i]);

  a.kv_len = T;
  Tensor q2 = q.detach().requires_grad_();
  Tensor buffered = attention(q2, kb, vb, a);
  buffered.backward(up);
  BOOST_TEST(buffered.to_vector() == exact_rows.to_vector());
  BOOST_TEST(q2.grad().to_vector() == dq1);
  BOOST_TEST(slice(kb.grad(), 1, 0, T).to_vector() == dk1);
  BOOST_TEST(slice(vb.grad(), 1, 0, T).to_vector() == dv1);
  for (float g : slice(kb.grad(), 1, T, rows).to_vector()) BOOST_TEST_REQUIRE(g == 0.f);
  for (float g : slice(vb.grad(), 1, T, rows).to_vector()) BOOST_TEST_REQUIRE(g == 0.f);

  AttentionArgs p;
  p.n_heads = H;
  std::vector<float> pad(static_cast<size_t>(B * T), 0.f);
  std::fill(pad.begin() + T, pad.end(), 1.f);  // the second sequence: every key hidden
  p.key_padding = Tensor::from({B, T}, pad);
  Tensor q3 = q.detach().requires_grad_(), k3 = k.detach().requires_grad_(), v3 = v.detach().requires_grad_();
  Tensor out = attention(q3, k3, v3, p);
  out.backward(up);
  const std::vector<float> o = out.to_vector(), g = q3.grad().to_vector();
  for (int64_t i = B * T * H * dh / 2; i < B * T * H * dh; ++i) {
    BOOST_TEST_REQUIRE(o[static_cast<size_t>(i)] == 0.f);
    BOOST_TEST_REQUIRE(g[static_cast<size_t>(i)] == 0.f);
  }
  for (float x : k3.grad().to_vector()) BOOST_TEST_REQUIRE(std::isfinite(x));
}
