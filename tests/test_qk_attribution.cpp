// QK attribution (analysis/qk_attribution.h): the pairs sum to the score the model computed for
// every head, query and key (LayerNorm and RMSNorm, with biases and MLPs); on the planted
// induction circuit the induction head's score is the query's token against the previous-token
// head's key part; the refused options and bad arguments get one line.
#define BOOST_TEST_MODULE qk_attribution
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>

#include "analysis/planted_circuits.h"
#include "analysis/qk_attribution.h"
#include "tests/fixtures.h"

using namespace hl;
using hl::test::error_of;
using hl::test::preset_model;
using hl::test::randomise;
using hl::test::test_model;

// Every head, query and key of two rows: the pairs sum to hook_attn_scores. Rotary positions,
// QK-norm, soft-caps (the score is before the cap), parallel blocks, gated MLPs and the llama and
// neox presets are exact too (rotary and QK-norm models were refused before; with the parts left
// unturned the rotary cases miss the score by up to 14, unnormalised the QK-norm case by 20).
BOOST_AUTO_TEST_CASE(the_pairs_sum_to_the_score_for_every_head_query_and_key) {
  const Ids ids(Shape{2, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 0, 3});
  const ModelConfig base = test_model({.layers = 3, .heads = 2, .d_ff = 12});
  std::vector<std::pair<std::string, ModelConfig>> variants;
  auto add = [&](const std::string& name, const std::function<void(ModelConfig&)>& f) {
    ModelConfig c = base;
    f(c);
    variants.push_back({name, c});
  };
  add("layernorm", [](ModelConfig&) {});
  add("rmsnorm", [](ModelConfig& c) { c.normalization = NormKind::RMSNorm; });
  add("attention-only grouped", [](ModelConfig& c) { c.d_ff = 0, c.n_heads = 4, c.n_kv_heads = 2; });
  add("rotary half", [](ModelConfig& c) { c.positions = Positions::Rotary; });
  add("rotary interleaved partial", [](ModelConfig& c) {
    c.positions = Positions::Rotary, c.rotary_style = "interleaved", c.rotary_dim = 2, c.rope_theta = 100.f;
  });
  add("qk-norm rotary grouped", [](ModelConfig& c) { c.positions = Positions::Rotary, c.qk_norm = true, c.n_heads = 4, c.n_kv_heads = 2; });
  add("soft-cap window", [](ModelConfig& c) { c.attn_softcap = 2.f, c.sliding_window = 3, c.window_layers = "alternate"; });
  add("llama", [&](ModelConfig& c) { c = preset_model("llama", base); });
  // neox turns a quarter of each head: d_head 8 so that 2 dims turn
  add("neox", [&](ModelConfig& c) { c = preset_model("neox", test_model({.d_model = 16, .layers = 3, .heads = 2, .d_ff = 12})); });
  for (const auto& [variant, c] : variants) {
    TransformerLM m(c, 3);
    randomise(m, 11);
    size_t checked = 0;
    double worst = 0;
    for (int64_t row = 0; row < 2; ++row)
      for (int l = 0; l < c.n_layers; ++l)
        for (int h = 0; h < c.n_heads; ++h)
          for (int64_t q = 0; q < 6; ++q)
            for (int64_t k = c.window_of_layer(l) ? std::max<int64_t>(0, q - c.window_of_layer(l) + 1) : 0; k <= q; ++k) {
              const QkAttribution a = qk_attribution(m, ids, row, l, h, q, k);
              // tok, pos (learned positions), per earlier layer H heads + b_O + mlp, bias
              const size_t per_layer = c.n_heads + m.blocks[0]->attn.W_O.bias.defined() + c.has_mlp();
              BOOST_TEST(a.components.size() == 2 + (c.positions == Positions::Learned) + static_cast<size_t>(l) * per_layer);
              worst = std::max(worst, std::abs(a.sum() - a.score) / std::max(1.0, std::abs(a.score)));
              ++checked;
            }
    BOOST_TEST_MESSAGE(variant << ": " << checked << " scores, worst |sum - score| / max(1, |score|) " << worst);
    BOOST_TEST(worst < 1e-5, variant << ": worst " << worst);  // float32 scores of order 1 against a double sum
    BOOST_TEST(checked > 100u);
  }
}

// Over many sites, the aggregate of the pairs is the aggregate of the model's scores (mean and
// sum), the mean is the sum over the site count, each site's own decomposition adds up to the sum,
// and the max rule picks the key of the largest pattern weight.
BOOST_AUTO_TEST_CASE(aggregated_pairs_are_the_aggregated_scores) {
  ModelConfig c = preset_model("llama", test_model({.layers = 2, .heads = 2, .d_ff = 12}));
  TransformerLM m(c, 3);
  randomise(m, 5);
  const Ids ids(Shape{3, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 0, 3, 6, 5, 4, 3, 2, 1});
  const std::vector<QkSite> sites = {{0, 5, 2}, {1, 3, 3}, {2, 4, 0}, {0, 1, 0}, {2, 5, kMostAttendedKey}};
  const QkAttribution mean = qk_attribution(m, ids, 1, 1, sites, QkReduce::Mean);
  const QkAttribution sum = qk_attribution(m, ids, 1, 1, sites, QkReduce::Sum);
  // the model's own scores and pattern at the sites
  const ActivationCache cache = m.run_with_cache(ids, [](const std::string& n) { return n == "blocks.1.attn.hook_attn_scores" || n == "blocks.1.attn.hook_pattern"; }).second;
  const Tensor& S = cache["blocks.1.attn.hook_attn_scores"];  // (B, H, T, T)
  const Tensor& P = cache["blocks.1.attn.hook_pattern"];
  auto at = [&](const Tensor& t, int64_t b, int64_t q, int64_t k) { return t.data()[((b * 2 + 1) * 6 + q) * 6 + k]; };
  int64_t argmax = 0;
  for (int64_t k = 1; k <= 5; ++k)
    if (at(P, 2, 5, k) > at(P, 2, 5, argmax)) argmax = k;
  BOOST_TEST(sum.sites[4].key == argmax);
  double scores = 0, singles = 0;
  for (const QkSite& s : sum.sites) {
    scores += at(S, s.row, s.query, s.key);
    singles += qk_attribution(m, ids, s.row, 1, 1, s.query, s.key).sum();
  }
  BOOST_TEST(std::abs(sum.score - scores) < 1e-5);
  BOOST_TEST(std::abs(sum.sum() - scores) < 1e-4 * std::max(1.0, std::abs(scores)));
  // the aggregate runs the rows as one batch, the singles one row each: the products may take other
  // BLAS blockings (OPENBLAS_CORETYPE=Haswell differs by 1e-7 here), so equal to float32 rounding
  BOOST_TEST(std::abs(sum.sum() - singles) < 1e-5 * std::max(1.0, std::abs(singles)));
  BOOST_TEST(std::abs(mean.sum() - scores / 5) < 1e-4 * std::max(1.0, std::abs(scores)));
  for (size_t i = 0; i < sum.pairs.size(); ++i) BOOST_TEST(std::abs(mean.pairs[i] * 5 - sum.pairs[i]) < 1e-12 * std::max(1.0, std::abs(sum.pairs[i])));
  // the totals of each side are the score
  double qt = 0, kt = 0;
  for (double v : sum.query_totals()) qt += v;
  for (double v : sum.key_totals()) kt += v;
  BOOST_TEST(std::abs(qt - sum.sum()) < 1e-9);
  BOOST_TEST(std::abs(kt - sum.sum()) < 1e-9);
}

BOOST_AUTO_TEST_CASE(the_planted_induction_head_reads_the_previous_token_head_on_its_key_side) {
  PlantedCircuit pc = planted_induction();
  // row 0 [BOS 1 2 3 1 4]: L1H0 at query 4 (token 1) matches key 2, whose PREV is token 1
  const QkAttribution a = qk_attribution(*pc.model, pc.task.clean, 0, 1, 0, 4, 2);
  BOOST_TEST(std::abs(a.score - 25) < 1e-3);  // s^2 / sqrt(16), s = 10
  size_t bi = 0, bj = 0;
  for (size_t i = 0; i < a.components.size(); ++i)
    for (size_t j = 0; j < a.components.size(); ++j)
      if (std::abs(a.pair(i, j)) > std::abs(a.pair(bi, bj))) bi = i, bj = j;
  BOOST_TEST(a.components[bi] == "tok");   // query side: the current token
  BOOST_TEST(a.components[bj] == "L0H0");  // key side: the previous-token head
  BOOST_TEST(std::abs(a.pair(bi, bj) - 25) < 1e-3);
}

BOOST_AUTO_TEST_CASE(refused_models_and_bad_arguments_get_one_line) {
  ModelConfig c = test_model();
  c.sandwich_norm = true;
  c.normalization = NormKind::RMSNorm;
  TransformerLM r(c, 3);
  const Ids ids(Shape{1, 4}, {1, 2, 3, 4});
  BOOST_TEST(error_of([&] { qk_attribution(r, ids, 0, 0, 0, 1, 0); }) ==
             "qk attribution: the model has sandwich norms (sandwich_norm): each result is normalised; the decomposition is "
             "exact only without it");
  TransformerLM m(test_model(), 3);
  BOOST_TEST(error_of([&] { qk_attribution(m, ids, 0, 0, 0, 1, 2); }) ==
             "qk attribution: key position 2 is outside 0..1 (the keys query 1 sees)");
  BOOST_TEST(error_of([&] { qk_attribution(m, ids, 0, 2, 0, 1, 0); }) == "qk attribution: layer 2 is outside 0..1");
  BOOST_TEST(error_of([&] { qk_attribution(m, ids, 1, 0, 0, 1, 0); }) == "qk attribution: row 1 is outside 0..0");
  BOOST_TEST(error_of([&] { qk_attribution(m, ids, 0, 0, {}, QkReduce::Mean); }) == "qk attribution: no (query, key) sites");
  BOOST_TEST(error_of([&] { parse_qk_key_rule("first"); }) ==
             "qk attribution: unknown key rule 'first' (expected source, previous or max)");
  BOOST_TEST(error_of([&] { parse_qk_reduce("median"); }) == "qk attribution: unknown aggregate 'median' (expected mean or sum)");
  PatchingInputs in;
  in.clean = ids;
  in.answers = {{0, 0, 1, 2}};
  BOOST_TEST(error_of([&] { qk_answer_sites(in, QkKeyRule::Previous); }) ==
             "qk attribution: no (query, key) site in the task's answers (key rule previous)");
  ModelConfig w = test_model();
  w.sliding_window = 2;
  TransformerLM wm(w, 3);
  BOOST_TEST(error_of([&] { qk_attribution(wm, ids, 0, 0, 0, 3, 0); }) ==
             "qk attribution: key position 0 is masked for query 3 (outside layer 0's sliding window)");
}
