// What heads do: detectors (patterns, scores, exclusions), composition scores, activation and
// attribution patching.
#define BOOST_TEST_MODULE roles
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "analysis/circuits.h"
#include "analysis/detectors.h"
#include "analysis/intervals.h"
#include "analysis/patching.h"
#include "lib/gradcheck.h"
#include "models/l0_gates.h"
#include "train/l0.h"
#include "train/trainer.h"
#include "roundoff.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;

namespace {
// uniform causal attention: A[i][j] = 1/(i+1) for j <= i
std::vector<float> uniform_causal(int64_t T) {
  std::vector<float> A(static_cast<size_t>(T * T), 0.f);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j) A[i * T + j] = 1.f / static_cast<float>(i + 1);
  return A;
}
std::vector<std::pair<int64_t, int64_t>> cells(const std::vector<float>& D, int64_t T) {
  std::vector<std::pair<int64_t, int64_t>> c;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j)
      if (D[i * T + j] != 0.f) c.push_back({i, j});
  return c;
}
using Cells = std::vector<std::pair<int64_t, int64_t>>;
}  // namespace

BOOST_AUTO_TEST_CASE(detection_patterns_are_transformer_lens_s) {
  const std::vector<int32_t> tok = {5, 1, 2, 1, 2};
  BOOST_TEST((cells(detection_pattern(Detector::PreviousToken, tok), 5) == Cells{{1, 0}, {2, 1}, {3, 2}, {4, 3}}));
  BOOST_TEST((cells(detection_pattern(Detector::DuplicateToken, tok), 5) == Cells{{3, 1}, {4, 2}}));
  // induction: attend to the token after an earlier copy of the current token
  BOOST_TEST((cells(detection_pattern(Detector::Induction, tok), 5) == Cells{{3, 2}, {4, 3}}));
}

BOOST_AUTO_TEST_CASE(a_pattern_equal_to_the_detection_pattern_scores_one) {
  const std::vector<int32_t> tok = {3, 7, 7, 1, 3, 7};
  for (Detector d : {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction}) {
    const std::vector<float> D = detection_pattern(d, tok);
    BOOST_TEST(detection_score(D.data(), D.data(), 6, {}) == 1.0);
  }
}

BOOST_AUTO_TEST_CASE(uniform_attention_scores_the_expected_fraction) {
  const int64_t T = 9;
  const std::vector<float> A = uniform_causal(T);
  std::vector<int32_t> tok(T);
  for (int64_t t = 0; t < T; ++t) tok[t] = static_cast<int32_t>(t);
  const std::vector<float> D = detection_pattern(Detector::PreviousToken, tok);
  // each row sums to 1 (total T); rows i >= 1 put 1/(i+1) on i-1
  double on = 0;
  for (int64_t i = 1; i < T; ++i) on += 1.0 / (i + 1);
  BOOST_TEST(detection_score(A.data(), D.data(), T, {}) == on / T, boost::test_tools::tolerance(1e-6));
  // BOS excluded: column 0 is dropped from both sums; row 1's previous token is BOS
  double all = 0, on_bos = 0;
  for (int64_t i = 1; i < T; ++i) all += static_cast<double>(i) / (i + 1), on_bos += i >= 2 ? 1.0 / (i + 1) : 0.0;
  BOOST_TEST(detection_score(A.data(), D.data(), T, {.exclude_bos = true}) == on_bos / all, boost::test_tools::tolerance(1e-6));
  // current token excluded: the diagonal (1/(i+1) per row) leaves both sums
  double all_cur = 0;
  for (int64_t i = 0; i < T; ++i) all_cur += static_cast<double>(i) / (i + 1);
  BOOST_TEST(detection_score(A.data(), D.data(), T, {.exclude_current_token = true}) == on / all_cur,
             boost::test_tools::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(a_model_with_uniform_attention_scores_the_formula_on_the_probe) {
  const ModelConfig c = test_model({.vocab = 11, .d_model = 16, .d_ff = 32, .max_seq_len = 16, .attn_bias = false});
  TransformerLM m(c, 3);
  for (auto& b : m.blocks) b->attn.W_Q.weight.fill_(0.f);  // all scores 0: uniform causal attention
  const int k = 6;
  const std::vector<Batch> probe = repeated_random_tokens(20, k, 11, 5);
  BOOST_TEST(probe.size() == 1u);
  BOOST_TEST(probe[0].inputs.shape == (Shape{20, 2 * k}));
  for (int64_t r = 0; r < 20; ++r)
    for (int t = 0; t < k; ++t) BOOST_TEST(probe[0].inputs.at(r, t) == probe[0].inputs.at(r, t + k));
  const HeadGrid s = detect_heads(m, probe, Detector::PreviousToken, {});
  double on = 0;
  for (int64_t i = 1; i < 2 * k; ++i) on += 1.0 / (i + 1);
  for (auto& row : s)
    for (double v : row) BOOST_TEST(v == on / (2 * k), boost::test_tools::tolerance(1e-5));
}

namespace {
// The mean induction score over a probe of a head whose pattern `attend(row tokens, T)` fills.
double probe_score(const std::vector<Batch>& probe, const std::function<std::vector<float>(int64_t T, int64_t q)>& row_of) {
  double sum = 0;
  int64_t rows = 0;
  for (const Batch& b : probe)
    for (int64_t r = 0; r < b.size(); ++r) {
      const int64_t T = b.inputs.shape[1];
      std::vector<int32_t> tokens(b.inputs.data.begin() + r * T, b.inputs.data.begin() + (r + 1) * T);
      std::vector<float> A(static_cast<size_t>(T * T), 0.f);
      for (int64_t q = 0; q < T; ++q) {
        const std::vector<float> w = row_of(T, q);
        std::copy(w.begin(), w.end(), A.begin() + q * T);
      }
      sum += detection_score(A.data(), detection_pattern(Detector::Induction, tokens).data(), T, {});
      ++rows;
    }
  return sum / static_cast<double>(rows);
}
}  // namespace

// A head that always attends the same distance back scores as an induction head on the fixed
// probe (where every repeat is that far back) but not on the varied one; a head that attends
// where induction does scores the same on both.
BOOST_AUTO_TEST_CASE(a_fixed_offset_head_is_not_an_induction_head_on_the_varied_probe) {
  const int k = 8;
  auto fixed_offset = [&](int64_t T, int64_t q) {  // attends k - 1 back, else to position 0
    std::vector<float> w(static_cast<size_t>(T), 0.f);
    w[static_cast<size_t>(q >= k - 1 ? q - (k - 1) : 0)] = 1.f;
    return w;
  };
  const std::vector<Batch> fixed = repeated_random_tokens(200, k, 50, 3), varied = varied_repeat_probe(200, k, 50, 3);
  const double on_fixed = probe_score(fixed, fixed_offset), on_varied = probe_score(varied, fixed_offset);
  BOOST_TEST(on_fixed > 0.45);   // the second half of every row: about half the queries
  BOOST_TEST(on_varied < 0.15);  // right only on rows whose block is k long (1 in 5) and by chance
  // the varied probe's rows: one block of 4..8 tokens repeated right after itself
  for (const Batch& b : varied)
    for (int64_t r = 0; r < b.size(); ++r) {
      const int64_t T = b.inputs.shape[1];
      BOOST_TEST(T == 2 * k);
      int64_t counted = 0, first = -1;
      for (int64_t t = 0; t < T; ++t)
        if (b.targets.at(r, t) >= 0) counted += 1, first = first < 0 ? t : first;
      const int64_t len = counted + 1, start = first - len;  // the block's length and its first copy
      BOOST_TEST_REQUIRE((len >= k / 2 && len <= k));
      for (int64_t t = 0; t < len; ++t) BOOST_TEST(b.inputs.at(r, start + t) == b.inputs.at(r, start + len + t));
    }
  const std::vector<Batch> with_bos = varied_repeat_probe(10, k, 50, 3, 49);
  BOOST_TEST(with_bos[0].inputs.shape[1] == 2 * k + 1);
  for (int64_t r = 0; r < 10; ++r) BOOST_TEST(with_bos[0].inputs.at(r, 0) == 49);
}

BOOST_AUTO_TEST_CASE(composition_is_one_for_shared_directions_zero_for_orthogonal_and_scale_free) {
  const int D = 4;
  auto outer = [&](std::vector<double> a, std::vector<double> b) {
    std::vector<double> m(D * D);
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) m[i * D + j] = a[i] * b[j];
    return m;
  };
  const std::vector<double> u = {1, 0, 0, 0}, v = {0, 0.6, 0.8, 0}, w = {0, 0, 0, 1}, x = {0, 0.8, -0.6, 0};
  BOOST_TEST(composition_score(outer(u, v), outer(v, w), D) == 1.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(composition_score(outer(u, v), outer(x, w), D) == 0.0, boost::test_tools::tolerance(1e-12));
  std::vector<double> A = outer(u, v), B = outer({0, 0.6, 0.8, 0.1}, w);
  const double s = composition_score(A, B, D);
  for (double& a : A) a *= 3.5;
  for (double& b : B) b *= -0.01;
  BOOST_TEST(composition_score(A, B, D) == s, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(model_composition_scores_equal_the_products_formed_in_full) {
  const ModelConfig c = test_model({.d_model = 12, .heads = 3, .d_ff = 16, .max_seq_len = 64, .attn_bias = false});
  TransformerLM m(c, 9);
  const CompositionScores cs = composition_scores(m, 0, 1);
  const int D = 12, dh = 4;
  auto block = [&](const Tensor& w, int h, bool cols) { return cols ? head_cols(w, h, dh) : head_rows(w, h, dh); };
  // D x D from (D x dh) * (dh x D), or its transpose
  auto full = [&](const Tensor& x, const Tensor& y, bool transpose_x) {
    std::vector<double> r(D * D, 0.0);
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j)
        for (int t = 0; t < dh; ++t)
          r[i * D + j] += static_cast<double>(transpose_x ? x.data()[t * D + i] : x.data()[i * dh + t]) * y.data()[t * D + j];
    return r;
  };
  auto tr = [&](std::vector<double> a) {
    std::vector<double> t(a.size());
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) t[j * D + i] = a[i * D + j];
    return t;
  };
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      const auto& A = m.blocks[0]->attn;
      const auto& B = m.blocks[1]->attn;
      const std::vector<double> ov_a = full(block(A.W_O.weight, a, true), block(A.W_V.weight, a, false), false);
      const std::vector<double> ov_b = full(block(B.W_O.weight, b, true), block(B.W_V.weight, b, false), false);
      const std::vector<double> qk_b = full(block(B.W_Q.weight, b, false), block(B.W_K.weight, b, false), true);
      BOOST_TEST(cs.q[a][b] == composition_score(tr(qk_b), ov_a, D), boost::test_tools::tolerance(1e-9));
      BOOST_TEST(cs.k[a][b] == composition_score(qk_b, ov_a, D), boost::test_tools::tolerance(1e-9));
      BOOST_TEST(cs.v[a][b] == composition_score(ov_b, ov_a, D), boost::test_tools::tolerance(1e-9));
    }
}


BOOST_AUTO_TEST_CASE(rotary_composition_is_taken_at_a_key_offset_as_the_models_scores_are) {
  for (const std::string style : {"half", "interleaved"}) {
    ModelConfig c = test_model({.d_model = 12, .heads = 3, .d_ff = 16, .max_seq_len = 16, .attn_bias = false});
    c.positions = Positions::Rotary;
    c.rotary_style = style;
    if (style == "interleaved") c.rotary_dim = 2;  // partial: one pair of each head turns
    TransformerLM m(c, 9);
    const int D = 12, dh = 4, T = 7;
    BOOST_TEST_CONTEXT(style) {
      // W_QK at offset i - j gives the model's own scores q'_i . k'_j (after rotary, before the scale)
      Rng r(3);
      Tensor x = Tensor::empty({1, T, D});
      for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = r.normal();
      Tensor rq, rk;
      Hooks hk;
      hk.add_forward("a.hook_rot_q", [&](const Tensor& t, const std::string&) { rq = t.clone(); return Tensor(); });
      hk.add_forward("a.hook_rot_k", [&](const Tensor& t, const std::string&) { rk = t.clone(); return Tensor(); });
      MultiHeadAttention::Call call;
      call.causal = true;
      call.hooks = &hk;
      call.hook_prefix = "a.";
      {
        NoGradGuard ng;
        m.blocks[1]->attn.forward(x, Tensor(), call);
      }
      BOOST_TEST_REQUIRE((rq.defined() && rk.defined()));
      for (int b = 0; b < 3; ++b)
        for (int i = 0; i < T; ++i)
          for (int j = 0; j <= i; ++j) {
            double s = 0, ref = 0;
            for (int t = 0; t < dh; ++t) s += double(rq.data()[(i * 3 + b) * dh + t]) * rk.data()[(j * 3 + b) * dh + t];
            const std::vector<double> W = qk_circuit(m, 1, b, i - j);
            for (int a = 0; a < D; ++a)
              for (int e = 0; e < D; ++e) ref += x.data()[i * D + a] * W[a * D + e] * x.data()[j * D + e];
            BOOST_TEST(std::fabs(s - ref) <= 1e-5 * (1 + std::fabs(s)), "head " << b << " i " << i << " j " << j);
          }
      // the scores at an offset are those of the dense matrices at that offset
      auto tr = [&](const std::vector<double>& a) {
        std::vector<double> t(a.size());
        for (int i = 0; i < D; ++i)
          for (int j = 0; j < D; ++j) t[j * D + i] = a[i * D + j];
        return t;
      };
      auto ov = [&](int layer, int h) {
        const auto& A = m.blocks[layer]->attn;
        std::vector<double> o(D * D, 0.0);
        for (int i = 0; i < D; ++i)
          for (int j = 0; j < D; ++j)
            for (int t = 0; t < dh; ++t) o[i * D + j] += double(A.W_O.weight.at({i, h * dh + t})) * A.W_V.weight.at({h * dh + t, j});
        return o;
      };
      const CompositionScores at0 = composition_scores(m, 0, 1, 0), plain0 = composition_scores_over_offsets(m, 0, 1, 1);
      bool moved = false;
      for (int64_t offset : {0, 3}) {
        const CompositionScores cs = composition_scores(m, 0, 1, offset);
        for (int a = 0; a < 3; ++a)
          for (int b = 0; b < 3; ++b) {
            const std::vector<double> qk = qk_circuit(m, 1, b, offset), ov_a = ov(0, a);
            BOOST_TEST(cs.q[a][b] == composition_score(tr(qk), ov_a, D), boost::test_tools::tolerance(1e-9));
            BOOST_TEST(cs.k[a][b] == composition_score(qk, ov_a, D), boost::test_tools::tolerance(1e-9));
            BOOST_TEST(cs.v[a][b] == at0.v[a][b], boost::test_tools::tolerance(1e-12));  // no rotation in W_OV
            moved = moved || std::fabs(cs.k[a][b] - at0.k[a][b]) > 1e-3;
          }
      }
      BOOST_TEST(moved);  // under rotary the offset matters: the test can fail
      for (int a = 0; a < 3; ++a)  // the mean over offset 0 alone (Gram matrices) is the unrotated score (factors)
        for (int b = 0; b < 3; ++b) {
          BOOST_TEST(plain0.k[a][b] == at0.k[a][b], boost::test_tools::tolerance(1e-12));
          BOOST_TEST(plain0.q[a][b] == at0.q[a][b], boost::test_tools::tolerance(1e-12));
        }
      BOOST_TEST(plain0.v == at0.v);
      // without an offset (compose's default): Q and K the mean of the scores at every offset 0..max_seq_len-1, V once
      const CompositionScores mean = composition_scores(m, 0, 1);
      std::vector<CompositionScores> each;
      for (int64_t o = 0; o < c.max_seq_len; ++o) each.push_back(composition_scores(m, 0, 1, o));
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) {
          double q = 0, k = 0;
          for (const CompositionScores& s : each) q += s.q[a][b] / double(c.max_seq_len), k += s.k[a][b] / double(c.max_seq_len);
          BOOST_TEST(mean.q[a][b] == q, boost::test_tools::tolerance(1e-9));
          BOOST_TEST(mean.k[a][b] == k, boost::test_tools::tolerance(1e-9));
        }
      BOOST_TEST(mean.v == at0.v);
      BOOST_TEST(mean.k != at0.k);
    }
  }
  {  // grouped keys: each query head reads its group's W_K
    ModelConfig c = test_model({.d_model = 12, .heads = 4, .kv_heads = 2, .max_seq_len = 5, .attn_bias = false});
    c.positions = Positions::Rotary;
    c.rotary_dim = 2;  // d_head 3 has an odd one out: two of its dims turn
    TransformerLM m(c, 4);
    const CompositionScores mean = composition_scores(m, 0, 1);
    double k12 = 0;
    for (int64_t o = 0; o < 5; ++o) k12 += composition_scores(m, 0, 1, o).k[1][2] / 5.0;
    BOOST_TEST(mean.k[1][2] == k12, boost::test_tools::tolerance(1e-9));
  }
  // without rotary positions every offset scores as offset 0
  TransformerLM plain(test_model({.d_model = 12, .heads = 3, .max_seq_len = 16, .attn_bias = false}), 9);
  BOOST_TEST(composition_scores(plain, 0, 1, 5).k == composition_scores(plain, 0, 1).k);
  BOOST_CHECK_THROW(composition_scores(plain, 0, 1, 16), Error);
}

namespace {
// A copy model trained a little, so clean and corrupted answers differ.
std::unique_ptr<Trainer> trained_copy_model() {
  TrainArgs a;
  a.model.d_model = 32;
  a.model.n_heads = 4;
  a.model.d_ff = 64;
  a.task = TaskConfig::preset("copy");
  a.task.min_len = a.task.max_len = 6;
  a.steps = 150;
  a.eval_size = 32;
  a.eval_every = 150;
  auto t = std::make_unique<Trainer>(a);
  t->run();
  return t;
}
}  // namespace

BOOST_AUTO_TEST_CASE(patching_the_clean_activation_gives_one_and_the_corrupted_gives_zero) {
  auto t = trained_copy_model();
  TransformerLM& m = t->model();
  const std::vector<Batch> held = t->task().held_out(1, 77, 1);  // one row: one source position
  const PatchingInputs in = corrupt_one_symbol(held[0], 10, 3);
  BOOST_TEST(in.answers.size() == 1u);
  const int64_t p = in.source_pos[0];
  BOOST_TEST(in.clean.at(0, p) != in.corrupted.at(0, p));
  BOOST_TEST(in.answers[0].clean == in.clean.at(0, p));
  const PatchingResult r = activation_patching(m, in);
  BOOST_TEST(r.clean_metric > r.corrupted_metric);
  // the only input that differs, restored: the clean run's metric to float32 rounding (the patched
  // run goes stacked with the sweep's other positions, whose products take more rows: under
  // OpenBLAS's Haswell kernels another summation order; bit for bit under this machine's default)
  BOOST_TEST(std::fabs(r.resid_exact[0][p] - 1.0) <= 1e-6);
  for (int64_t q = 0; q < p; ++q) BOOST_TEST(r.resid_exact[0][q] == 0.0);  // identical before it
  for (int l = 0; l < 2; ++l)
    for (double v : r.z_exact[l]) BOOST_TEST(std::isfinite(v));
  BOOST_TEST(std::isfinite(r.z_correlation));
  BOOST_TEST(std::isnan(r.z_exact_ci95_lo[0][0]));  // one answer: no interval
  BOOST_TEST(std::isnan(r.z_exact_ci95_hi[0][0]));
  BOOST_TEST(m.gates_all_one());
  // 16 rows: each head's restoration lies inside its bootstrap interval over the answers
  const PatchingInputs many = corrupt_one_symbol(t->task().held_out(16, 78, 16)[0], 10, 4);
  const PatchingResult rm = activation_patching(m, many);
  for (int l = 0; l < 2; ++l)
    for (size_t h = 0; h < rm.z_exact[l].size(); ++h) {
      BOOST_TEST(rm.z_exact_ci95_lo[l][h] <= rm.z_exact[l][h] + 1e-5);
      BOOST_TEST(rm.z_exact[l][h] <= rm.z_exact_ci95_hi[l][h] + 1e-5);
      BOOST_TEST(rm.z_exact_ci95_lo[l][h] < rm.z_exact_ci95_hi[l][h]);
    }
}

BOOST_AUTO_TEST_CASE(activation_patching_is_full_forwards_with_a_hook_within_float32_rounding) {
  // every head and residual position against a full forward of the corrupted ids with the clean
  // activation written by a hook and the dense logit difference: the sweeps start at the patched
  // block, sum only the answers' logits and skip a patch that writes what is there (positions 2, 4
  // and 5 of layer 0, corrupted in no row): those read exactly 0, the rest within float32 rounding
  TransformerLM m(test_model(), 3);
  randomise(m, 4);
  const PatchingInputs in = three_rows_one_token_changed();
  const int L = m.cfg.n_layers, H = m.cfg.n_heads;
  const int64_t T = in.clean.shape[1], D = m.cfg.d_model, dh = m.cfg.head_dim();
  size_t done = 0, runs = 0;
  const PatchingResult r = activation_patching(m, in, [&](size_t d, size_t n) {
    BOOST_TEST(d == done + 1);
    done = d, runs = n;
  });
  BOOST_TEST(runs == static_cast<size_t>(L * H + L * T));
  BOOST_TEST(done == runs);
  EvalScope mode(m);
  NoGradGuard ng;
  auto metric = [&](const Ids& ids, const Hooks* hooks) {
    ForwardOptions o;
    o.hooks = hooks;
    return static_cast<double>(logit_difference(m.forward(ids, o), in.answers).item());
  };
  const double mc = metric(in.clean, nullptr), mk = metric(in.corrupted, nullptr);
  BOOST_TEST(r.clean_metric == mc);
  BOOST_TEST(r.corrupted_metric == mk);
  const ActivationCache clean = m.run_with_cache(in.clean, all_names()).second;
  // the corrupted run with the clean activation at the elements `here` selects
  auto patched = [&](const std::string& name, const std::function<bool(int64_t)>& here) {
    Hooks hooks;
    hooks.add_forward(name, [&](const Tensor& x, const std::string&) {
      Tensor y = x.clone();
      for (int64_t i = 0; i < y.numel(); ++i)
        if (here(i)) y.data()[i] = clean[name].data()[i];
      return y;
    });
    return (metric(in.corrupted, &hooks) - mk) / (mc - mk);
  };
  for (int l = 0; l < L; ++l) {
    const std::string z = "blocks." + std::to_string(l) + ".attn.hook_z", res = "blocks." + std::to_string(l) + ".hook_resid_pre";
    // a patched run computes only the positions its patch reaches (fewer rows in its products than
    // the whole run, so another kernel may sum them): equal within float32 rounding
    for (int h = 0; h < H; ++h)
      BOOST_TEST(std::abs(r.z_exact[l][h] - patched(z, [&](int64_t i) { return (i / dh) % H == h; })) <= 1e-5);
    for (int64_t t = 0; t < T; ++t)
      BOOST_TEST(std::abs(r.resid_exact[l][t] - patched(res, [&](int64_t i) { return (i / D) % T == t; })) <= 1e-5);
  }
  for (int64_t t : {2, 4, 5}) BOOST_TEST(r.resid_exact[0][t] == 0.0);  // a patch that changes nothing: the corrupted run itself
}

BOOST_AUTO_TEST_CASE(rows_without_a_prompt_corrupt_a_symbol_seen_once_before_it_is_predicted) {
  // a language-modelling row (tokens, text): 5 1 2 3 9 1 2 3, loss on the repeat's 2 and 3
  Batch b;
  b.inputs = Ids(Shape{1, 8}, {5, 1, 2, 3, 9, 1, 2, 3});
  b.targets = Ids(Shape{1, 8}, {-1, -1, -1, -1, -1, 2, 3, -1});
  std::set<std::pair<int64_t, int64_t>> seen;  // (source, answer) over seeds
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const PatchingInputs in = corrupt_one_symbol(b, 12, seed);
    BOOST_REQUIRE(in.answers.size() == 1u);
    const int64_t p = in.source_pos[0], at = in.answers[0].pos;
    seen.insert({p, at});
    BOOST_TEST(in.answers[0].clean == b.inputs.at(0, p));
    BOOST_TEST(b.targets.at(0, at) == in.answers[0].clean);
    const int32_t c = in.answers[0].corrupted;  // a symbol the row does not use
    BOOST_TEST((c >= 0 && c < 12 && c != 1 && c != 2 && c != 3 && c != 5 && c != 9));
    for (int64_t t = 0; t < 8; ++t) BOOST_TEST(in.corrupted.at(0, t) == (t == p ? c : b.inputs.at(0, t)));
  }
  // 2 at 2 answers at 5, 3 at 3 answers at 6; 1 is seen twice before any answer, 5 and 9 never
  BOOST_TEST((seen == std::set<std::pair<int64_t, int64_t>>{{2, 5}, {3, 6}}));
}

BOOST_AUTO_TEST_CASE(the_previous_corruption_changes_the_token_the_answer_follows) {
  // 5 1 2 3 9 1 2 3: at 5 (token 1) the answer 2 follows 1's earlier occurrence (at 1); at 6
  // (token 2) the answer 3 follows 2 (at 2). Previous corrupts position 1 or 2, keeps the answers.
  Batch b;
  b.inputs = Ids(Shape{1, 8}, {5, 1, 2, 3, 9, 1, 2, 3});
  b.targets = Ids(Shape{1, 8}, {-1, -1, -1, -1, -1, 2, 3, -1});
  std::set<std::pair<int64_t, int64_t>> seen;  // (position changed, answer position) over seeds
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const PatchingInputs in = corrupt_one_symbol(b, 12, seed, Corruption::Previous);
    BOOST_REQUIRE(in.answers.size() == 1u);
    const int64_t p = in.source_pos[0], at = in.answers[0].pos;
    seen.insert({p, at});
    BOOST_TEST(in.answers[0].clean == b.targets.at(0, at));  // the answer is unchanged
    BOOST_TEST(b.inputs.at(0, p) == b.inputs.at(0, at));    // the changed token is the answer's context
    BOOST_TEST(in.answers[0].clean == b.inputs.at(0, p + 1));
    const int32_t c = in.answers[0].corrupted;
    BOOST_TEST((c >= 0 && c < 12 && c != 1 && c != 2 && c != 3 && c != 5 && c != 9));
    for (int64_t t = 0; t < 8; ++t) BOOST_TEST(in.corrupted.at(0, t) == (t == p ? c : b.inputs.at(0, t)));
  }
  BOOST_TEST((seen == std::set<std::pair<int64_t, int64_t>>{{1, 5}, {2, 6}}));
  // a row whose answer's context occurs twice before the answer has nothing to corrupt
  Batch twice;
  twice.inputs = Ids(Shape{1, 8}, {1, 2, 3, 1, 9, 1, 2, 3});
  twice.targets = Ids(Shape{1, 8}, {-1, -1, -1, -1, -1, 2, -1, -1});
  BOOST_CHECK_EXCEPTION(corrupt_one_symbol(twice, 12, 0, Corruption::Previous), Error, [](const Error& e) {
    return std::string(e.what()).find("no row has a token to corrupt before an answer's source") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(parse_corruption("next"), Error, [](const Error& e) {
    return std::string(e.what()) == "unknown corruption 'next' (source or previous)";
  });
}

BOOST_AUTO_TEST_CASE(attribution_equals_exact_patching_where_the_metric_is_linear) {
  auto t = trained_copy_model();
  TransformerLM& m = t->model();
  const std::vector<Batch> held = t->task().held_out(16, 78, 16);
  const PatchingInputs in = corrupt_one_symbol(held[0], 10, 4);
  // the logits are a linear function of ln_final's output x (the unembedding W x + b), so in exact
  // arithmetic exact == attribution. In float32 each is a sum of dot products of the answer rows
  // of W with x: below gamma(K) times S, the sum of the magnitudes of those terms (K = d_model *
  // answers + 2 terms at most in one sum), for the metrics of both runs and the span they divide by.
  const auto [exact, attr] = patch_whole_activation(m, in, "ln_final.hook_normalized");
  BOOST_TEST(exact == 1.0);  // the whole output of ln_final from the clean run gives the clean logits
  const std::string name = "ln_final.hook_normalized";
  EvalScope mode(m);
  NoGradGuard ng;
  const Tensor xc = m.run_with_cache(in.clean, name_is(name)).second[name];
  const Tensor xk = m.run_with_cache(in.corrupted, name_is(name)).second[name];
  const Tensor& W = m.head.weight;  // (V, D)
  const int64_t D = W.size(1), T = in.clean.shape[1];
  double S = 0, span = 0;
  for (const PatchAnswer& a : in.answers)
    for (int64_t d = 0; d < D; ++d) {
      const double w = std::fabs(W.at({a.clean, d})) + std::fabs(W.at({a.corrupted, d}));
      S += w * (std::fabs(xc.data()[(a.row * T + a.pos) * D + d]) + std::fabs(xk.data()[(a.row * T + a.pos) * D + d]));
      span += (static_cast<double>(W.at({a.clean, d})) - W.at({a.corrupted, d})) *
              (static_cast<double>(xc.data()[(a.row * T + a.pos) * D + d]) - xk.data()[(a.row * T + a.pos) * D + d]);
    }
  const double n = static_cast<double>(in.answers.size());
  const double K = static_cast<double>(D) * n + 2;
  const double bound = 3 * roundoff::gamma(K) * (S / n) / std::fabs(span / n) * (1 + std::fabs(exact));
  BOOST_TEST(std::fabs(exact - attr) <= bound, "exact " << exact << " attribution " << attr << " bound " << bound);
}

// ---- hard-concrete L0 gates ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(hard_concrete_draws_are_exactly_0_and_1_as_often_as_the_closed_form_says) {
  const HardConcrete hc;
  const int64_t N = 100000;
  for (float log_a : {-1.f, 0.5f, 2.f}) {
    const Tensor a = Tensor::full({N}, log_a);
    Tensor noise = Tensor::empty({N});
    Rng rng(11);
    for (int64_t i = 0; i < N; ++i) {
      const double u = hc.eps + (1 - 2 * hc.eps) * rng.uniform();
      noise.data()[i] = static_cast<float>(std::log(u) - std::log1p(-u));
    }
    const Tensor gate = hard_concrete_gate(a, noise, hc);
    int64_t zeros = 0, ones = 0;
    for (float v : gate.to_vector()) zeros += v == 0.f, ones += v == 1.f;
    const double p0 = hard_concrete_p_zero(log_a, hc), p1 = hard_concrete_p_one(log_a, hc);
    // within 5 binomial standard deviations (the draws are independent)
    BOOST_TEST(std::fabs(zeros / double(N) - p0) <= 5 * std::sqrt(p0 * (1 - p0) / N), "log_a " << log_a << " p0 " << p0);
    BOOST_TEST(std::fabs(ones / double(N) - p1) <= 5 * std::sqrt(p1 * (1 - p1) / N), "log_a " << log_a << " p1 " << p1);
    BOOST_TEST(p0 > 0.01);
    BOOST_TEST(p1 > 0.01);
  }
}

BOOST_AUTO_TEST_CASE(the_evaluation_gate_is_the_clipped_stretched_sigmoid) {
  const HardConcrete hc;
  const std::vector<float> a = {-5.f, -2.f, -0.5f, 0.f, 0.7f, 2.f, 4.f};
  const std::vector<float> g = hard_concrete_eval_gate(Tensor::from({7}, a), hc).to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    const double want = std::clamp(1.0 / (1.0 + std::exp(-a[i])) * (hc.r - hc.l) + hc.l, 0.0, 1.0);
    BOOST_TEST(g[i] == want, boost::test_tools::tolerance(1e-6));
  }
  BOOST_TEST(g.front() == 0.f);  // exactly closed
  BOOST_TEST(g.back() == 1.f);   // exactly open
}

BOOST_AUTO_TEST_CASE(the_penalty_and_the_sampled_gate_pass_gradcheck_in_log_a) {
  const HardConcrete hc;
  // log_a and noise such that every sample lies strictly inside (0, 1): away from the clip's kinks
  Tensor log_a = Tensor::from({4}, {-0.3f, 0.2f, 0.9f, 1.4f});
  log_a.requires_grad_();
  const Tensor noise = Tensor::from({4}, {0.4f, -0.2f, -0.9f, -1.0f});
  const std::vector<float> inside = hard_concrete_gate(log_a, noise, hc).to_vector();
  for (float v : inside) BOOST_TEST((v > 0.05f && v < 0.95f));
  const GradcheckResult g1 = gradcheck([&](const std::vector<Tensor>& in) { return sum(mul(hard_concrete_gate(in[0], noise, hc), Tensor::from({4}, {1.f, -2.f, 0.5f, 3.f}))); }, {log_a});
  BOOST_TEST(g1.ok, g1.message);
  const GradcheckResult g2 = gradcheck([&](const std::vector<Tensor>& in) { return hard_concrete_penalty(in[0], hc); }, {log_a});
  BOOST_TEST(g2.ok, g2.message);
  // the penalty is the expected number of open gates: sum of 1 - P(g = 0)
  double open = 0;
  for (float a : log_a.to_vector()) open += 1 - hard_concrete_p_zero(a, hc);
  BOOST_TEST(hard_concrete_penalty(log_a, hc).item() == open, boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(lambda_zero_keeps_every_head_and_a_large_lambda_closes_all) {
  auto t = trained_copy_model();
  const std::vector<Batch> data = t->task().held_out(64, 5, 64);
  L0Options o;
  o.steps = 60;
  o.lambda = 0;
  TransformerLM& m = t->model();
  const L0Result keep = l0_finetune(m, t->task(), data, o);
  BOOST_TEST(keep.heads_kept == 8);
  o.lambda = 100;
  const L0Result none = l0_finetune(m, t->task(), data, o);
  BOOST_TEST(none.heads_kept == 0);
  for (auto& row : none.gates)
    for (float g : row) BOOST_TEST(g == 0.f);
}

// The random baseline of compose: another random model's scores fall inside it (about 95% of
// them), and the range sits strictly between 0 and 1.
BOOST_AUTO_TEST_CASE(random_weights_score_inside_the_composition_baseline) {
  const ModelConfig c = test_model({.d_model = 16, .heads = 4, .d_ff = 0});
  const CompositionBaseline b = composition_baseline(c, 20, 1);
  for (int k = 0; k < 3; ++k) {
    BOOST_TEST(0.0 < b.lo[k]);
    BOOST_TEST(b.lo[k] < b.mean[k]);
    BOOST_TEST(b.mean[k] < b.hi[k]);
    BOOST_TEST(b.hi[k] < 1.0);
  }
  int inside = 0, total = 0;
  for (uint64_t seed : {101, 202, 303, 404, 505}) {
    TransformerLM m(c, seed);
    const CompositionScores s = composition_scores(m, 0, 1);
    for (int a = 0; a < 4; ++a)
      for (int h = 0; h < 4; ++h) {
        const double v[3] = {s.q[a][h], s.k[a][h], s.v[a][h]};
        for (int k = 0; k < 3; ++k) inside += v[k] >= b.lo[k] && v[k] <= b.hi[k], ++total;
      }
  }
  BOOST_TEST(inside >= 0.85 * total, inside << " of " << total);
}

BOOST_AUTO_TEST_CASE(several_detectors_from_one_forward_give_each_detector_s_scores_bit_for_bit) {
  const ModelConfig c = test_model({.vocab = 11, .d_model = 16, .d_ff = 32, .max_seq_len = 16});
  TransformerLM m(c, 7);
  const std::vector<Batch> probe = varied_repeat_probe(70, 6, 11, 3);  // two batches: 64 + 6 rows
  const std::vector<Detector> kinds = {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction};
  std::vector<std::vector<HeadGrid>> each;
  const std::vector<HeadGrid> all = detect_heads(m, probe, kinds, {}, {}, 0, &each);
  BOOST_TEST(all.size() == 3u);
  BOOST_TEST(each.size() == 3u);
  for (size_t k = 0; k < kinds.size(); ++k) {
    std::vector<HeadGrid> one_each;
    BOOST_TEST(all[k] == detect_heads(m, probe, kinds[k], {}, {}, 0, &one_each));
    BOOST_TEST(each[k] == one_each);
    BOOST_TEST(each[k].size() == 70u);
  }
}
