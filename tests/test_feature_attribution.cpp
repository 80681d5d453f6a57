// SAE features on hook_z attributed to heads, source positions and tokens
// (analysis/feature_attribution.h), features as nodes through the edited splice, and features
// followed over training (analysis/features_over_training.h).
#define BOOST_TEST_MODULE feature_attribution
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "analysis/evaluate.h"
#include "analysis/features.h"
#include "analysis/feature_attribution.h"
#include "analysis/features_over_training.h"
#include "tests/fixtures.h"
#include "train/sae_trainer.h"

using namespace hl;

namespace {

Ids some_tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Rng r(seed);
  Ids ids({B, T});
  for (auto& v : ids.data) v = static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(vocab));
  return ids;
}

// A random SAE on blocks.L.attn.hook_z of width d_in: random encoder, decoder and biases.
Sae random_sae(const std::string& hook, int64_t d_in, int64_t d_sae, SaeArch arch, uint64_t seed) {
  SaeConfig cfg;
  cfg.d_in = d_in, cfg.d_sae = d_sae, cfg.arch = arch, cfg.k = 3, cfg.hook_name = hook;
  Rng r(seed);
  Sae sae = Sae::init(cfg, r);
  NoGradGuard no_grad;
  for (int64_t i = 0; i < sae.W_enc.numel(); ++i) sae.W_enc.data()[i] = static_cast<float>(r.normal()) * 0.5f;
  for (int64_t i = 0; i < d_sae; ++i) sae.b_enc.data()[i] = static_cast<float>(r.normal()) * 0.1f;
  for (int64_t i = 0; i < d_in; ++i) sae.b_dec.data()[i] = static_cast<float>(r.normal()) * 0.1f;
  return sae;
}

// The hand-built model: one layer, attention only, 4 heads of d_head 2, d_model 8, vocabulary 7,
// no positions. Token kA's embedding is the only one with a component along w = e0 - e1 (the
// others have equal coordinates 0 and 1, and w sums to 0, so ln1 keeps that exactly); head 2's
// W_V reads w into its first value coordinate (its second is 0); head 2's W_O writes that
// coordinate along e7, which no other head writes; W_U's row of kUp is 5 e7 and of kDown -5 e7.
// So head 2 writes one known feature, z[head 2, coordinate 0] (hook_z column 4), present where
// head 2 attends to kA, promoting kUp and suppressing kDown.
constexpr int32_t kA = 3, kUp = 5, kDown = 6;
constexpr int kHead = 2;
struct HandBuilt {
  ModelConfig cfg;
  std::unique_ptr<TransformerLM> model;
};
HandBuilt one_head_writes_a_feature() {
  HandBuilt m;
  m.cfg = test::test_model({.vocab = 7, .d_model = 8, .layers = 1, .heads = 4, .d_ff = 0, .attn_bias = false});
  m.model = std::make_unique<TransformerLM>(m.cfg, 11);
  TransformerLM& model = *m.model;
  NoGradGuard no_grad;
  const int64_t D = 8, W = 8;
  model.pos_emb->weight.fill_(0.f);
  Rng r(5);
  for (int64_t t = 0; t < 7; ++t) {
    float* e = model.tok_emb.weight.data() + t * D;
    for (int64_t d = 0; d < D; ++d) e[d] = static_cast<float>(r.normal());
    e[1] = e[0];  // no component along w
  }
  model.tok_emb.weight.data()[kA * D + 0] = 1.f, model.tok_emb.weight.data()[kA * D + 1] = -1.f;
  float* wv = model.blocks[0]->attn.W_V.weight.data();  // (H*dh, D)
  for (int64_t d = 0; d < D; ++d) wv[(2 * kHead) * D + d] = 0.f, wv[(2 * kHead + 1) * D + d] = 0.f;
  wv[(2 * kHead) * D + 0] = 1.f, wv[(2 * kHead) * D + 1] = -1.f;
  float* wo = model.blocks[0]->attn.W_O.weight.data();  // (D, H*dh)
  for (int64_t d = 0; d < D; ++d) wo[d * W + 2 * kHead] = 0.f, wo[d * W + 2 * kHead + 1] = 0.f;
  for (int64_t c = 0; c < W; ++c) wo[7 * W + c] = 0.f;  // only head 2 writes e7
  wo[7 * W + 2 * kHead] = 1.f;
  float* wu = model.head.weight.data();  // (V, D)
  for (int64_t v = 0; v < 7; ++v) wu[v * D + 7] = 0.f;
  for (int64_t d = 0; d < 7; ++d) wu[kUp * D + d] = wu[kDown * D + d] = 0.f;
  wu[kUp * D + 7] = 5.f, wu[kDown * D + 7] = -5.f;
  return m;
}

// Its SAE: feature 0 is head 2's known direction (hook_z column 4) in decoder and encoder; the
// others random unit rows over every head; a b_dec that the bias term must carry.
Sae sae_holding_the_feature() {
  Sae sae = random_sae("blocks.0.attn.hook_z", 8, 6, SaeArch::Standard, 9);
  NoGradGuard no_grad;
  for (int64_t c = 0; c < 8; ++c) sae.W_dec.data()[c] = 0.f, sae.W_enc.data()[c * 6] = 0.f;
  sae.W_dec.data()[2 * kHead] = 1.f, sae.W_enc.data()[(2 * kHead) * 6] = 1.f;
  sae.b_enc.data()[0] = -0.05f;
  return sae;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_feature_one_head_writes_is_attributed_to_that_head_its_sources_and_its_tokens) {
  HandBuilt m = one_head_writes_a_feature();
  TransformerLM& model = *m.model;
  const Sae sae = sae_holding_the_feature();
  BOOST_TEST(hook_z_layer(model, sae) == 0);
  // the decoder split: all of feature 0 in head 2's block
  const Tensor frac = decoder_head_fractions(sae, 4);
  BOOST_TEST(frac.at({0, kHead}) >= 0.99f);
  // through W_O: head 2 writes e7, the other heads nothing
  const Tensor out = feature_head_outputs(model, sae);  // (6, 4, 8)
  for (int h = 0; h < 4; ++h)
    for (int64_t d = 0; d < 8; ++d) BOOST_TEST(out.at({0, h, d}) == (h == kHead && d == 7 ? 1.f : 0.f));
  // through ln_final and W_U: kUp first, kDown last
  const std::vector<FeatureLogitEffect> le = feature_logit_effects(model, sae, {0}, 1.0, 2);
  BOOST_TEST(le[0].promoted[0] == kUp);
  BOOST_TEST(le[0].suppressed[0] == kDown);
  // e7 centred is e7 - 1/8; with scale 2 and unit gain: 5 * (7/8) / 2
  BOOST_TEST(feature_logit_effects(model, sae, {0}, 2.0)[0].logits[kUp] == 5.0 * 7.0 / 8.0 / 2.0, boost::test_tools::tolerance(1e-6));

  // by source position: the pre-activation is exactly the sum; only head 2 and only kA sources carry it
  Ids ids = some_tokens(4, 6, 7, 21);
  ids.data[1] = kA, ids.data[6 + 3] = kA, ids.data[12 + 0] = kA;  // rows 0-2 hold kA; row 3 may not
  const FeatureSourceAttribution a = feature_source_attribution(model, sae, ids, 0);
  int active = 0;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t q = 0; q < 6; ++q) {
      double sum = a.bias, head2 = 0;
      for (int h = 0; h < 4; ++h)
        for (int64_t s = 0; s < 6; ++s) {
          const double c = a.at(b, q, h, s);
          sum += c;
          if (h == kHead) head2 += c;
          if (h != kHead || ids.data[b * 6 + s] != kA || s > q) BOOST_TEST(c == 0.0);
        }
      BOOST_TEST(sum == a.pre_activation[b * 6 + q], boost::test_tools::tolerance(1e-5));
      if (a.activation[b * 6 + q] > 0) {
        ++active;
        BOOST_TEST(sum == a.activation[b * 6 + q], boost::test_tools::tolerance(1e-5));
        BOOST_TEST(head2 / (sum - a.bias) >= 0.99);  // the head attribution of the activation
      }
    }
  BOOST_TEST(active >= 3);
  BOOST_TEST(a.bias == -0.05 - double(sae.b_dec.data()[2 * kHead]), boost::test_tools::tolerance(1e-7));
}

BOOST_AUTO_TEST_CASE(source_attribution_sums_to_the_pre_activation_with_gqa_biases_gates_and_rotary) {
  ModelConfig c = test::test_model({.heads = 4, .kv_heads = 2});
  c.positions = Positions::Rotary;
  TransformerLM model(c, 7);
  model.gates(1).data()[1] = 0.5f, model.gates(1).data()[3] = 0.f;
  Sae sae = random_sae("blocks.1.attn.hook_z", 8, 5, SaeArch::TopK, 3);
  const Ids ids = some_tokens(3, 6, c.vocab_size, 8);
  // with layer_norm too: each query's row centred and scaled, constants of the query
  for (int j = 0; j < 10; ++j) {
    sae.cfg.normalize_activations = j < 5 ? "none" : "layer_norm";
    const FeatureSourceAttribution a = feature_source_attribution(model, sae, ids, j % 5);
    for (int64_t i = 0; i < 18; ++i) {
      double sum = a.bias;
      for (int h = 0; h < 4; ++h)
        for (int64_t s = 0; s < 6; ++s) sum += a.at(i / 6, i % 6, h, s);
      BOOST_TEST(sum == a.pre_activation[i], boost::test_tools::tolerance(1e-5));
      if (a.activation[i] != 0) BOOST_TEST(sum == a.activation[i], boost::test_tools::tolerance(1e-5));
      for (int64_t s = 0; s < 6; ++s) BOOST_TEST(a.at(i / 6, i % 6, 3, s) == 0.0);  // gate 0
    }
  }
  // an SAE on another hook, or of another width, is refused naming it
  BOOST_CHECK_EXCEPTION(feature_source_attribution(model, random_sae("blocks.1.hook_resid_post", 8, 5, SaeArch::TopK, 3), ids, 0),
                        Error, [](const Error& e) {
                          return std::string(e.what()).find("SAE on 'blocks.1.hook_resid_post': head attribution needs") == 0;
                        });
  BOOST_CHECK_THROW(feature_source_attribution(model, random_sae("blocks.1.attn.hook_z", 6, 5, SaeArch::TopK, 3), ids, 0), Error);
  BOOST_CHECK_THROW(feature_source_attribution(model, sae, ids, 5), Error);
}

BOOST_AUTO_TEST_CASE(ablating_a_feature_subtracts_its_decoder_row_times_its_activation) {
  ModelConfig c = test::test_model({.heads = 4});
  TransformerLM model(c, 3);
  const std::string hook = "blocks.1.attn.hook_z";
  Sae sae = random_sae(hook, 8, 6, SaeArch::Standard, 4);
  sae.b_enc.data()[5] = -1e6f;  // feature 5 never fires
  const Ids ids = some_tokens(3, 6, c.vocab_size, 5);
  NoGradGuard no_grad;
  auto [clean_logits, clean] = model.run_with_cache(ids, name_is(hook));
  const Tensor x = sae_rows(clean[hook], 8, hook);  // (18, 8)
  const Tensor f = sae.encode(x);                   // (18, 6)
  for (const bool keep_error : {true, false}) {
    const int j = 2;
    ActivationCache after;
    Hooks hooks;
    hooks.add_forward(hook, sae_splice_edited(sae, {j}, 0.f, keep_error));
    hooks.cache(after, name_is(hook));
    ForwardOptions opt;
    opt.hooks = &hooks;
    model.forward(ids, opt);
    const Tensor spliced = sae_rows(after[hook], 8, hook);
    const Tensor recon = sae.forward(x);
    for (int64_t r = 0; r < 18; ++r)
      for (int64_t d = 0; d < 8; ++d) {
        const double removed = double(f.at({r, j})) * sae.W_dec.at({j, d});
        const double want = (keep_error ? x.at({r, d}) : recon.at({r, d})) - removed;
        BOOST_TEST(spliced.at({r, d}) == want, boost::test_tools::tolerance(1e-5));
      }
  }
  int fired = 0;
  for (int64_t r = 0; r < 18; ++r) fired += f.at({r, 2}) > 0;
  BOOST_TEST(fired > 0);
  // with the error kept, nothing edited is the model; a feature that never fires changes nothing
  Batch batch;
  batch.inputs = ids;
  batch.targets = some_tokens(3, 6, c.vocab_size, 6);
  const FeatureAblation ab = feature_ablation_effects(model, sae, {batch}, {2, 5});
  BOOST_TEST(ab.base_loss == evaluate(model, {batch}, false).loss, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(ab.loss_change[1] == 0.0);
  BOOST_TEST(ab.loss_change[0] != 0.0);
}

BOOST_AUTO_TEST_CASE(top_examples_hold_the_largest_activations_and_their_windows) {
  ModelConfig c = test::test_model({.heads = 4});
  TransformerLM model(c, 3);
  const std::string hook = "blocks.1.attn.hook_z";
  const Sae sae = random_sae(hook, 8, 6, SaeArch::Standard, 4);
  const std::vector<Ids> data = {some_tokens(5, 6, c.vocab_size, 1), some_tokens(4, 6, c.vocab_size, 2)};
  const std::vector<FeatureExamples> top = top_activating_examples(model, sae, unpadded_batches(data), {0, 3}, 3, 2, 1);
  // every row's activations, from the hook directly
  NoGradGuard no_grad;
  std::vector<std::vector<float>> acts;  // [row][t * 6 + feature]
  for (const Ids& ids : data) {
    auto [logits, cache] = model.run_with_cache(ids, name_is(hook));
    const Tensor f = sae.encode(sae_rows(cache[hook], 8, hook));
    for (int64_t b = 0; b < ids.shape[0]; ++b) acts.emplace_back(f.data() + b * 36, f.data() + (b + 1) * 36);
  }
  for (const FeatureExamples& fe : top) {
    std::vector<double> row_max;
    for (const auto& a : acts) {
      double m = 0;
      for (int t = 0; t < 6; ++t) m = std::max(m, double(a[t * 6 + fe.feature]));
      row_max.push_back(m);
    }
    std::vector<double> sorted = row_max;
    std::sort(sorted.rbegin(), sorted.rend());
    BOOST_REQUIRE(fe.examples.size() == 3u);
    for (size_t i = 0; i < 3; ++i) {
      const FeatureExample& e = fe.examples[i];
      BOOST_TEST(e.max_activation == sorted[i]);
      BOOST_TEST(e.max_activation == row_max[e.row]);
      BOOST_TEST(e.window_start == std::max<int64_t>(0, e.position - 2));
      BOOST_TEST(e.tokens.size() == static_cast<size_t>(std::min<int64_t>(5, e.position + 1) - e.window_start + 1));
      for (size_t t = 0; t < e.tokens.size(); ++t) {
        const int64_t pos = e.window_start + static_cast<int64_t>(t);
        const int32_t token = e.row < 5 ? data[0].data[e.row * 6 + pos] : data[1].data[(e.row - 5) * 6 + pos];
        BOOST_TEST(e.tokens[t] == token);
        BOOST_TEST(e.activations[t] == acts[e.row][pos * 6 + fe.feature]);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(one_sae_over_identical_snapshots_gives_identical_rows) {
  ModelConfig c = test::test_model({.heads = 4});
  const Sae sae = random_sae("blocks.1.attn.hook_z", 8, 6, SaeArch::Standard, 4);
  const std::vector<Ids> data = {some_tokens(4, 6, c.vocab_size, 1)};
  // steps 0 and 10 hold the same weights (seed 3), step 20 others (seed 4)
  const FeaturesOverTraining o = features_over_training(
      {0, 10, 20}, [&](size_t i) { return std::make_unique<TransformerLM>(c, i < 2 ? 3 : 4); }, sae, unpadded_batches(data));
  BOOST_TEST(o.tokens == 24);
  BOOST_TEST(o.mean_activation[0] == o.mean_activation[1]);
  BOOST_TEST(o.firing_frequency[0] == o.firing_frequency[1]);
  BOOST_TEST(o.mean_activation[0] != o.mean_activation[2]);
  TransformerLM m(c, 3);
  const FeaturePresence p = feature_presence(m, sae, unpadded_batches(data));
  BOOST_TEST(p.mean_activation == o.mean_activation[0]);
  BOOST_TEST(features_over_training_csv(o).rfind("step,feature,mean_activation,firing_frequency\n0,0,", 0) == 0);
}

BOOST_AUTO_TEST_CASE(matching_an_sae_to_a_permuted_copy_recovers_the_permutation) {
  const Sae a = random_sae("blocks.1.attn.hook_z", 8, 12, SaeArch::TopK, 4);
  const std::vector<int> perm = {3, 7, 0, 11, 5, 1, 9, 2, 10, 4, 8, 6};  // b's feature i is a's perm[i]
  Sae b = random_sae("blocks.1.attn.hook_z", 8, 12, SaeArch::TopK, 5);
  NoGradGuard no_grad;
  for (int i = 0; i < 12; ++i)
    for (int64_t d = 0; d < 8; ++d) b.W_dec.data()[i * 8 + d] = a.W_dec.data()[perm[i] * 8 + d] * 1.5f;  // scale-free
  const FeatureMatch m = match_sae_features(a, b);
  for (int i = 0; i < 12; ++i) {
    BOOST_TEST(m.partner[perm[i]] == i);
    BOOST_TEST(m.cosine[perm[i]] == 1.0, boost::test_tools::tolerance(1e-6));
  }
  BOOST_TEST(m.mean_cosine == 1.0, boost::test_tools::tolerance(1e-6));
  BOOST_CHECK_THROW(match_sae_features(a, random_sae("x", 6, 12, SaeArch::TopK, 5)), Error);
}
