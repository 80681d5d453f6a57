// Edges: the partial forward, exact edge patching (fast path against the hooked reference and a
// model built by hand), edge attribution against finite differences, path patching against
// activation patching, and the messages of bad input.
#define BOOST_TEST_MODULE edges
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "analysis/edges.h"
#include "tests/fixtures.h"

using namespace hl;
using hl::test::error_of;
using hl::test::preset_model;
using hl::test::randomise;
using hl::test::test_model;

namespace {

constexpr auto inputs = hl::test::three_rows_one_token_changed;

// delta_s of every sender (edge_senders order), (B, T, D), computed from the hook points.
std::vector<Tensor> sender_deltas(TransformerLM& m, const PatchingInputs& in) {
  EvalScope mode(m);
  NoGradGuard ng;
  const ActivationCache c = m.run_with_cache(in.clean, all_names()).second, k = m.run_with_cache(in.corrupted, all_names()).second;
  auto embed = [](const ActivationCache& a) { return a.has("hook_pos_embed") ? add(a["hook_embed"], a["hook_pos_embed"]) : a["hook_embed"]; };
  std::vector<Tensor> d = {sub(embed(k), embed(c))};
  for (int l = 0; l < m.cfg.n_layers; ++l) {
    const std::string n = "blocks." + std::to_string(l) + ".attn.hook_result";
    const Tensor &rc = c[n], &rk = k[n];  // (B, T, H, D)
    for (int h = 0; h < m.cfg.n_heads; ++h) {
      Tensor x = Tensor::empty({rc.size(0), rc.size(1), rc.size(3)});
      const int64_t rows = rc.size(0) * rc.size(1), H = rc.size(2), D = rc.size(3);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < D; ++j) x.data()[r * D + j] = rk.data()[(r * H + h) * D + j] - rc.data()[(r * H + h) * D + j];
      d.push_back(x);
    }
  }
  return d;
}

double clean_metric(TransformerLM& m, const PatchingInputs& in) {
  EvalScope mode(m);
  NoGradGuard ng;
  return edge_metric(m.forward(in.clean), in.answers);
}

// Two float32 computations of one logit difference that sum their products in other orders (per
// head or stacked, packed rows or not): each logit is a chain of a few dot products of <= 64
// terms of order 1 through layer norms, so they agree to a few hundred units of round-off.
constexpr double kTol = 2e-5;

EdgeSender s_of(const ModelConfig& c, const std::string& name) { return parse_sender(c, name); }

}  // namespace

BOOST_AUTO_TEST_CASE(forward_from_a_cached_residual_gives_the_forwards_logits_bit_for_bit) {
  for (int64_t d_ff : {12, 0}) {
    TransformerLM m(test_model({.layers = 3, .d_ff = d_ff}), 3);
    randomise(m, 4);
    const PatchingInputs in = inputs();
    EvalScope mode(m);
    NoGradGuard ng;
    const Tensor full = m.forward(in.clean);
    const ActivationCache c = m.run_with_cache(in.clean, [](const std::string& n) {
      return n.ends_with("hook_resid_pre") || n == "blocks.2.hook_resid_post";
    }).second;
    for (int l = 0; l <= 3; ++l) {
      const Tensor from = m.forward_from(l, l < 3 ? c["blocks." + std::to_string(l) + ".hook_resid_pre"] : c["blocks.2.hook_resid_post"]);
      BOOST_TEST_CONTEXT("d_ff " << d_ff << " layer " << l) {
        BOOST_TEST(from.shape() == full.shape());
        BOOST_TEST(std::memcmp(from.data(), full.data(), sizeof(float) * full.numel()) == 0);
      }
    }
    // hooks of the later blocks are honoured: zeroing block 2's attention output changes the logits
    Hooks hk;
    hk.add_forward("blocks.2.hook_attn_out", [](const Tensor& x, const std::string&) { return mul_scalar(x, 0.f); });
    ForwardOptions opt;
    opt.hooks = &hk;
    const Tensor hooked = m.forward_from(1, c["blocks.1.hook_resid_pre"], opt), whole = m.forward(in.clean, opt);
    BOOST_TEST(hooked.to_vector() != full.to_vector());
    BOOST_TEST(hooked.to_vector() == whole.to_vector());
    // packed live positions: the forward's live path from the packed embeddings, bit for bit
    const std::vector<int32_t> live = {5, 0, 6};
    Ids rows(Shape{11});
    for (int i = 0; i < 5; ++i) rows.data[i] = i;
    for (int i = 0; i < 6; ++i) rows.data[5 + i] = 12 + i;
    Ids out(Shape{2}, {4, 10});
    ForwardOptions lo;
    lo.live_len = live;
    lo.output_rows = &out;
    const Tensor packed = m.forward_from(0, gather_rows(c["blocks.0.hook_resid_pre"], rows), lo), ref = m.forward(in.clean, lo);
    BOOST_TEST(packed.to_vector() == ref.to_vector());
    BOOST_TEST((packed.shape() == Shape{2, 7}));
  }
}

BOOST_AUTO_TEST_CASE(edges_are_enumerated_in_forward_order) {
  const ModelConfig c = test_model();  // 2 layers of 2 heads with MLPs
  const auto e = model_edges(c);
  // q/k/v of layer 0: embed only (6); mlp0: embed + 2 heads; layer 1 q/k/v: 3 senders x 6; mlp1 and logits: 5 each
  BOOST_TEST(e.size() == 6u + 3 + 18 + 5 + 5);
  std::vector<std::string> first;
  for (size_t i = 0; i < 10; ++i) first.push_back(e[i].first.name() + ">" + e[i].second.name());
  BOOST_TEST((first == std::vector<std::string>{"embed>L0H0.q", "embed>L0H0.k", "embed>L0H0.v", "embed>L0H1.q", "embed>L0H1.k",
                                                 "embed>L0H1.v", "embed>mlp0", "L0H0>mlp0", "L0H1>mlp0", "embed>L1H0.q"}));
  BOOST_TEST(e.back().first.name() == "L1H1");
  BOOST_TEST(e.back().second.name() == "logits");
  BOOST_TEST(model_edges(test_model({.d_ff = 0})).size() == 6u + 18 + 5);  // attention-only: no MLP receivers
  for (const auto& [s, r] : e) {
    BOOST_TEST((parse_sender(c, s.name()) == s));
    BOOST_TEST((parse_receiver(c, r.name()) == r));
  }
  BOOST_TEST(readers_of(c, parse_sender(c, "L1H0")).size() == 2u);  // mlp1 and logits
  // a parallel block's MLP reads the block's input: a layer's heads do not reach its own MLP
  ModelConfig par = c;
  par.parallel_block = true;
  const auto pe = model_edges(par);
  BOOST_TEST(pe.size() == e.size() - 4);  // L0H0, L0H1 -> mlp0 and L1H0, L1H1 -> mlp1 are gone
  for (const auto& [s, r] : pe)
    if (r.kind == EdgeReceiver::Mlp) BOOST_TEST(s.layer < r.layer);
  BOOST_TEST(is_edge(s_of(c, "L1H0"), parse_receiver(c, "mlp1")));
  BOOST_TEST(!is_edge(par, s_of(c, "L1H0"), parse_receiver(c, "mlp1")));
  BOOST_TEST(is_edge(par, s_of(c, "L0H1"), parse_receiver(c, "mlp1")));
  BOOST_TEST(readers_of(par, parse_sender(c, "L1H0")).size() == 1u);  // logits only
}

BOOST_AUTO_TEST_CASE(exact_edge_patching_matches_the_hooked_reference_for_every_edge) {
  // a gated MLP is replayed through its own forward; RMS norms (Llama's) have their own backward;
  // every block and attention option: the fast path's head replay applies it as the model does,
  // and the hooked reference runs the model itself
  for (const std::string variant :
       {"mlp", "attention-only", "rmsnorm swiglu", "rmsnorm_1p", "parallel", "parallel swiglu rmsnorm", "sandwich layernorm",
        "sandwich rmsnorm_1p geglu", "final softcap", "rotary half", "rotary interleaved partial", "nope", "qk_norm",
        "qk_norm rotary", "attn_scale", "attn_softcap", "sliding window", "sliding window alternate", "qkv_bias o_bias",
        "preset gpt2", "preset llama", "preset neox", "preset gemma2"}) {
    const int64_t d_ff = variant == "attention-only" ? 0 : 12;
    ModelConfig c = test_model({.layers = 3, .d_ff = d_ff});
    if (variant.starts_with("preset ")) {  // d_head 8: neox's quarter turns 2 dims
      c = preset_model(variant.substr(7), test_model({.d_model = 16, .layers = 3, .d_ff = 12}));
      if (variant == "preset gemma2") c.sliding_window = 3;  // 4096 would be global on 6 tokens
    }
    if (variant == "rmsnorm swiglu") c.mlp = Mlp::SwiGLU, c.normalization = NormKind::RMSNorm;
    if (variant == "rmsnorm_1p") c.normalization = NormKind::RMSNorm1p;
    if (variant.starts_with("parallel")) c.parallel_block = true;
    if (variant == "parallel swiglu rmsnorm") c.mlp = Mlp::SwiGLU, c.normalization = NormKind::RMSNorm;
    if (variant.starts_with("sandwich")) c.sandwich_norm = true, c.attn_bias = true;  // W_O's bias inside ln1_post
    if (variant == "sandwich rmsnorm_1p geglu") c.normalization = NormKind::RMSNorm1p, c.mlp = Mlp::GeGLU;
    if (variant == "final softcap") c.final_softcap = 1.5f;  // logits of order 1: the cap bends them
    if (variant.find("rotary") != std::string::npos) c.positions = Positions::Rotary;
    if (variant == "rotary interleaved partial") c.rotary_style = "interleaved", c.rotary_dim = 2;
    if (variant == "nope") c.positions = Positions::None;
    if (variant.starts_with("qk_norm")) c.qk_norm = true;
    if (variant == "attn_scale") c.attn_scale = 1.f;
    if (variant == "attn_softcap") c.attn_softcap = 0.7f;  // scores of order 1: the cap bends them
    if (variant.starts_with("sliding window")) c.sliding_window = variant == "sliding window" ? 3 : 2;
    if (variant == "sliding window alternate") c.window_layers = "alternate";
    if (variant == "qkv_bias o_bias") c.qkv_bias = c.o_bias = true;
    TransformerLM m(c, 5);
    randomise(m, 6);
    m.blocks[1]->attn.gates.data()[1] = 0.5f;  // a gated head: its result carries the gate
    PatchingInputs in = inputs();
    if (d_ff == 0) in.answers.erase(in.answers.begin() + 1);  // a row without answers: computed nowhere
    const EdgeResult r = edge_patching(m, in);
    const auto edges = model_edges(m.cfg);
    BOOST_TEST_REQUIRE(r.edges.size() == edges.size());
    const std::vector<Tensor> deltas = sender_deltas(m, in);
    const double m0 = clean_metric(m, in);
    BOOST_TEST(r.clean_metric == m0);
    double biggest = 0;
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = r.edges[i];
      BOOST_TEST_REQUIRE((e.sender == edges[i].first && e.receiver == edges[i].second));
      const double ref = patched_receiver_metric(m, in, e.receiver, deltas[e.sender.layer < 0 ? 0 : 1 + e.sender.layer * 2 + e.sender.head]) - m0;
      BOOST_TEST_CONTEXT(variant << ": " << e.sender.name() << " -> " << e.receiver.name()) { BOOST_TEST(std::fabs(e.exact - ref) <= kTol); }
      biggest = std::max(biggest, std::fabs(ref));
    }
    BOOST_TEST(biggest > 0.05, variant);  // the edges carry effects far above the tolerance
  }
}

BOOST_AUTO_TEST_CASE(a_model_built_by_hand_carries_everything_on_one_path) {
  // d_model 4, 2 layers of 2 heads of 2, attention-only, no biases, positions zero. Tokens 0 and 1
  // embed as (1,-1,0,0) and (-1,1,0,0); W_Q = W_K = 0 (uniform causal attention); every W_V and
  // W_O zero but L1H0's: v = ln1(x)_0, written as (0, 0, z, -z). Logits of tokens 2 and 3 read
  // dims 2 and 3, so the logit difference is (z + z) / s with s ln_final's divisor.
  ModelConfig c = test_model({.vocab = 4, .d_model = 4, .d_ff = 0, .attn_bias = false});
  TransformerLM m(c, 1);
  for (auto& [name, p] : m.named_parameters())
    for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] = name.find("ln") != std::string::npos && name.ends_with(".weight") ? 1.f : 0.f;
  m.tok_emb.weight.at({0, 0}) = 1, m.tok_emb.weight.at({0, 1}) = -1;
  m.tok_emb.weight.at({1, 0}) = -1, m.tok_emb.weight.at({1, 1}) = 1;
  m.blocks[1]->attn.W_V.weight.at({0, 0}) = 1;   // head 0's first value dim reads ln1(x)_0
  m.blocks[1]->attn.W_O.weight.at({2, 0}) = 1;   // ... written to dim 2
  m.blocks[1]->attn.W_O.weight.at({3, 0}) = -1;  // and minus it to dim 3
  m.head.weight.at({2, 2}) = 1, m.head.weight.at({3, 3}) = 1;
  PatchingInputs in;
  in.clean = Ids(Shape{1, 4}, {0, 0, 0, 0});
  in.corrupted = Ids(Shape{1, 4}, {0, 1, 0, 0});
  in.answers = {{0, 3, 2, 3}};
  // by hand: ln1 of (+-1, -+1, 0, 0) is that / s1, s1 = sqrt(0.5 + eps); at position 3 the head
  // averages 4 values: clean z = 1/s1, corrupted z = (1 - 1 + 1 + 1) / 4 / s1
  const double eps = c.layer_norm_eps, s1 = std::sqrt(0.5 + eps);
  auto metric = [&](double z) { return 2 * z / std::sqrt((1 + z * z) / 2 + eps); };
  const double clean = metric(1 / s1), corrupted = metric(0.5 / s1), carried = corrupted - clean;
  const EdgeResult r = edge_patching(m, in);
  BOOST_TEST(std::fabs(r.clean_metric - clean) <= 1e-6);
  BOOST_TEST(std::fabs(r.corrupted_metric - corrupted) <= 1e-6);
  BOOST_TEST(std::fabs(carried) > 0.3);
  for (const Edge& e : r.edges) {
    const std::string name = e.sender.name() + " -> " + e.receiver.name();
    // the path embed -> L1H0.v -> logits carries the whole effect; nothing else carries any
    const bool on_path = name == "embed -> L1H0.v" || name == "L1H0 -> logits";
    BOOST_TEST_CONTEXT(name) {
      if (on_path) BOOST_TEST(std::fabs(e.exact - carried) <= 1e-6);
      else BOOST_TEST(std::fabs(e.exact) <= 1e-6);
      BOOST_TEST(e.linearisation_error() == e.attribution - e.exact);
    }
  }
  // the flip turns ln1's input into its negative, along which layer norm is flat (but for eps):
  // attribution sees almost nothing of what the edge carries. By hand: d ln1(x)_0 . delta =
  // (-2 + 1/s1^2) / s1 at position 1, times dm/dz / 4.
  const double z = 1 / s1, s = std::sqrt((1 + z * z) / 2 + eps), dm_dz = 2 / s - z * z / (s * s * s);
  const double attr = dm_dz / 4 * (-2 + 1 / (s1 * s1)) / s1;
  for (const Edge& e : r.edges)
    if (e.sender.name() == "embed" && e.receiver.name() == "L1H0.v") {
      BOOST_TEST(std::fabs(attr) < 1e-3);
      BOOST_TEST(std::fabs(e.attribution - attr) <= 1e-6);
    }
}

BOOST_AUTO_TEST_CASE(attribution_is_the_limit_of_exact_patching_of_a_shrinking_delta) {
  // attribution(s -> r) = grad . delta_s; central differences of the hooked exact patching with
  // +-eps delta_s check the gradient at every kind of receiver (through ln1 per head, ln2, ln_final),
  // through layer norms and through Gemma's RMS norms (1 + w)
  for (NormKind kind : {NormKind::LayerNorm, NormKind::RMSNorm1p}) {
  ModelConfig c = test_model({.layers = 2});
  c.normalization = kind;
  TransformerLM m(c, 7);
  randomise(m, 8);
  if (kind == NormKind::RMSNorm1p)  // gains 1 + w near 1, as randomise makes layer norms' w
    for (auto& [name, p] : m.named_parameters())
      if (name.find("ln") != std::string::npos && name.ends_with(".weight"))
        for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] -= 1.f;
  const PatchingInputs in = inputs();
  const EdgeResult r = edge_patching(m, in);
  const std::vector<Tensor> deltas = sender_deltas(m, in);
  const double h = 1e-2;
  int checked = 0;
  for (const Edge& e : r.edges) {
    const Tensor& d = deltas[e.sender.layer < 0 ? 0 : 1 + e.sender.layer * 2 + e.sender.head];
    const double up = patched_receiver_metric(m, in, e.receiver, mul_scalar(d, static_cast<float>(h)));
    const double down = patched_receiver_metric(m, in, e.receiver, mul_scalar(d, static_cast<float>(-h)));
    const double fd = (up - down) / (2 * h);
    // error: O(h^2) of the third derivative, plus the metric's round-off (~1e-6) / h
    BOOST_TEST_CONTEXT(e.sender.name() << " -> " << e.receiver.name()) {
      BOOST_TEST(std::fabs(fd - e.attribution) <= 1e-3 * (1 + std::fabs(e.attribution)));
    }
    ++checked;
  }
  BOOST_TEST(checked == 6 + 3 + 18 + 5 + 5);
  // and receiver_input_gradient is the gradient attribution uses (its sgemm sums the products in
  // float: to their rounding, a few float epsilons of the sum of |products|)
  const Tensor g = receiver_input_gradient(m, in, parse_receiver(m.cfg, "L1H1.k"));
  double dot = 0, magnitude = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    dot += static_cast<double>(g.data()[i]) * deltas[1].data()[i];
    magnitude += std::fabs(static_cast<double>(g.data()[i]) * deltas[1].data()[i]);
  }
  for (const Edge& e : r.edges)
    if (e.sender.name() == "L0H0" && e.receiver.name() == "L1H1.k") BOOST_TEST(std::fabs(e.attribution - dot) <= 1e-6 * magnitude);
  }
}

BOOST_AUTO_TEST_CASE(attribution_through_the_presets_is_the_limit_of_exact_patching_and_its_products_the_dots) {
  // The receivers' gradients come from hook_q/k/v through each head's rows of W_Q/W_K/W_V and the
  // scores from one sgemm per receiver layer: against central differences of exact patching on
  // every edge, through rotary, RMSNorm and gated MLPs (llama) and parallel blocks (neox), with QK-norm
  // on (its norm reads hook_q, after the point the gradient is taken); and the products against
  // per-edge double dots of the same rows.
  for (const std::string arch : {"llama", "neox"}) {
    // neox turns a quarter of each head's dimensions: d_head 8
    ModelConfig c = preset_model(arch, arch == "neox" ? test_model({.d_model = 16, .layers = 2, .heads = 2, .d_ff = 12}) : test_model({.layers = 2}));
    c.qk_norm = true;
    TransformerLM m(c, 5);
    randomise(m, 6);
    const PatchingInputs in = inputs();
    const EdgeResult r = edge_patching(m, in);
    const Tensor deltas = edge_sender_delta_stack(m, in), grads = receiver_gradient_stack(m, in);
    const std::vector<Tensor> d = unstack(deltas), g = unstack(grads);
    const std::vector<EdgeSender> senders = edge_senders(c);
    const std::vector<EdgeReceiver> receivers = edge_receivers(c);
    const std::vector<double> products = edge_products(c, deltas, grads);
    BOOST_TEST(products.size() == r.edges.size());
    // central differences' error O(h^2): a gated MLP's curvature takes 1e-2 to 6e-3 off one edge here
    const double h = 2e-3;
    for (size_t i = 0; i < r.edges.size(); ++i) {
      const Edge& e = r.edges[i];
      const size_t si = static_cast<size_t>(std::find(senders.begin(), senders.end(), e.sender) - senders.begin());
      const size_t ri = static_cast<size_t>(std::find(receivers.begin(), receivers.end(), e.receiver) - receivers.begin());
      double dot = 0, magnitude = 0;
      for (int64_t j = 0; j < d[si].numel(); ++j) {
        dot += static_cast<double>(d[si].data()[j]) * g[ri].data()[j];
        magnitude += std::fabs(static_cast<double>(d[si].data()[j]) * g[ri].data()[j]);
      }
      const double up = patched_receiver_metric(m, in, e.receiver, mul_scalar(d[si], static_cast<float>(h)));
      const double down = patched_receiver_metric(m, in, e.receiver, mul_scalar(d[si], static_cast<float>(-h)));
      BOOST_TEST_CONTEXT(arch << " " << e.sender.name() << " -> " << e.receiver.name()) {
        BOOST_TEST(products[i] == e.attribution);
        BOOST_TEST(std::fabs(products[i] - dot) <= 1e-6 * magnitude);
        BOOST_TEST(std::fabs((up - down) / (2 * h) - e.attribution) <= 1e-3 * (1 + std::fabs(e.attribution)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(path_patching_to_every_reader_is_activation_patching_of_the_sender) {
  for (int64_t d_ff : {12, 0}) {
    TransformerLM m(test_model({.layers = 3, .d_ff = d_ff}), 9);
    randomise(m, 10);
    const PatchingInputs in = inputs();
    for (const EdgeSender& s : edge_senders(m.cfg)) {
      const PathPatchingResult p = path_patching(m, in, s, readers_of(m.cfg, s));
      BOOST_TEST_CONTEXT("d_ff " << d_ff << " " << s.name()) {
        BOOST_TEST(std::fabs(p.path - p.activation) <= kTol);
        BOOST_TEST(p.clean_metric == clean_metric(m, in));
      }
    }
    // one receiver: path patching is that edge's exact patching
    const EdgeResult r = edge_patching(m, in);
    for (const Edge& e : r.edges)
      if (e.sender.name() == "L0H1" && (e.receiver.name() == "L2H0.v" || e.receiver.name() == "logits"))
        BOOST_TEST(std::fabs(path_patching(m, in, e.sender, {e.receiver}).path - e.exact) <= kTol);
  }
}

namespace {
// A multi-head model whose heads come in pairs sharing W_K / W_V rows and biases (head 2g + 1's a
// copy of head 2g's), and the grouped-query model (2 key/value heads) that keeps each pair's once:
// Llama-like blocks with rotary positions, QK-norm and q/k/v biases.
std::pair<std::unique_ptr<TransformerLM>, std::unique_ptr<TransformerLM>> paired_and_grouped() {
  ModelConfig u = test_model({.d_model = 16, .layers = 2, .heads = 4});
  u.positions = Positions::Rotary, u.qk_norm = true, u.qkv_bias = true, u.attn_bias = false;
  u.normalization = NormKind::RMSNorm, u.mlp = Mlp::SwiGLU;
  auto paired = std::make_unique<TransformerLM>(u, 5);
  randomise(*paired, 6);
  ModelConfig g = u;
  g.n_kv_heads = 2;
  auto grouped = std::make_unique<TransformerLM>(g, 5);
  const int64_t dh = u.head_dim();
  for (auto& [name, p] : paired->named_parameters()) {
    Tensor q = grouped->parameter(name);
    if (q.shape() == p.shape()) {
      q.copy_from(p);
      continue;
    }
    const int64_t block = dh * (p.ndim() == 2 ? p.size(1) : 1);  // one head's rows
    for (int64_t kv = 0; kv < 2; ++kv) {
      std::copy_n(p.data() + 2 * kv * block, block, p.data() + (2 * kv + 1) * block);  // the pair shares its rows
      std::copy_n(p.data() + 2 * kv * block, block, q.data() + kv * block);
    }
  }
  return {std::move(paired), std::move(grouped)};
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_grouped_query_model_runs_the_edge_analyses_ungrouped) {
  auto [paired, grouped] = paired_and_grouped();
  const PatchingInputs in = inputs();
  {  // the same function: the grouped forward gives the paired model's logits (other kernels: round-off)
    EvalScope a(*paired), b(*grouped);
    NoGradGuard ng;
    const Tensor x = paired->forward(in.clean), y = grouped->forward(in.clean);
    for (int64_t i = 0; i < x.numel(); ++i) BOOST_TEST(std::fabs(x.data()[i] - y.data()[i]) <= 1e-5f * (1 + std::fabs(x.data()[i])));
  }
  // ungrouping gives the paired model's parameters bit for bit, and so its logits and edges
  const EdgeModel em = edge_model(*grouped);
  BOOST_TEST_REQUIRE(em.ungrouped != nullptr);
  BOOST_TEST(em->cfg.kv_heads() == 4);
  const auto want = paired->named_parameters(), got = em->named_parameters();
  BOOST_TEST_REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i)
    BOOST_TEST(std::memcmp(want[i].second.data(), got[i].second.data(), 4 * want[i].second.numel()) == 0, want[i].first);
  const EdgeResult r = edge_patching(*em, in), ref = edge_patching(*paired, in);
  BOOST_TEST_REQUIRE(r.edges.size() == ref.edges.size());
  for (size_t i = 0; i < r.edges.size(); ++i) {
    BOOST_TEST(r.edges[i].exact == ref.edges[i].exact);
    BOOST_TEST(r.edges[i].attribution == ref.edges[i].attribution);
  }
  // a .k / .v receiver is one query head's copy: every one equals the hooked reference on the paired model
  const std::vector<Tensor> deltas = sender_deltas(*paired, in);
  const double m0 = clean_metric(*paired, in);
  for (const Edge& e : r.edges)
    if (e.receiver.kind == EdgeReceiver::K || e.receiver.kind == EdgeReceiver::V) {
      const double hooked = patched_receiver_metric(*paired, in, e.receiver, deltas[e.sender.layer < 0 ? 0 : 1 + e.sender.layer * 4 + e.sender.head]) - m0;
      BOOST_TEST_CONTEXT(e.sender.name() << " -> " << e.receiver.name()) { BOOST_TEST(std::fabs(e.exact - hooked) <= kTol); }
    }
  // the shared key head of the grouped model (what both heads of the group read) patched through
  // its hook is path patching to both copies, and differs from patching one copy alone
  const EdgeSender s = s_of(em->cfg, "L0H1");
  const Tensor delta = deltas[2];
  Tensor resid;
  {
    EvalScope mode(*grouped);
    NoGradGuard ng;
    resid = grouped->run_with_cache(in.clean, name_is("blocks.1.hook_resid_pre")).second["blocks.1.hook_resid_pre"];
  }
  const Tensor moved = grouped->blocks[1]->ln1.forward(add(resid, delta));  // (B, T, D): what the key input reads
  Hooks hooks;
  hooks.add_forward("blocks.1.attn.hook_k_input", [&](const Tensor& x, const std::string&) {  // (B, T, 2, D)
    Tensor y = x.clone();
    const int64_t rows = x.size(0) * x.size(1), D = x.size(3);
    for (int64_t t = 0; t < rows; ++t) std::copy_n(moved.data() + t * D, D, y.data() + (t * 2 + 1) * D);  // kv head 1
    return y;
  });
  double shared;
  {
    EvalScope mode(*grouped);
    NoGradGuard ng;
    ForwardOptions opt;
    opt.hooks = &hooks;
    shared = edge_metric(grouped->forward(in.clean, opt), in.answers) - m0;
  }
  const double both = path_patching(*em, in, s, {parse_receiver(em->cfg, "L1H2.k"), parse_receiver(em->cfg, "L1H3.k")}).path;
  BOOST_TEST(std::fabs(shared - both) <= kTol);
  double one = 0;
  for (const Edge& e : r.edges)
    if (e.sender == s && e.receiver.name() == "L1H2.k") one = e.exact;
  BOOST_TEST(std::fabs(shared - one) > 100 * kTol);  // the finer intervention
  // post-norm models stay refused, saying why
  TransformerLM post(test_model({.norm = Norm::Post}), 1);
  BOOST_TEST(error_of([&] { (void)edge_model(post); }).find("not the sum of the senders' outputs") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_input_is_refused_with_one_message) {
  TransformerLM m(test_model(), 1);
  const ModelConfig& c = m.cfg;
  auto has = [](const std::string& msg, const std::string& part) {
    BOOST_TEST_CONTEXT(msg) { BOOST_TEST(msg.find(part) != std::string::npos); }
  };
  has(error_of([&] { parse_sender(c, "head3"); }), "unknown sender 'head3'");
  has(error_of([&] { parse_sender(c, "L2H0"); }), "layer 2 is outside 0..1");
  has(error_of([&] { parse_sender(c, "L0H5"); }), "head 5 is outside 0..1");
  has(error_of([&] { parse_receiver(c, "L0H0.x"); }), "unknown receiver 'L0H0.x'");
  has(error_of([&] { parse_receiver(c, "mlp7"); }), "layer 7 is outside 0..1");
  has(error_of([&] { parse_receiver(test_model({.d_ff = 0}), "mlp0"); }), "attention-only");
  PatchingInputs in = inputs();
  has(error_of([&] { path_patching(m, in, parse_sender(c, "L1H0"), {parse_receiver(c, "L1H1.q")}); }),
      "L1H0 is written after L1H1.q reads");
  has(error_of([&] { path_patching(m, in, parse_sender(c, "L0H0"), {}); }), "at least one receiver");
  has(error_of([&] { path_patching(m, in, parse_sender(c, "L0H0"), {parse_receiver(c, "logits"), parse_receiver(c, "logits")}); }),
      "given twice");
  PatchingInputs none = in;
  none.answers.clear();
  has(error_of([&] { edge_patching(m, none); }), "no answers");
  PatchingInputs shorter = in;
  shorter.corrupted = Ids(Shape{3, 5});
  has(error_of([&] { edge_patching(m, shorter); }), "must be (B, T) of one shape");
  PatchingInputs outside = in;
  outside.answers[0].pos = 6;
  has(error_of([&] { edge_patching(m, outside); }), "is outside the ids");
  TransformerLM post(test_model({.norm = Norm::Post}), 1);
  has(error_of([&] { edge_patching(post, in); }), "post-norm (norm = post)");
  TransformerLM gqa(test_model({.heads = 2, .kv_heads = 1}), 1);
  has(error_of([&] { edge_patching(gqa, in); }), "n_kv_heads 1 of n_heads 2");
  has(error_of([&] { m.forward_from(3, Tensor::zeros({1, 2, 8})); }), "layer 3 is outside 0..2");
  has(error_of([&] { m.forward_from(0, Tensor::zeros({1, 2, 5})); }), "(B, T, 8)");
}

BOOST_AUTO_TEST_CASE(the_memory_estimate_counts_what_the_edge_analyses_hold_beyond_the_loaded_model) {
  // Qwen2.5-0.5B's shape (its config.json; nothing allocated): two rows of 128 tokens were refused
  // at 19.8 GiB with 17.2 available, counting training's weights, gradients and Adam moments and
  // a batch of 2^16 patched rows. What the analyses hold beyond the loaded model: its ungrouped
  // copy, the activations of one backward (no parameter gradients), the caches and deltas, and a
  // batch of at most 8192 patched rows
  ModelConfig q;
  q.vocab_size = 151936, q.d_model = 896, q.n_layers = 24, q.n_heads = 14, q.n_kv_heads = 2, q.d_ff = 4864, q.max_seq_len = 32768;
  q.positions = Positions::Rotary, q.normalization = NormKind::RMSNorm, q.mlp = Mlp::SwiGLU, q.qkv_bias = true;
  ModelConfig ungrouped = q;
  ungrouped.n_kv_heads = 0;
  const double copy = 4.0 * static_cast<double>(parameter_count(ungrouped)), gib = 1024.0 * 1024 * 1024;
  const double need = edge_patching_memory_bytes(q, 2, 128);
  BOOST_TEST(need > copy + 0.5 * gib);  // the copy and the work beside it
  BOOST_TEST(need < copy + 6.0 * gib, need / gib << " GiB");  // 19.8 GiB before
  // the work grows with the rows and tokens; a model without grouped queries has no copy
  BOOST_TEST(edge_patching_memory_bytes(q, 4, 128) > need);
  BOOST_TEST(edge_patching_memory_bytes(ungrouped, 2, 128) < need - copy + 1.0);
}
