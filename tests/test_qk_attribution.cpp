// QK attribution (analysis/qk_attribution.h): the pairs sum to the score the model computed for
// every head, query and key (LayerNorm and RMSNorm, with biases and MLPs); on the planted
// induction circuit the induction head's score is the query's token against the previous-token
// head's key part; the refused options and bad arguments get one line.
#define BOOST_TEST_MODULE qk_attribution
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "analysis/planted_circuits.h"
#include "analysis/qk_attribution.h"
#include "tests/fixtures.h"

using namespace hl;
using hl::test::error_of;
using hl::test::randomise;
using hl::test::test_model;

BOOST_AUTO_TEST_CASE(the_pairs_sum_to_the_score_for_every_head_query_and_key) {
  const Ids ids(Shape{2, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 0, 3});
  for (const std::string variant : {"layernorm", "rmsnorm", "attention-only grouped"}) {
    ModelConfig c = test_model({.layers = 3, .heads = 2, .d_ff = variant == "attention-only grouped" ? 0 : 12});
    if (variant == "rmsnorm") c.normalization = NormKind::RMSNorm;
    if (variant == "attention-only grouped") c.n_heads = 4, c.n_kv_heads = 2;
    TransformerLM m(c, 3);
    randomise(m, 11);
    size_t checked = 0;
    double worst = 0;
    for (int64_t row = 0; row < 2; ++row)
      for (int l = 0; l < c.n_layers; ++l)
        for (int h = 0; h < c.n_heads; ++h)
          for (int64_t q = 0; q < 6; ++q)
            for (int64_t k = 0; k <= q; ++k) {
              const QkAttribution a = qk_attribution(m, ids, row, l, h, q, k);
              // tok, pos, per earlier layer H heads + b_O + mlp, bias
              BOOST_TEST(a.components.size() == 3 + static_cast<size_t>(l) * (c.n_heads + 1 + c.has_mlp()));
              worst = std::max(worst, std::abs(a.sum() - a.score) / std::max(1.0, std::abs(a.score)));
              ++checked;
            }
    BOOST_TEST_MESSAGE(variant << ": " << checked << " scores, worst |sum - score| / max(1, |score|) " << worst);
    BOOST_TEST(worst < 1e-5);  // float32 scores of order 1 against a double sum
  }
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
  c.positions = Positions::Rotary;
  TransformerLM r(c, 3);
  const Ids ids(Shape{1, 4}, {1, 2, 3, 4});
  BOOST_TEST(error_of([&] { qk_attribution(r, ids, 0, 0, 0, 1, 0); }) ==
             "qk attribution: the model has rotary positions (positions rotary): q and k turn by position; the decomposition is "
             "exact only without it");
  TransformerLM m(test_model(), 3);
  BOOST_TEST(error_of([&] { qk_attribution(m, ids, 0, 0, 0, 1, 2); }) ==
             "qk attribution: key position 2 is outside 0..1 (the keys query 1 sees)");
  BOOST_TEST(error_of([&] { qk_attribution(m, ids, 0, 2, 0, 1, 0); }) == "qk attribution: layer 2 is outside 0..1");
  BOOST_TEST(error_of([&] { qk_attribution(m, ids, 1, 0, 0, 1, 0); }) == "qk attribution: row 1 is outside 0..0");
}
