// The residual stream as components and direct logit attribution (analysis/decompose.h): the
// components sum to the cached residual at every layer, the attributions plus the bias term are
// the model's logits, one head's attribution recomputed from hook_z and the weights, and bad
// input refused with one message.
#define BOOST_TEST_MODULE decompose
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <random>

#include "analysis/circuits.h"
#include "analysis/decompose.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;

namespace {

constexpr double u = 0x1p-24;  // float32 unit round-off

const Ids ids() { return Ids(Shape{2, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 6, 5}); }

// Every parameter drawn again from U(-0.6, 0.6): layer norm weights and biases far from 1 and 0,
// so that a term left out or a weight not folded in shows.
std::unique_ptr<TransformerLM> random_model(ModelConfig c, uint64_t seed) {
  auto model = std::make_unique<TransformerLM>(c, seed);
  TransformerLM& m = *model;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> U(-0.6f, 0.6f);
  for (auto& [name, p] : m.named_parameters())
    for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] = U(rng) + (name.find("ln") != std::string::npos && name.find("weight") != std::string::npos ? 1.f : 0.f);
  return model;
}

std::vector<ModelConfig> configs() {
  ModelConfig attn_only = test_model({.attn_bias = false});
  attn_only.d_ff = 0;
  ModelConfig head_bias = test_model({.layers = 3, .heads = 4, .kv_heads = 2});
  head_bias.head_bias = true;
  // the block options: RMS norms (no centring, no bias; 1 + w), sandwich norms (each head's
  // share of the norm's output by its cached scale), parallel blocks, gated MLPs, scaled embeddings
  auto with = [](auto set) {
    ModelConfig c = test_model();
    set(c);
    return c;
  };
  return {test_model(), attn_only, head_bias,
          with([](ModelConfig& c) { c.normalization = NormKind::RMSNorm; }),
          with([](ModelConfig& c) { c.normalization = NormKind::RMSNorm1p; c.sandwich_norm = true; c.embed_scale = true; }),
          with([](ModelConfig& c) { c.sandwich_norm = true; c.mlp = Mlp::GeGLU; }),
          with([](ModelConfig& c) { c.parallel_block = true; c.mlp = Mlp::SwiGLU; c.normalization = NormKind::RMSNorm; }),
          with([](ModelConfig& c) { c.parallel_block = true; c.sandwich_norm = true; c.d_ff = 0; })};
}

}  // namespace

BOOST_AUTO_TEST_CASE(hook_scale_is_the_layer_norm_divisor) {
  const auto mp = random_model(test_model(), 3);
  TransformerLM& m = *mp;
  NoGradGuard ng;
  auto [logits, cache] = m.run_with_cache(ids(), all_names());
  const int64_t D = 8;
  auto check = [&](const std::string& scale, const std::string& resid, const std::string& normalized, const LayerNorm& ln) {
    const Tensor &s = cache[scale], &x = cache[resid], &y = cache[normalized];
    BOOST_TEST_REQUIRE(s.shape() == Shape({2, 6, 1}));
    for (int64_t r = 0; r < 12; ++r) {
      double mu = 0, var = 0;
      for (int64_t d = 0; d < D; ++d) mu += x.data()[r * D + d] / static_cast<double>(D);
      for (int64_t d = 0; d < D; ++d) var += std::pow(x.data()[r * D + d] - mu, 2) / static_cast<double>(D);
      const double want = std::sqrt(var + 1e-5);
      BOOST_TEST(std::fabs(s.data()[r] - want) <= u * want, scale << " row " << r);
      for (int64_t d = 0; d < D; ++d) {  // the normalized output is (x - mean) / scale * w + b
        const double n = (x.data()[r * D + d] - mu) / want * ln.weight.data()[d] + ln.bias.data()[d];
        BOOST_TEST(std::fabs(y.data()[r * D + d] - n) <= 1e-5 * (1 + std::fabs(n)), normalized);
      }
    }
  };
  check("blocks.0.ln1.hook_scale", "blocks.0.hook_resid_pre", "blocks.0.ln1.hook_normalized", m.blocks[0]->ln1);
  check("blocks.1.ln2.hook_scale", "blocks.1.hook_resid_mid", "blocks.1.ln2.hook_normalized", *m.blocks[1]->ln2);
  check("ln_final.hook_scale", "blocks.1.hook_resid_post", "ln_final.hook_normalized", *m.ln_f);
  // A replaced scale is used: twice the scale halves the centred part of the normalized output.
  Hooks h;
  h.add_forward("ln_final.hook_scale", [](const Tensor& s, const std::string&) { return mul_scalar(s, 2.f); });
  ActivationCache doubled;
  h.cache(doubled, name_is("ln_final.hook_normalized"));
  ForwardOptions opt;
  opt.hooks = &h;
  m.forward(ids(), opt);
  const Tensor &y1 = cache["ln_final.hook_normalized"], &y2 = doubled["ln_final.hook_normalized"];
  for (int64_t i = 0; i < y1.numel(); ++i) {
    const double b = m.ln_f->bias.data()[i % D];
    BOOST_TEST(std::fabs((y2.data()[i] - b) - 0.5 * (y1.data()[i] - b)) <= 1e-5 * (1 + std::fabs(y1.data()[i])));
  }
}

BOOST_AUTO_TEST_CASE(hook_scale_is_listed_for_pre_norm_models_only) {
  auto listed = [](const ModelConfig& c) {
    std::vector<std::string> s;
    for (auto& [name, shape] : hook_points(c))
      if (name.find("hook_scale") != std::string::npos) s.push_back(name + " " + shape);
    return s;
  };
  BOOST_TEST(listed(test_model()) == (std::vector<std::string>{"blocks.0.ln1.hook_scale (B, T, 1)", "blocks.0.ln2.hook_scale (B, T, 1)",
                                                                "blocks.1.ln1.hook_scale (B, T, 1)", "blocks.1.ln2.hook_scale (B, T, 1)",
                                                                "ln_final.hook_scale (B, T, 1)"}));
  ModelConfig attn_only = test_model({.layers = 1});
  attn_only.d_ff = 0;
  BOOST_TEST(listed(attn_only) == (std::vector<std::string>{"blocks.0.ln1.hook_scale (B, T, 1)", "ln_final.hook_scale (B, T, 1)"}));
  BOOST_TEST(listed(test_model({.norm = Norm::Post})).empty());
  // before the normalized output it divides
  std::vector<std::string> names;
  for (auto& [name, shape] : hook_points(test_model())) names.push_back(name);
  const auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  BOOST_TEST(at("ln_final.hook_scale") + 1 == at("ln_final.hook_normalized"));
  BOOST_TEST(at("blocks.1.ln1.hook_scale") + 1 == at("blocks.1.ln1.hook_normalized"));
}

BOOST_AUTO_TEST_CASE(components_sum_to_the_residual_at_every_layer) {
  for (const ModelConfig& c : configs()) {
    const auto mp = random_model(c, 5);
  TransformerLM& m = *mp;
    NoGradGuard ng;
    auto [logits, cache] = m.run_with_cache(ids(), decomposition_hooks());
    const int L = c.n_layers;
    const int64_t D = c.d_model, BT = 12;
    for (int layer = 0; layer <= L; ++layer) {
      const ResidStack s = decompose_resid(m, cache, layer);
      const int64_t C = s.components();
      const bool norm_bias = c.sandwich_norm && c.normalization == NormKind::LayerNorm;  // "{l}_attn_norm_bias"
      BOOST_TEST(C == 2 + layer * (c.n_heads + (c.attn_bias ? 1 : 0) + (norm_bias ? 1 : 0) + (c.has_mlp() ? 1 : 0)));
      BOOST_TEST(s.labels[0] == "embed");
      BOOST_TEST(s.labels[1] == "pos_embed");
      if (layer > 0) BOOST_TEST(s.labels[2] == "L0H0");
      if (layer > 0 && c.has_mlp()) BOOST_TEST(s.labels[C - 1] == std::to_string(layer - 1) + "_mlp_out");
      const Tensor& resid = layer < L ? cache["blocks." + std::to_string(layer) + ".hook_resid_pre"]
                                      : cache["blocks." + std::to_string(L - 1) + ".hook_resid_post"];
      // the model adds these in float32 (~2L residual adds, W_O's and fc2's dot products of
      // <= 16 terms): 1e-5 (~170 u) of the summed magnitudes bounds that with room
      const ResidStack acc = accumulated_resid(m, cache, layer);
      for (int64_t i = 0; i < BT * D; ++i) {
        double sum = 0, mag = 0;
        for (int64_t k = 0; k < C; ++k) {
          sum += s.values[k * BT * D + i];
          mag += std::fabs(s.values[k * BT * D + i]);
        }
        BOOST_TEST(std::fabs(sum - resid.data()[i]) <= 1e-5 * (1 + mag), "layer " << layer << " element " << i);
        BOOST_TEST(acc.values[layer * BT * D + i] == resid.data()[i]);
      }
      // one position is that position's slice
      const ResidStack one = decompose_resid(m, cache, layer, 4);
      BOOST_TEST(one.shape == (std::vector<int64_t>{C, 2, D}));
      for (int64_t k = 0; k < C; ++k)
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t d = 0; d < D; ++d)
            BOOST_TEST(one.values[(k * 2 + b) * D + d] == s.values[((k * 2 + b) * 6 + 4) * D + d]);
    }
    const ResidStack heads = stack_head_results(m, cache, L);
    BOOST_TEST(heads.components() == L * c.n_heads);
    BOOST_TEST(heads.labels.back() == "L" + std::to_string(L - 1) + "H" + std::to_string(c.n_heads - 1));
    const ResidStack acc = accumulated_resid(m, cache, L);
    BOOST_TEST(acc.labels.front() == "0_pre");
    BOOST_TEST(acc.labels.back() == "final_post");
  }
}

BOOST_AUTO_TEST_CASE(logit_attributions_and_the_bias_term_sum_to_the_logits) {
  for (const ModelConfig& c : configs()) {
    const auto mp = random_model(c, 7);
  TransformerLM& m = *mp;
    NoGradGuard ng;
    auto [logits, cache] = m.run_with_cache(ids(), decomposition_hooks());
    const int L = c.n_layers;
    const int64_t D = c.d_model, V = c.vocab_size;
    const ResidStack scaled = apply_ln_to_stack(m, cache, decompose_resid(m, cache, L), L);
    const int64_t C = scaled.components();
    for (int32_t tok = 0; tok < V; ++tok) {
      const int32_t other = (tok + 3) % static_cast<int32_t>(V);
      const TokenChoice one{{}, {tok}}, wrong{{}, {other}};
      const ResidStack a = logit_attrs(m, scaled, one), diff = logit_attrs(m, scaled, one, &wrong);
      BOOST_TEST(a.shape == (std::vector<int64_t>{C, 2, 6}));
      for (int64_t r = 0; r < 12; ++r) {
        double sum = final_bias_term(m, tok), dsum = final_bias_term(m, tok, other), mag = std::fabs(sum);
        for (int64_t k = 0; k < C; ++k) {
          sum += a.values[k * 12 + r];
          dsum += diff.values[k * 12 + r];
          for (int64_t d = 0; d < D; ++d)  // |each product| of the projection
            mag += std::fabs(scaled.values[(k * 12 + r) * D + d] * m.ln_f->gain(d) * m.head.weight.data()[tok * D + d]);
        }
        // the model's logit is a float32 layer norm and a dot product of D terms: each term
        // carries at most ~(D + 8) u of its size, so 4 (D + 8) u * (the sum of |terms|)
        const double tol = 4.0 * static_cast<double>(D + 8) * u * mag + 1e-6;
        const double logit = logits.data()[r * V + tok], logit_other = logits.data()[r * V + other];
        BOOST_TEST(std::fabs(sum - logit) <= tol, "token " << tok << " position " << r);
        BOOST_TEST(std::fabs(dsum - (logit - logit_other)) <= 3 * tol, "token " << tok << " position " << r);
      }
    }
    // per-position tokens: the same as one token at a time
    TokenChoice per{{2, 6}, {}};
    for (int i = 0; i < 12; ++i) per.ids.push_back(ids().data[i]);
    const ResidStack a = logit_attrs(m, scaled, per);
    for (int64_t r = 0; r < 12; ++r) {
      const ResidStack b = logit_attrs(m, scaled, TokenChoice{{}, {per.ids[r]}});
      for (int64_t k = 0; k < C; ++k) BOOST_TEST(a.values[k * 12 + r] == b.values[k * 12 + r]);
    }
  }
}

BOOST_AUTO_TEST_CASE(one_heads_attribution_recomputed_from_hook_z_and_the_weights) {
  ModelConfig c = test_model({.heads = 4});
  const auto mp = random_model(c, 11);
  TransformerLM& m = *mp;
  NoGradGuard ng;
  auto [logits, cache] = m.run_with_cache(ids(), all_names());
  const int layer = 1, head = 2;
  const int64_t D = 8, dh = 2, pos = 3;
  const int32_t tok = 5;
  const ResidStack heads = apply_ln_to_stack(m, cache, stack_head_results(m, cache, 2, pos), 2, pos);  // (8, 2, D)
  const ResidStack a = logit_attrs(m, heads, TokenChoice{{}, {tok}});                                    // (8, 2)
  const Tensor &z = cache["blocks.1.attn.hook_z"], &scale = cache["ln_final.hook_scale"];                 // (B, T, H, dh), (B, T, 1)
  const Tensor WO = head_cols(m.blocks[layer]->attn.W_O.weight, head, dh);                              // (D, dh)
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<double> r(D, 0.0);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < dh; ++j) r[d] += static_cast<double>(WO.data()[d * dh + j]) * z.data()[((b * 6 + pos) * 4 + head) * dh + j];
    double mu = 0, want = 0;
    for (double v : r) mu += v / D;
    for (int64_t d = 0; d < D; ++d)
      want += (r[d] - mu) / scale.data()[b * 6 + pos] * m.ln_f->weight.data()[d] * m.head.weight.data()[tok * D + d];
    BOOST_TEST(std::fabs(a.values[(layer * 4 + head) * 2 + b] - want) <= 1e-5 * (1 + std::fabs(want)));
  }
}

BOOST_AUTO_TEST_CASE(per_token_loss_averages_to_the_mean_cross_entropy) {
  const auto mp = random_model(test_model(), 13);
  TransformerLM& m = *mp;
  NoGradGuard ng;
  const Tensor logits = m.forward(ids());
  const Ids targets(Shape{2, 6}, {3, 5, 2, 6, 0, -1, 4, 1, -1, 2, 6, 5});
  const std::vector<double> loss = per_token_loss(logits, targets);
  double sum = 0;
  for (size_t i = 0; i < loss.size(); ++i) sum += loss[i];
  BOOST_TEST(loss[5] == 0.0);
  BOOST_TEST(loss[8] == 0.0);
  BOOST_TEST(std::fabs(sum / 10 - cross_entropy(logits, targets).item()) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(bad_input_is_refused_with_one_message) {
  const auto mp = random_model(test_model(), 1);
  TransformerLM& m = *mp;
  NoGradGuard ng;
  auto [logits, cache] = m.run_with_cache(ids(), decomposition_hooks());
  BOOST_TEST(error_of([&] { decompose_resid(m, cache, 3); }) ==
             "decompose_resid: layer 3 is outside 0..2 (2 = the final residual stream; the model has 2 layers)");
  BOOST_TEST(error_of([&] { decompose_resid(m, cache, 1, 6); }) ==
             "decompose_resid: position 6 is outside 0..5 (the cached sequence has 6 tokens)");
  auto [l2, partial] = m.run_with_cache(ids(), names_in({"hook_embed", "hook_pos_embed"}));
  BOOST_TEST(error_of([&] { decompose_resid(m, partial, 1); }) ==
             "decompose_resid: the cache has no blocks.0.attn.hook_result (run_with_cache with every hook point: "
             "names=None from Python, decomposition_hooks() from C++)");
  const ResidStack s = decompose_resid(m, cache, 2);
  BOOST_TEST(error_of([&] { apply_ln_to_stack(m, cache, s, 2, 1); }) ==
             "apply_ln_to_stack: the stack has shape (10, 2, 6, 8) but this cache and position need (components, 2, 8)");
  BOOST_TEST(error_of([&] { logit_attrs(m, s, TokenChoice{{2}, {1, 2}}); }) ==
             "logit_attrs: tokens have shape (2) but the stack's positions are (2, 6): give one token or one per position");
  BOOST_TEST(error_of([&] { logit_attrs(m, s, TokenChoice{{}, {7}}); }) ==
             "logit_attrs: tokens: token 7 is outside the vocabulary 0..6");
  TransformerLM post(test_model({.norm = Norm::Post}), 1);
  auto [l3, pc] = post.run_with_cache(ids(), all_names());
  BOOST_TEST(error_of([&] { decompose_resid(post, pc, 1); }).find("needs a pre-norm model") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(copying_score_of_an_identity_ov_circuit_with_tied_embeddings) {
  // One head of width d_model, W_V = I and W_O = +-I, W_U = W_E^T (tied) and layer norm weights 1:
  // the full OV circuit is +-W_E^T W_E, positive (negative) semi-definite: score +1 (-1).
  ModelConfig c = test_model({.vocab = 11, .heads = 1});
  c.d_ff = 0;
  for (float sign : {1.f, -1.f}) {
    const auto mp = random_model(c, 17);
    TransformerLM& m = *mp;
    for (auto* ln : {&m.blocks[0]->ln1, &m.blocks[1]->ln1, m.ln_f.get()}) ln->weight.fill_(1.f);
    std::copy(m.tok_emb.weight.data(), m.tok_emb.weight.data() + m.tok_emb.weight.numel(), m.head.weight.data());
    auto& a = m.blocks[1]->attn;
    a.W_V.weight.fill_(0.f);
    a.W_O.weight.fill_(0.f);
    for (int64_t i = 0; i < 8; ++i) a.W_V.weight.data()[i * 8 + i] = 1.f, a.W_O.weight.data()[i * 8 + i] = sign;
    const auto ev = ov_circuit_eigenvalues(m, 1, 0);
    BOOST_TEST(ev.size() == 8u);
    for (const auto& l : ev) BOOST_TEST(sign * l.real() > 0);
    BOOST_TEST(std::fabs(copying_score(m, 1, 0) - sign) <= 1e-12);
  }
}

BOOST_AUTO_TEST_CASE(ov_eigenvalues_sum_to_the_trace_of_the_full_circuit) {
  // sum of eigenvalues = trace(W_U' W_O W_V' W_E) over the vocabulary, computed here the long way;
  // the gains folded (1 + w for rmsnorm_1p, the sandwich norm's after W_O), the embedding scale in
  for (bool gemma : {false, true}) {
  ModelConfig c = test_model({.vocab = 9, .heads = 2});
  if (gemma) c.normalization = NormKind::RMSNorm1p, c.sandwich_norm = true, c.embed_scale = true;
  const auto mp = random_model(c, 19);
  const TransformerLM& m = *mp;
  const double emb = gemma ? std::sqrt(8.f) : 1.0;
  auto post = [&](int64_t d) { return gemma ? m.blocks[1]->ln1_post->gain(d) : 1.0; };
  const int64_t D = 8, dh = 4, V = 9;
  for (int head = 0; head < 2; ++head) {
    const auto& a = m.blocks[1]->attn;
    double trace = 0;
    for (int64_t v = 0; v < V; ++v) {  // logit of v raised by token v: U'[v] W_O W_V' E[v]
      std::vector<double> val(dh, 0.0), out(D, 0.0);
      for (int64_t k = 0; k < dh; ++k)
        for (int64_t d = 0; d < D; ++d)
          val[k] += static_cast<double>(a.W_V.weight.data()[(head * dh + k) * D + d]) * m.blocks[1]->ln1.gain(d) * m.tok_emb.weight.data()[v * D + d] * emb;
      for (int64_t d = 0; d < D; ++d)
        for (int64_t k = 0; k < dh; ++k) out[d] += static_cast<double>(a.W_O.weight.data()[d * 2 * dh + head * dh + k]) * val[k];
      for (int64_t d = 0; d < D; ++d) trace += static_cast<double>(m.head.weight.data()[v * D + d]) * m.ln_f->gain(d) * post(d) * out[d];
    }
    double sum = 0, mag = 0;
    for (const auto& l : ov_circuit_eigenvalues(m, 1, head)) sum += l.real(), mag += std::abs(l);
    BOOST_TEST(std::fabs(sum - trace) <= 1e-10 * (1 + mag));
    BOOST_TEST(std::fabs(copying_score(m, 1, head) - sum / mag) <= 1e-12);
  }
  BOOST_TEST(error_of([&] { ov_circuit_eigenvalues(m, 2, 0); }) == "ov_circuit_eigenvalues: head (2, 0) is outside 2 layers x 2 heads");
  }
}
