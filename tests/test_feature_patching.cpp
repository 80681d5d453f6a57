// SAE features as nodes: SAEs attached to the model (TransformerLM::add_sae, SAELens's
// HookedSAETransformer) make their features hook points, patched by the generic patching over
// a `feature` axis (analysis/patching.h).
#define BOOST_TEST_MODULE feature_patching
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>

#include "analysis/edges.h"
#include "analysis/patching.h"
#include "models/sae.h"
#include "tests/fixtures.h"

using namespace hl;

namespace {

const std::string kHook = "blocks.1.attn.hook_z";
const std::string kActs = kHook + ".hook_sae_acts_post", kError = kHook + ".hook_sae_error";

Ids some_tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Rng r(seed);
  Ids ids({B, T});
  for (auto& v : ids.data) v = static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(vocab));
  return ids;
}

// Each row's token at `pos` replaced by the next token id.
Ids changed_at(const Ids& ids, int64_t pos, int64_t vocab) {
  Ids c = ids;
  for (int64_t b = 0; b < ids.shape[0]; ++b) c.data[b * ids.shape[1] + pos] = static_cast<int32_t>((ids.at(b, pos) + 1) % vocab);
  return c;
}

// A Standard (relu) SAE with random weights on hook_z of the 4-head test model (d_in 8), feature
// `dead` never firing.
std::shared_ptr<const Sae> random_sae(int64_t d_sae, int dead, uint64_t seed, const std::string& normalize = "none") {
  SaeConfig cfg;
  cfg.d_in = 8, cfg.d_sae = d_sae, cfg.arch = SaeArch::Standard, cfg.hook_name = kHook;
  cfg.normalize_activations = normalize;
  Rng r(seed);
  Sae sae = Sae::init(cfg, r);
  NoGradGuard no_grad;
  for (int64_t i = 0; i < sae.W_enc.numel(); ++i) sae.W_enc.data()[i] = static_cast<float>(r.normal()) * 0.5f;
  for (int64_t i = 0; i < d_sae; ++i) sae.b_enc.data()[i] = static_cast<float>(r.normal()) * 0.1f;
  for (int64_t i = 0; i < 8; ++i) sae.b_dec.data()[i] = static_cast<float>(r.normal()) * 0.1f;
  sae.b_enc.data()[dead] = -1e6f;
  return std::make_shared<const Sae>(sae);
}

Tensor run_with(TransformerLM& model, const Ids& ids, const Hooks& hooks) {
  ForwardOptions opt;
  opt.hooks = &hooks;
  return model.forward(ids, opt);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(a.data()[i]) - b.data()[i]));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_attached_sae_with_its_error_term_changes_no_logit_and_its_features_are_hook_points) {
  const ModelConfig c = test::test_model({.heads = 4});
  TransformerLM model(c, 3);
  const Ids ids = some_tokens(3, 6, c.vocab_size, 5);
  NoGradGuard no_grad;
  const auto sae = random_sae(6, 5, 4);
  const Tensor plain = model.forward(ids);
  Hooks splice;
  add_sae_splice(splice, *sae);
  const Tensor reconstructed = run_with(model, ids, splice);  // the model with x_hat in place

  model.add_sae(sae);
  auto [logits, cache] = model.run_with_cache(ids, all_names());
  BOOST_TEST(max_abs_diff(logits, plain) == 0.0);              // bit for bit
  BOOST_TEST(max_abs_diff(model.forward(ids), plain) == 0.0);  // without hooks too
  // the features are the SAE's encoding of hook_z, heads concatenated
  const Tensor f = sae->encode(sae_rows(cache[kHook], 8, kHook));
  BOOST_TEST(max_abs_diff(reshape(cache[kActs], {18, 6}), f) == 0.0);
  const Tensor x_hat = reshape(cache[kHook + ".hook_sae_recons"], {18, 8});
  const Tensor x = sae_rows(cache[kHook], 8, kHook);
  BOOST_TEST(max_abs_diff(add(x_hat, reshape(cache[kError], {18, 8})), x) <= 1e-6);
  // listed where the model's hook points are, right after the point they splice
  std::vector<std::string> names;
  for (const HookPointInfo& p : describe_hook_points(model)) names.push_back(p.name);
  const auto at = std::find(names.begin(), names.end(), kHook);
  BOOST_REQUIRE(at != names.end());
  BOOST_TEST(*(at + 3) == kActs);
  BOOST_TEST(describe_hook_points(model).size() == describe_hook_points(c).size() + 6);

  // without the error term, every forward runs on x_hat: the splice's logits, bit for bit
  model.reset_saes();
  model.add_sae(sae, false);
  BOOST_TEST(max_abs_diff(model.forward(ids), reconstructed) == 0.0);
  model.reset_saes();
  BOOST_TEST(max_abs_diff(model.forward(ids), plain) == 0.0);

  // refused: a hook the model lacks, a second SAE at one hook
  SaeConfig elsewhere = sae->cfg;
  elsewhere.hook_name = "blocks.7.attn.hook_z";
  Sae other = *sae;
  other.cfg = elsewhere;
  BOOST_CHECK_EXCEPTION(model.add_sae(std::make_shared<const Sae>(other)), Error, [](const Error& e) {
    return std::string(e.what()).find("'blocks.7.attn.hook_z' is not a hook point of this model") != std::string::npos;
  });
  model.add_sae(sae);
  BOOST_CHECK_THROW(model.add_sae(sae), Error);
}

BOOST_AUTO_TEST_CASE(patching_every_feature_and_the_error_is_patching_the_whole_hook) {
  const ModelConfig c = test::test_model({.heads = 4});
  TransformerLM model(c, 3);
  const Ids clean = some_tokens(3, 6, c.vocab_size, 5), corrupted = changed_at(clean, 1, c.vocab_size);
  NoGradGuard no_grad;
  model.add_sae(random_sae(6, 5, 4));
  const ActivationCache cc = model.run_with_cache(clean, names_in({kHook, kActs, kError})).second;
  Hooks nodes, whole;
  nodes.add_forward(kActs, [&](const Tensor&, const std::string&) { return cc[kActs]; });
  nodes.add_forward(kError, [&](const Tensor&, const std::string&) { return cc[kError]; });
  whole.add_forward(kHook, [&](const Tensor&, const std::string&) { return cc[kHook]; });
  const Tensor by_nodes = run_with(model, corrupted, nodes), by_hook = run_with(model, corrupted, whole);
  // x_hat(f_clean) + (x_clean - x_hat(f_clean)) against x_clean: float32 rounding of one add
  BOOST_TEST(max_abs_diff(by_nodes, by_hook) <= 1e-5);
  BOOST_TEST(max_abs_diff(by_hook, model.forward(corrupted)) > 1e-3);  // the patch moves the logits
}

BOOST_AUTO_TEST_CASE(patching_one_feature_adds_its_activation_change_times_its_decoder_row) {
  const ModelConfig c = test::test_model({.heads = 4});
  TransformerLM model(c, 3);
  const Ids clean = some_tokens(3, 6, c.vocab_size, 5), corrupted = changed_at(clean, 1, c.vocab_size);
  NoGradGuard no_grad;
  const int64_t F = 6, N = 18;
  const auto sae = random_sae(F, 5, 4);
  // by hand, on the model without the SAE: hook_z of the corrupted run + (f_clean - f_corr)_j W_dec[j]
  const Tensor x_clean = sae_rows(model.run_with_cache(clean, name_is(kHook)).second[kHook], 8, kHook);
  const Tensor x_corr = sae_rows(model.run_with_cache(corrupted, name_is(kHook)).second[kHook], 8, kHook);
  const Tensor f_clean = sae->encode(x_clean), f_corr = sae->encode(x_corr);
  Rng r(9);
  Tensor w = Tensor::empty({3, 6, c.vocab_size});
  for (int64_t i = 0; i < w.numel(); ++i) w.data()[i] = static_cast<float>(r.normal());
  const PatchMetric metric = [&](const Tensor& logits, const std::vector<int64_t>&) {
    double s = 0;
    for (int64_t i = 0; i < logits.numel(); ++i) s += double(logits.data()[i]) * w.data()[i];
    return s;
  };
  auto by_hand = [&](int64_t j, int64_t pos) {  // pos -1: every position
    Tensor x = x_corr.clone();
    for (int64_t n = 0; n < N; ++n) {
      if (pos >= 0 && n % 6 != pos) continue;
      const float df = f_clean.at({n, j}) - f_corr.at({n, j});
      for (int64_t d = 0; d < 8; ++d) x.data()[n * 8 + d] += df * sae->W_dec.at({j, d});
    }
    Hooks h;
    h.add_forward(kHook, [&](const Tensor& z, const std::string&) { return reshape(x, z.shape()); });
    return metric(run_with(model, corrupted, h), {});
  };
  std::vector<double> want_feature, want_pos;
  for (int64_t j = 0; j < F; ++j) {
    want_feature.push_back(by_hand(j, -1));
    for (int64_t p = 0; p < 6; ++p) want_pos.push_back(by_hand(j, p));
  }
  const double corrupted_metric = metric(model.forward(corrupted), {});

  model.add_sae(sae);
  const PatchGrid g = generic_activation_patch(model, clean, corrupted, kActs, {"feature"}, metric);
  BOOST_TEST((g.shape == std::vector<int64_t>{F}));
  const PatchGrid gp = generic_activation_patch(model, clean, corrupted, kActs, {"feature", "pos"}, metric);
  BOOST_TEST((gp.shape == std::vector<int64_t>{F, 6}));
  for (int64_t j = 0; j < F; ++j) {
    // float32 rounding: x_hat(f') + (x - x_hat(f)) against x + (f' - f) W_dec, summed over 378 weighted logits
    BOOST_TEST(std::fabs(g.values[j] - want_feature[j]) <= 1e-4);
    for (int64_t p = 0; p < 6; ++p) BOOST_TEST(std::fabs(gp.at({j, p}) - want_pos[j * 6 + p]) <= 1e-4);
  }
  BOOST_TEST(g.values[5] == corrupted_metric);  // never fires: not run, the corrupted run's exactly
  BOOST_TEST(gp.at({0, 0}) == corrupted_metric);  // before the corruption nothing differs
  int moved = 0;
  for (int64_t j = 0; j < 5; ++j) moved += std::fabs(want_feature[j] - corrupted_metric) > 1e-3;
  BOOST_TEST(moved >= 2);  // the test patches features that matter
  BOOST_TEST((default_patch_axes(model, kActs) == std::vector<std::string>{"feature"}));
  BOOST_CHECK_THROW(generic_activation_patch(model, clean, corrupted, kHook + ".hook_sae_error", {"feature"}, metric), Error);

  // the restored fraction of the logit difference (patch's metric) over the answers' window
  PatchingInputs in;
  in.clean = clean, in.corrupted = corrupted;
  for (int64_t b = 0; b < 3; ++b) in.answers.push_back({b, 1, clean.at(b, 2), static_cast<int32_t>((clean.at(b, 2) + 3) % 7)});
  const PatchGrid fr = generic_activation_patch(model, in, kActs, {"feature", "pos"});
  const double mc = logit_difference(model.forward(clean), in.answers).data()[0];
  const double mk = logit_difference(model.forward(corrupted), in.answers).data()[0];
  const PatchGrid full = generic_activation_patch(model, clean, corrupted, kActs, {"feature", "pos"},
                                                  [&](const Tensor& logits, const std::vector<int64_t>&) {
                                                    return (logit_difference(logits, in.answers).data()[0] - mk) / (mc - mk);
                                                  });
  BOOST_TEST(std::fabs(mc - mk) > 1e-3);
  // the window's runs against whole runs: float32 rounding (fewer rows per product)
  for (size_t i = 0; i < fr.values.size(); ++i) BOOST_TEST(std::fabs(fr.values[i] - full.values[i]) <= 1e-4);
}

BOOST_AUTO_TEST_CASE(feature_senders_sum_to_the_heads_they_replace_and_their_edges_are_patched_runs) {
  const ModelConfig c = test::test_model({.heads = 4});
  TransformerLM model(c, 3);
  PatchingInputs in;
  in.clean = some_tokens(3, 6, c.vocab_size, 5), in.corrupted = changed_at(in.clean, 1, c.vocab_size);
  for (int64_t b = 0; b < 3; ++b) in.answers.push_back({b, 4, in.clean.at(b, 2), static_cast<int32_t>((in.clean.at(b, 2) + 3) % 7)});
  const Tensor heads = edge_sender_delta_stack(model, in);  // embed, L0H0..L0H3, L1H0..L1H3
  const int64_t K = heads.numel() / heads.size(0);
  for (const std::string normalize : {"none", "layer_norm"}) {
    const auto sae = random_sae(6, 5, 4, normalize);
    std::vector<int> features;
    const Tensor senders = feature_sender_delta_stack(model, in, *sae, features);  // features that differ, then the error
    BOOST_TEST(static_cast<int64_t>(features.size()) + 1 == senders.size(0));
    BOOST_TEST((std::find(features.begin(), features.end(), 5) == features.end()));  // never fires: no delta
    double worst = 0;
    for (int64_t k = 0; k < K; ++k) {
      double f = 0, h = 0;
      for (int64_t s = 0; s < senders.size(0); ++s) f += senders.data()[s * K + k];
      for (int64_t s = 5; s < 9; ++s) h += heads.data()[s * K + k];
      worst = std::max(worst, std::fabs(f - h));
    }
    BOOST_TEST(worst <= 1e-5);  // the identity, to float32 rounding of the products through W_O

    const double clean = edge_metric(model.forward(in.clean), in.answers);
    const std::vector<FeatureSenderEdge> edges = feature_sender_edges(model, in, *sae);
    BOOST_TEST(edges.size() == 2 * senders.size(0));  // layer 1's heads are read by mlp1 and the logits
    int moved = 0;
    for (const FeatureSenderEdge& e : edges) {
      BOOST_TEST((e.receiver.name() == "mlp1" || e.receiver.name() == "logits"));
      const int64_t s = e.feature < 0 ? senders.size(0) - 1 : std::find(features.begin(), features.end(), e.feature) - features.begin();
      const Tensor delta = reshape(slice(senders, 0, s, s + 1), {3, 6, c.d_model});
      BOOST_TEST(std::fabs(e.exact - (patched_receiver_metric(model, in, e.receiver, delta) - clean)) <= 1e-5);
      const Tensor g = receiver_input_gradient(model, in, e.receiver);
      double a = 0;
      for (int64_t k = 0; k < K; ++k) a += double(delta.data()[k]) * g.data()[k];
      BOOST_TEST(std::fabs(e.attribution - a) <= 1e-6 * std::max(1.0, std::fabs(a)));
      moved += std::fabs(e.exact) > 1e-4;
    }
    BOOST_TEST(moved >= 2);
  }
  SaeConfig resid = random_sae(6, 5, 4)->cfg;
  resid.hook_name = "blocks.1.hook_resid_pre";
  Rng rng(1);
  BOOST_CHECK_THROW(check_feature_sender_sae(c, Sae::init(resid, rng)), Error);
}

BOOST_AUTO_TEST_CASE(gradients_reach_the_features_and_the_error_and_the_model_keeps_its_own) {
  const ModelConfig c = test::test_model({.heads = 4});
  TransformerLM model(c, 3);
  const Ids ids = some_tokens(3, 6, c.vocab_size, 5);
  const auto sae = random_sae(6, 5, 4);
  Rng r(2);
  Tensor w = Tensor::empty({3, 6, c.vocab_size});
  for (int64_t i = 0; i < w.numel(); ++i) w.data()[i] = static_cast<float>(r.normal());
  const std::string resid0 = "blocks.0.hook_resid_pre", out = kHook + ".hook_sae_output";
  auto grads = [&](const std::vector<std::string>& names) {
    ActivationCache cache;
    Hooks hooks;
    hooks.cache(cache, names_in(names), true);
    sum(mul(run_with(model, ids, hooks), w)).backward();
    return cache;
  };
  const ActivationCache plain = grads({resid0});
  model.add_sae(sae);
  const ActivationCache spliced = grads({resid0, kActs, kError, out});
  const int64_t N = 18, F = 6, D = 8;
  // dL/df = dL/d(output) W_dec^T; dL/d(error) = dL/d(output)
  const Tensor g_out = reshape(spliced.grad(out), {N, D});
  const Tensor want = matmul(g_out, sae->W_dec, false, true);  // (N, F)
  BOOST_TEST(max_abs_diff(reshape(spliced.grad(kActs), {N, F}), want) <= 1e-5);
  BOOST_TEST(max_abs_diff(reshape(spliced.grad(kError), {N, D}), g_out) == 0.0);
  double largest = 0;
  for (int64_t i = 0; i < want.numel(); ++i) largest = std::max(largest, std::fabs(double(want.data()[i])));
  BOOST_TEST(largest > 1e-3);
  // the model's own gradient upstream (the output is x_hat + (x - x_hat): x to float32 rounding)
  BOOST_TEST(max_abs_diff(spliced.grad(resid0), plain.grad(resid0)) <= 1e-5);
}
