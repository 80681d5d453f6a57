// Heads matched across models: the Hungarian assignment against brute force and a hand-solved
// matrix, and matching a model with a copy of itself whose heads are permuted (same function)
// recovers the permutation by attention pattern and by circuit weights.
#define BOOST_TEST_MODULE matching
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "analysis/matching.h"
#include "lib/rng.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;

namespace {

using Matrix = std::vector<std::vector<double>>;

double total(const Matrix& c, const std::vector<int>& col) {
  double s = 0;
  for (size_t r = 0; r < c.size(); ++r)
    if (col[r] >= 0) s += c[r][col[r]];
  return s;
}

// The smallest total cost over every injective assignment of the shorter side (brute force).
double brute_force_min(const Matrix& c) {
  const int rows = static_cast<int>(c.size()), cols = static_cast<int>(c[0].size());
  std::vector<int> idx(std::max(rows, cols));
  std::iota(idx.begin(), idx.end(), 0);
  double best = INFINITY;
  do {  // rows <= cols: row r takes column idx[r]; rows > cols: column k takes row idx[k]
    double s = 0;
    if (rows <= cols)
      for (int r = 0; r < rows; ++r) s += c[r][idx[r]];
    else
      for (int k = 0; k < cols; ++k) s += c[idx[k]][k];
    best = std::min(best, s);
  } while (std::next_permutation(idx.begin(), idx.end()));
  return best;
}

Matrix random_matrix(int rows, int cols, uint64_t seed) {
  Rng rng(seed);
  Matrix m(rows, std::vector<double>(cols));
  for (auto& row : m)
    for (double& v : row) v = static_cast<double>(rng.next_u64() % 1000) / 100.0 - 3.0;
  return m;
}

// 2 layers of 4 heads (d_head 4), 16 positions; W_Q and W_K scaled up so the heads' patterns are
// sharp and differ from head to head (at initialisation they are all close to uniform).
ModelConfig sharp_config(int heads = 4) {
  ModelConfig c = test_model({.vocab = 11, .d_model = 16, .layers = 2, .heads = heads, .d_ff = 24, .max_seq_len = 16});
  return c;
}
void sharpen(TransformerLM& m) {
  for (auto& blk : m.blocks)
    for (Tensor* w : {&blk->attn.W_Q.weight, &blk->attn.W_K.weight})
      for (int64_t i = 0; i < w->numel(); ++i) w->data()[i] *= 25.f;
}

const std::vector<std::vector<int>> kPerm = {{2, 0, 3, 1}, {1, 3, 0, 2}};

// Which head of B holds A's head h when B's head k is A's head perm[k]: the inverse permutation.
int inverse(const std::vector<int>& perm, int h) {
  return static_cast<int>(std::find(perm.begin(), perm.end(), h) - perm.begin());
}

}  // namespace

BOOST_AUTO_TEST_CASE(hungarian_hand_solved) {
  // rows 0, 1, 2 -> columns 1, 0, 2: 1 + 2 + 2 = 5, the only assignment of total 5
  const Matrix c = {{4, 1, 3}, {2, 0, 5}, {3, 2, 2}};
  BOOST_TEST(hungarian(c) == (std::vector<int>{1, 0, 2}), boost::test_tools::per_element());
  // taking the smallest entry first (row 0 -> column 0 at 0) forces row 1 onto 10; the optimum
  // pays 1 + 1 = 2
  const Matrix trap = {{0, 1}, {1, 10}};
  BOOST_TEST(total(trap, hungarian(trap)) == 2.0);
  BOOST_TEST(hungarian(trap) == (std::vector<int>{1, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(hungarian_matches_brute_force_square_and_rectangular) {
  for (auto [rows, cols] : std::vector<std::pair<int, int>>{{6, 6}, {4, 7}, {7, 4}, {1, 5}, {5, 1}}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      const Matrix c = random_matrix(rows, cols, seed * 100 + rows * 10 + cols);
      const std::vector<int> col = hungarian(c);
      BOOST_TEST_REQUIRE(col.size() == static_cast<size_t>(rows));
      std::vector<int> used;
      for (int j : col)
        if (j >= 0) used.push_back(j);
      BOOST_TEST(used.size() == static_cast<size_t>(std::min(rows, cols)));  // min(rows, cols) pairs
      std::sort(used.begin(), used.end());
      BOOST_TEST((std::adjacent_find(used.begin(), used.end()) == used.end()));  // distinct columns
      // costs are multiples of 0.01 below 10 in magnitude: sums of up to 7 agree to 1e-9
      BOOST_TEST(std::fabs(total(c, col) - brute_force_min(c)) < 1e-9);
    }
  }
}

BOOST_AUTO_TEST_CASE(hungarian_refuses_bad_costs) {
  BOOST_TEST(error_of([] { hungarian({{1, 2}, {3}}); }).find("row 1 has 1 costs") != std::string::npos);
  BOOST_TEST(error_of([] { hungarian({{1, NAN}}); }).find("not finite") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(permuted_copy_computes_the_same_function) {
  TransformerLM a(sharp_config(), 7), b(sharp_config(), 7);
  sharpen(a), sharpen(b);
  for (int l = 0; l < 2; ++l) permute_heads(b, l, kPerm[l]);
  const std::vector<Batch> probe = match_probe(a, b, 8, 3);
  NoGradGuard ng;
  const Tensor la = a.forward(probe[0].inputs), lb = b.forward(probe[0].inputs);
  // The same real-number function: only the order of float32 sums changes (W_O's sum over the
  // H*d_head = 16 columns, and how the kernels block the permuted rows). Each such sum moves by at
  // most gamma(16) ~ 1e-6 of its terms' magnitudes (Higham, Lemma 3.1); two layers of LayerNorm,
  // softmax and MLP amplify that by a small factor, well inside 1e-5 of the largest logit, while a
  // misplaced row or column changes the logits by O(1).
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < la.numel(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(la.data()[i]) - lb.data()[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(la.data()[i])));
  }
  BOOST_TEST(worst <= 1e-5 * std::max(1.0, scale));
  // and the permutation did move the weights: head 0 of B is head 2 of A
  BOOST_TEST(b.blocks[0]->attn.W_Q.weight.data()[0] == a.blocks[0]->attn.W_Q.weight.data()[2 * 4 * 16]);
}

BOOST_AUTO_TEST_CASE(matching_recovers_a_permutation_by_pattern_and_by_weights) {
  TransformerLM a(sharp_config(), 7), b(sharp_config(), 7);
  sharpen(a), sharpen(b);
  for (int l = 0; l < 2; ++l) permute_heads(b, l, kPerm[l]);
  const std::vector<Batch> probe = match_probe(a, b, 16, 3);
  for (MatchBy by : {MatchBy::Pattern, MatchBy::Weights})
    for (bool across : {false, true}) {
      BOOST_TEST_CONTEXT(to_string(by) << (across ? " across layers" : " within layers")) {
        const HeadMatch m = match_heads(a, b, probe, {by, across});
        BOOST_TEST_REQUIRE(m.pairs.size() == 8u);
        BOOST_TEST(m.unmatched_a.empty());
        BOOST_TEST(m.unmatched_b.empty());
        for (const HeadPair& p : m.pairs) {
          BOOST_TEST(p.layer_b == p.layer_a);
          BOOST_TEST(p.head_b == inverse(kPerm[p.layer_a], p.head_a));
          BOOST_TEST(p.similarity > 1 - 1e-5);  // a head against itself: the same pattern, the same circuits
        }
        // every other pair of the same layer is clearly less alike
        for (int l = 0; l < 2; ++l)
          for (int ha = 0; ha < 4; ++ha)
            for (int hb = 0; hb < 4; ++hb)
              if (hb != inverse(kPerm[l], ha)) BOOST_TEST(m.similarity[l * 4 + ha][l * 4 + hb] < 0.99);
      }
    }
}

BOOST_AUTO_TEST_CASE(unequal_head_counts_make_a_rectangular_assignment) {
  TransformerLM a(sharp_config(4), 7), b(sharp_config(2), 9);
  sharpen(a), sharpen(b);
  const std::vector<Batch> probe = match_probe(a, b, 8, 3);
  const HeadMatch m = match_heads(a, b, probe, {MatchBy::Pattern, false});
  BOOST_TEST(m.pairs.size() == 4u);        // 2 per layer
  BOOST_TEST(m.unmatched_a.size() == 4u);  // 2 of A's 4 heads per layer
  BOOST_TEST(m.unmatched_b.empty());
  for (int l = 0; l < 2; ++l) {  // each layer's pairs are the best assignment of its block
    Matrix cost(4, std::vector<double>(2));
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) cost[i][j] = -m.similarity[l * 4 + i][l * 2 + j];
    double got = 0;
    for (const HeadPair& p : m.pairs)
      if (p.layer_a == l) got -= p.similarity;
    BOOST_TEST(std::fabs(got - brute_force_min(cost)) < 1e-12);
  }
  // weights: same d_model, different d_head (8 against 4) is fine
  BOOST_TEST(match_heads(a, b, {}, {MatchBy::Weights, false}).pairs.size() == 4u);
}

BOOST_AUTO_TEST_CASE(matching_refuses_what_it_cannot_compare) {
  TransformerLM a(sharp_config(), 7);
  ModelConfig one = sharp_config();
  one.n_layers = 1;
  TransformerLM b(one, 7);
  BOOST_TEST(error_of([&] { match_heads(a, b, match_probe(a, b, 4, 1), {MatchBy::Pattern, false}); })
                 .find("have 2 and 1 layers") != std::string::npos);
  BOOST_TEST(match_heads(a, b, match_probe(a, b, 4, 1), {MatchBy::Pattern, true}).pairs.size() == 4u);
  ModelConfig wide = sharp_config();
  wide.d_model = 32;
  TransformerLM c(wide, 7);
  BOOST_TEST(error_of([&] { match_heads(a, c, {}, {MatchBy::Weights, false}); }).find("d_model differ") != std::string::npos);
  BOOST_TEST(error_of([&] { permute_heads(a, 0, {0, 1, 1, 2}); }).find("not a permutation") != std::string::npos);
  BOOST_TEST(error_of([&] { permute_heads(a, 2, {0, 1, 2, 3}); }).find("layer 2 is outside") != std::string::npos);
  BOOST_TEST(error_of([] { parse_match_by("cosine"); }).find("choose pattern or weights") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(pair_roles_read_the_detectors) {
  // a hand-made role table: layer 0 head 1 of A is an induction head, its partner in B too
  HeadRoleScores ra{{"previous_token", "induction"}, {{{0.1, 0.2}}, {{0.0, 0.9}}}};
  HeadRoleScores rb{{"previous_token", "induction"}, {{{0.8, 0.1}}, {{0.5, 0.3}}}};
  BOOST_TEST(head_role(ra, 0, 1) == "induction");
  BOOST_TEST(head_role(ra, 0, 0) == "none");
  BOOST_TEST(head_role(rb, 0, 0) == "previous_token");  // 0.8 beats induction's 0.5
  HeadMatch m;
  m.pairs = {{0, 1, 0, 0, 0.5}, {0, 0, 0, 1, 0.5}};
  const PairRoles pr = pair_roles(m, ra, rb);
  BOOST_TEST(pr.role_a == (std::vector<std::string>{"induction", "none"}), boost::test_tools::per_element());
  BOOST_TEST(pr.role_b == (std::vector<std::string>{"previous_token", "none"}), boost::test_tools::per_element());
  BOOST_TEST(pr.same_role == 0);
  m.pairs = {{0, 1, 0, 1, 0.5}};
  HeadRoleScores rc{{"previous_token", "induction"}, {{{0.0, 0.0}}, {{0.0, 0.7}}}};
  BOOST_TEST(pair_roles(m, ra, rc).same_role == 1);
}

// Per-detector thresholds: a head below a fixed 0.4 cut-off (0.398, a gated fork's induction head)
// still takes its role when it is above the detector's random baseline; at the baseline it does not.
BOOST_AUTO_TEST_CASE(roles_against_each_detectors_random_baseline) {
  HeadRoleScores r{{"previous_token", "induction"}, {{{0.05, 0.30, 0.10}}, {{0.398, 0.31, 0.10}}}};
  const std::vector<double> t = {0.20, 0.10};
  BOOST_TEST(head_role(r, 0, 0, 0.4) == "none");
  BOOST_TEST(head_role(r, 0, 0, t) == "induction");
  BOOST_TEST(head_role(r, 0, 1, t) == "induction");       // both above theirs: the higher score
  BOOST_TEST(head_role(r, 0, 2, t) == "none");            // at induction's baseline, below previous_token's
  BOOST_TEST(error_of([&] { head_role(r, 0, 0, std::vector<double>{0.1}); }) == "head roles: 1 thresholds for 2 detectors");
  // the baseline is the largest score of any untrained head: every untrained head is at or below it
  const ModelConfig c = sharp_config();
  const std::vector<double> base = random_baseline_thresholds(c, 16, 1234, 2);
  BOOST_TEST(base.size() == 3u);
  TransformerLM untrained(c, 2);  // one of the baseline's models
  const HeadRoleScores u = detector_role_scores(untrained, 16, 1234);
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_heads; ++h) BOOST_TEST(head_role(u, l, h, base) == "none");
  for (size_t d = 0; d < 3; ++d) BOOST_TEST((base[d] > 0 && base[d] < 1));
}
