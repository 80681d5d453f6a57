// Ablations by hook name (zero, mean, resample; one head, some positions) and generic activation
// patching over a hook's axes: the identities that pin them down, and the refusals.
#define BOOST_TEST_MODULE ablation
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "analysis/ablation.h"
#include "analysis/heads.h"
#include "analysis/patching.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;

namespace {

ModelConfig small() { return test_model({.vocab = 9, .heads = 4, .d_ff = 16, .max_seq_len = 8}); }

Batch batch_of(const Ids& inputs) {
  Batch b;
  b.inputs = inputs;
  b.targets = Ids(inputs.shape);
  const int64_t B = inputs.shape[0], T = inputs.shape[1];
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) b.targets.at(r, t) = t + 1 < T ? inputs.at(r, t + 1) : -1;
  return b;
}
std::vector<Batch> data() {
  return {batch_of(Ids(Shape{2, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 8, 7})), batch_of(Ids(Shape{3, 6}, {2, 2, 5, 1, 0, 3, 7, 6, 5, 4, 3, 2, 0, 8, 1, 1, 4, 6}))};
}

}  // namespace

BOOST_AUTO_TEST_CASE(hook_axes_name_the_batch_position_and_head_axes) {
  const ModelConfig c = small();
  const HookAxes z = hook_axes(c, "blocks.1.attn.hook_z");
  BOOST_TEST((z.ndim == 4 && z.batch == 0 && z.pos == 1 && z.head == 2 && z.src_pos == -1));
  const HookAxes p = hook_axes(c, "blocks.0.attn.hook_pattern");
  BOOST_TEST((p.ndim == 4 && p.batch == 0 && p.head == 1 && p.pos == 2 && p.src_pos == 3));
  const HookAxes r = hook_axes(c, "blocks.0.hook_resid_pre");
  BOOST_TEST((r.ndim == 3 && r.batch == 0 && r.pos == 1 && r.head == -1));
  const HookAxes e = hook_axes(c, "hook_pos_embed");
  BOOST_TEST((e.ndim == 2 && e.batch == -1 && e.pos == 0));
  const HookAxes m = hook_axes(c, "blocks.0.mlp.hook_post");
  BOOST_TEST((m.ndim == 3 && m.head == -1));
}

BOOST_AUTO_TEST_CASE(zero_ablating_a_heads_z_equals_gating_the_head_off) {
  TransformerLM m(small(), 5);
  const std::vector<Batch> d = data();
  AblationOptions o;
  o.site = {"blocks.1.attn.hook_z", 2, {}};
  const KnockoutResult r = knockout(m, d, o);
  BOOST_TEST(r.ablated_mean_loss != r.clean_mean_loss);
  m.gates(1).data()[2] = 0.f;
  AblationOptions none;  // nothing replaced: the clean run of the gated model
  none.site = {"blocks.1.attn.hook_z", 2, {}};
  none.kind = AblationKind::Resample;
  none.permutation = {0, 1, 2, 3, 4};
  const KnockoutResult g = knockout(m, d, none);
  BOOST_TEST(g.clean_loss == r.ablated_loss, boost::test_tools::per_element());
  BOOST_TEST(g.clean_acc == r.ablated_acc, boost::test_tools::per_element());
  BOOST_TEST(g.clean_mean_loss == r.ablated_mean_loss);
}

BOOST_AUTO_TEST_CASE(resampling_with_the_identity_permutation_changes_nothing) {
  TransformerLM m(small(), 6);
  for (const char* hook : {"blocks.0.attn.hook_z", "blocks.0.attn.hook_q", "blocks.1.attn.hook_pattern", "blocks.0.hook_resid_mid",
                           "blocks.1.mlp.hook_post"}) {
    AblationOptions o;
    o.site = {hook, -1, {}};
    o.kind = AblationKind::Resample;
    o.permutation = {0, 1, 2, 3, 4};
    const KnockoutResult r = knockout(m, data(), o);
    BOOST_TEST_CONTEXT(hook) {
      BOOST_TEST(r.ablated_loss == r.clean_loss, boost::test_tools::per_element());
      BOOST_TEST(r.ablated_mean_loss == r.clean_mean_loss);
    }
  }
  // a real permutation (from the seed: a single cycle, nobody keeps its own) changes the loss
  const std::vector<int64_t> p = resample_permutation(5, 3);
  for (int64_t i = 0; i < 5; ++i) BOOST_TEST(p[static_cast<size_t>(i)] != i);
  AblationOptions o;
  o.site = {"blocks.0.hook_resid_mid", -1, {}};
  o.kind = AblationKind::Resample;
  o.seed = 3;
  const KnockoutResult r = knockout(m, data(), o);
  BOOST_TEST(r.permutation == p, boost::test_tools::per_element());
  BOOST_TEST(r.ablated_mean_loss != r.clean_mean_loss);
}

BOOST_AUTO_TEST_CASE(mean_ablation_with_the_mean_of_a_constant_input_changes_nothing) {
  // the mean over copies of one example is that example's activation, exactly (double sums)
  TransformerLM m(small(), 7);
  const Batch one = batch_of(Ids(Shape{1, 6}, {1, 3, 5, 2, 6, 0}));
  for (const char* hook : {"blocks.1.attn.hook_z", "blocks.0.hook_resid_post", "blocks.0.attn.hook_pattern"}) {
    AblationOptions o;
    o.site = {hook, -1, {}};
    o.kind = AblationKind::Mean;
    o.per_position = true;
    o.mean_data = {one, one, one};
    const KnockoutResult r = knockout(m, {one}, o);
    BOOST_TEST_CONTEXT(hook) { BOOST_TEST(r.ablated_loss == r.clean_loss, boost::test_tools::per_element()); }
  }
  // over all positions the mean differs from the activation: the loss changes
  AblationOptions o;
  o.site = {"blocks.0.hook_resid_post", -1, {}};
  o.kind = AblationKind::Mean;
  o.mean_data = {one};
  const KnockoutResult all = knockout(m, {one}, o);
  BOOST_TEST(all.ablated_mean_loss != all.clean_mean_loss);
}

BOOST_AUTO_TEST_CASE(an_ablation_replaces_only_its_head_and_positions) {
  const ModelConfig c = small();
  const HookAxes a = hook_axes(c, "blocks.0.attn.hook_z");
  Tensor x = Tensor::empty({2, 5, 4, 2});  // (B, T, H, dh)
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(i + 1);
  Tensor mean = Tensor::empty({1, 1, 4, 2});  // over every position
  for (int64_t i = 0; i < 8; ++i) mean.data()[i] = -static_cast<float>(i + 1);
  const Tensor y = ablated_activation(x, a, {"blocks.0.attn.hook_z", 1, {0, 3}}, mean);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t j = 0; j < 2; ++j) {
          const int64_t i = ((b * 5 + t) * 4 + h) * 2 + j;
          const bool hit = h == 1 && (t == 0 || t == 3);
          BOOST_TEST(y.data()[i] == (hit ? mean.data()[h * 2 + j] : x.data()[i]));
        }
  // zeros, -inf kept elsewhere (scores): never inf * 0
  Tensor s = Tensor::full({1, 4, 3, 3}, -INFINITY);
  const Tensor z = ablated_activation(s, hook_axes(c, "blocks.0.attn.hook_attn_scores"), {"blocks.0.attn.hook_attn_scores", 2, {}});
  for (int64_t i = 0; i < z.numel(); ++i) BOOST_TEST(z.data()[i] == ((i / 9) % 4 == 2 ? 0.f : -INFINITY));
}

BOOST_AUTO_TEST_CASE(bad_ablations_are_refused_with_one_clear_message) {
  TransformerLM m(small(), 8);
  auto run = [&](AblationOptions o, std::vector<Batch> d) { return error_of([&] { knockout(m, d, o); }); };
  BOOST_TEST(run({{"blocks.9.attn.hook_z", -1, {}}}, data()).find("unknown hook point 'blocks.9.attn.hook_z'") != std::string::npos);
  BOOST_TEST(run({{"blocks.0.attn.hook_z", 4, {}}}, data()).find("head 4 is outside 0..3") != std::string::npos);
  BOOST_TEST(run({{"blocks.0.hook_resid_pre", 0, {}}}, data()).find("has no head axis") != std::string::npos);
  BOOST_TEST(run({{"blocks.0.attn.hook_z", 0, {6}}}, data()).find("position 6 is outside 0..5") != std::string::npos);
  BOOST_TEST(run({{"blocks.0.attn.hook_z", 0, {}}}, {}).find("no data") != std::string::npos);
  AblationOptions bad_perm{{"blocks.0.attn.hook_z", 0, {}}, AblationKind::Resample};
  bad_perm.permutation = {0, 0, 1, 2, 3};
  BOOST_TEST(run(bad_perm, data()).find("permutation is not one of 0..4") != std::string::npos);
  BOOST_TEST(error_of([] { parse_ablation_kind("half"); }).find("expected zero, mean or resample") != std::string::npos);
}

// ---- generic activation patching ------------------------------------------------------------------

namespace {
PatchingInputs patching_inputs() {
  PatchingInputs in;
  in.clean = Ids(Shape{2, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 8, 7});
  in.corrupted = in.clean;
  in.corrupted.at(0, 2) = 7;  // one source symbol per row changed
  in.corrupted.at(1, 2) = 0;
  in.answers = {{0, 4, 5, 7}, {1, 5, 1, 0}};
  in.source_pos = {2, 2};
  return in;
}
}  // namespace

BOOST_AUTO_TEST_CASE(patching_a_whole_residual_stream_restores_the_clean_run_exactly) {
  TransformerLM m(small(), 11);
  const PatchingInputs in = patching_inputs();
  EvalScope mode(m);
  Tensor clean_logits;
  {
    NoGradGuard ng;
    clean_logits = m.forward(in.clean);
  }
  for (const char* hook : {"hook_resid_pre", "hook_resid_mid", "hook_resid_post"}) {
    // every position (no pos axis): the patched run's logits are the clean run's, bit for bit
    const PatchGrid g = generic_activation_patch(m, in.clean, in.corrupted, hook, {"layer"},
                                                 [&](const Tensor& logits, const std::vector<int64_t>&) {
                                                   return logits.to_vector() == clean_logits.to_vector() ? 1.0 : 0.0;
                                                 });
    BOOST_TEST_CONTEXT(hook) {
      BOOST_TEST((g.shape == std::vector<int64_t>{2}));
      BOOST_TEST(g.values == std::vector<double>(2, 1.0), boost::test_tools::per_element());
      // and so the default metric restores exactly 1
      const PatchGrid d = generic_activation_patch(m, in, hook, {"layer"});
      BOOST_TEST(d.values == std::vector<double>(2, 1.0), boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(patching_before_the_corrupted_position_restores_nothing) {
  // causal: activations before position 2 are the same in both runs, so patching them gives 0
  TransformerLM m(small(), 12);
  const PatchingInputs in = patching_inputs();
  const PatchGrid z = generic_activation_patch(m, in, "hook_z", {"layer", "head", "pos"});
  BOOST_TEST((z.shape == std::vector<int64_t>{2, 4, 6}));
  const PatchGrid p = generic_activation_patch(m, in, "attn.hook_pattern", {"layer", "head", "pos", "src_pos"});
  BOOST_TEST((p.shape == std::vector<int64_t>{2, 4, 6, 6}));
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t t = 0; t < 2; ++t) {
        BOOST_TEST(z.at({l, h, t}) == 0.0);
        for (int64_t s = 0; s < 6; ++s) BOOST_TEST(p.at({l, h, t, s}) == 0.0);
      }
  BOOST_TEST(z.hooks == (std::vector<std::string>{"blocks.0.attn.hook_z", "blocks.1.attn.hook_z"}), boost::test_tools::per_element());
  // one full name: no layer axis
  const PatchGrid one = generic_activation_patch(m, in, "blocks.1.attn.hook_z", {"head"});
  const PatchGrid by_layer = generic_activation_patch(m, in, "hook_z", {"layer", "head"});
  for (int64_t h = 0; h < 4; ++h) BOOST_TEST(one.at({h}) == by_layer.at({1, h}));
}

BOOST_AUTO_TEST_CASE(patching_hook_z_per_head_equals_patching_each_head_by_hand) {
  TransformerLM m(small(), 13);
  const PatchingInputs in = patching_inputs();
  const PatchingResult r = activation_patching(m, in);
  const PatchGrid g = generic_activation_patch(m, in, "hook_z", {"layer", "head"});
  // by hand: head h of the clean hook_z written into the corrupted run, the metric normalised
  EvalScope mode(m);
  NoGradGuard ng;
  const auto [clean_logits, cache] = m.run_with_cache(in.clean, names_ending_with("attn.hook_z"));
  const double mc = logit_difference(clean_logits, in.answers).item(),
               mk = logit_difference(m.forward(in.corrupted), in.answers).item();
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      const std::string name = "blocks." + std::to_string(l) + ".attn.hook_z";
      Hooks hooks;
      hooks.add_forward(name, [&](const Tensor& z, const std::string&) {  // (B, T, H, dh)
        Tensor y = z.clone();
        for (int64_t i = 0; i < y.numel(); ++i)
          if ((i / 2) % 4 == h) y.data()[i] = cache[name].data()[i];
        return y;
      });
      ForwardOptions opt;
      opt.hooks = &hooks;
      const double want = (logit_difference(m.forward(in.corrupted, opt), in.answers).item() - mk) / (mc - mk);
      // a patched run computes only the positions its patch reaches, with fewer rows in its products
      // than the whole run, so another kernel may sum them: equal within float32 rounding
      BOOST_TEST(std::abs(g.at({l, h}) - want) <= 1e-5);
      BOOST_TEST(std::abs(r.z_exact[l][h] - want) <= 1e-5);
    }
  BOOST_TEST(g.clean_metric == r.clean_metric);
}

BOOST_AUTO_TEST_CASE(bad_patching_requests_are_refused_with_one_clear_message) {
  TransformerLM m(small(), 14);
  PatchingInputs in = patching_inputs();
  auto run = [&](const PatchingInputs& x, const std::string& hook, const std::vector<std::string>& axes) {
    return error_of([&] { generic_activation_patch(m, x, hook, axes); });
  };
  PatchingInputs shorter = in;
  shorter.corrupted = Ids(Shape{2, 5}, {1, 3, 7, 2, 6, 4, 4, 0, 2, 8});
  BOOST_TEST(run(shorter, "hook_z", {"layer", "head"}).find("must be (B, T) of one shape") != std::string::npos);
  BOOST_TEST(run(in, "hook_resid_pre", {"layer", "head"}).find("has no head axis") != std::string::npos);
  BOOST_TEST(run(in, "hook_z", {"layer", "time"}).find("unknown axis 'time'") != std::string::npos);
  BOOST_TEST(run(in, "hook_zz", {"layer"}).find("no hook point 'hook_zz'") != std::string::npos);
  BOOST_TEST(run(in, "hook_normalized", {"layer"}).find("ambiguous") != std::string::npos);
  BOOST_TEST(run(in, "blocks.0.attn.hook_z", {"layer", "head"}).find("name it without its layer") != std::string::npos);
  BOOST_TEST(run(in, "hook_z", {"head"}).find("name it in full") != std::string::npos);
  BOOST_TEST(run(in, "hook_z", {"layer", "head", "head"}).find("given twice") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(patching_one_heads_split_input_equals_patching_its_q_k_or_v) {
  // head h's q (k, v) is W_h times its copy of the input, so patching that copy at (layer, pos)
  // is patching head h's q (k, v) there: the same restored fraction, to float32 rounding (the
  // per-head projection a replaced copy takes sums in another order than the usual one)
  TransformerLM m(small(), 15);
  const PatchingInputs in = patching_inputs();
  for (const char* x : {"q", "k", "v"}) {
    const PatchGrid g = generic_activation_patch(m, in, std::string("hook_") + x + "_input", {"layer", "head", "pos"});
    const PatchGrid direct = generic_activation_patch(m, in, std::string("hook_") + x, {"layer", "head", "pos"});
    BOOST_TEST((g.shape == std::vector<int64_t>{2, 4, 6}));
    double largest = 0;
    for (size_t i = 0; i < g.values.size(); ++i) {
      BOOST_TEST(std::fabs(g.values[i] - direct.values[i]) <= 1e-4 * std::max(1.0, std::fabs(direct.values[i])), x << " at " << i);
      largest = std::max(largest, std::fabs(g.values[i]));
    }
    if (std::string(x) == "v") BOOST_TEST(largest > 0.1);  // not all zeros: the comparison means something
  }
}

// ---- batched passes in chunks of rows --------------------------------------------------------------
namespace {
// n rows of a repeated block over the small model's vocabulary, each row's first copy corrupted
PatchingInputs many_patching_inputs(int64_t n) {
  Batch b;
  b.inputs = Ids(Shape{n, 8});
  b.targets = Ids(Shape{n, 8});
  Rng rng(3);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t t = 0; t < 4; ++t) b.inputs.at(r, t) = b.inputs.at(r, t + 4) = static_cast<int32_t>(rng.next_u64() % 9);
    for (int64_t t = 0; t < 8; ++t) b.targets.at(r, t) = t + 1 < 8 ? b.inputs.at(r, t + 1) : -1;
  }
  return corrupt_one_symbol(b, 9, 5);
}
struct RowsPerPass {  // HEADLAB_TEST_ROWS_PER_PASS for one scope
  explicit RowsPerPass(const char* n) { setenv("HEADLAB_TEST_ROWS_PER_PASS", n, 1); }
  ~RowsPerPass() { unsetenv("HEADLAB_TEST_ROWS_PER_PASS"); }
};
}  // namespace

BOOST_AUTO_TEST_CASE(patching_in_chunks_of_rows_equals_one_batch_bit_for_bit) {
  // the shape of the CLI's small runs: 2 layers, 2 heads of 8, 9 tokens a row
  TransformerLM m(test_model({.vocab = 9, .d_model = 16, .heads = 2, .d_ff = 32, .max_seq_len = 64, .attn_bias = false}), 17);
  const PatchingInputs in = many_patching_inputs(560);
  BOOST_TEST_REQUIRE(in.clean.shape[0] > 400);
  const PatchingResult whole = activation_patching(m, in);  // the rows fit in one chunk
  const PatchGrid whole_resid = generic_activation_patch(m, in, "hook_resid_pre", {"layer", "pos"});
  // 1: the least (2048 tokens a chunk on up to 3 threads: 228 rows of 9), so 3 chunks of about 187
  // rows; 280: 2 chunks of 280 rows
  for (const char* per : {"1", "280"}) {
    RowsPerPass forced(per);
    BOOST_TEST_CONTEXT("rows per pass " << per) {
      const PatchingResult r = activation_patching(m, in);
      BOOST_TEST(r.clean_metric == whole.clean_metric);
      BOOST_TEST(r.corrupted_metric == whole.corrupted_metric);
      for (int l = 0; l < 2; ++l) {
        BOOST_TEST(r.z_exact[l] == whole.z_exact[l], boost::test_tools::per_element());
        BOOST_TEST(r.z_exact[l].size() == 2u);
        BOOST_TEST(r.z_attribution[l] == whole.z_attribution[l], boost::test_tools::per_element());
        BOOST_TEST(r.z_exact_ci95_lo[l] == whole.z_exact_ci95_lo[l], boost::test_tools::per_element());
        BOOST_TEST(r.z_exact_ci95_hi[l] == whole.z_exact_ci95_hi[l], boost::test_tools::per_element());
        BOOST_TEST(r.resid_exact[l] == whole.resid_exact[l], boost::test_tools::per_element());
        BOOST_TEST(r.resid_attribution[l] == whole.resid_attribution[l], boost::test_tools::per_element());
      }
      const PatchGrid g = generic_activation_patch(m, in, "hook_resid_pre", {"layer", "pos"});
      BOOST_TEST(g.values == whole_resid.values, boost::test_tools::per_element());
    }
  }
}

// ---- patched runs over the answers' window alone -----------------------------------------------------
namespace {
// Two shapes of today's blocks: GPT-2's (learned positions) and a Llama/Gemma-like one (rotary,
// grouped-query, RMSNorm, gated MLP, sandwich norms, soft-caps, a sliding window on even layers).
std::vector<std::pair<std::string, ModelConfig>> window_models() {
  ModelConfig gpt2 = test_model({.vocab = 11, .d_model = 16, .layers = 3, .heads = 4, .d_ff = 24, .max_seq_len = 12});
  ModelConfig modern = gpt2;
  modern.positions = Positions::Rotary;
  modern.n_kv_heads = 2;
  modern.normalization = NormKind::RMSNorm;
  modern.mlp = Mlp::SwiGLU;
  modern.sandwich_norm = true;
  modern.attn_softcap = 20.f;
  modern.final_softcap = 10.f;
  modern.sliding_window = 4;
  modern.window_layers = "alternate";
  modern.attn_bias = false;
  return {{"gpt2", gpt2}, {"modern", modern}};
}
// Three rows of 10 tokens, the corruption at 2, 3 and 4, several answers (two in a row, one
// before a later row's corruption), the last row padded after its 7 tokens.
PatchingInputs window_inputs() {
  PatchingInputs in;
  in.clean = Ids(Shape{3, 10}, {1, 3, 5, 2, 6, 0, 4, 9, 8, 7,   //
                                4, 4, 1, 2, 8, 7, 3, 3, 10, 5,  //
                                2, 7, 9, 1, 6, 5, 3, 0, 0, 0});
  in.corrupted = in.clean;
  in.corrupted.at(0, 2) = 10, in.corrupted.at(1, 3) = 0, in.corrupted.at(2, 4) = 8;
  in.answers = {{0, 5, 5, 10}, {0, 8, 2, 6}, {1, 2, 1, 9}, {1, 7, 2, 0}, {2, 6, 6, 8}};
  in.source_pos = {2, 3, 4};
  in.key_padding = Tensor::zeros({3, 10});
  for (int64_t t = 7; t < 10; ++t) in.key_padding.data()[2 * 10 + t] = 1.f;
  return in;
}
}  // namespace

BOOST_AUTO_TEST_CASE(forward_from_after_a_kv_cache_gives_the_forwards_later_positions) {
  for (const auto& [arch, cfg] : window_models()) {
    TransformerLM m(cfg, 21);
    EvalScope mode(m);
    NoGradGuard ng;
    const Ids ids = window_inputs().clean;
    const auto [logits, cache] = m.run_with_cache(ids, names_ending_with("hook_resid_pre"));  // (3, 10, V)
    for (int l = 0; l < 3; ++l)
      for (int64_t p : {0, 3, 9}) {
        BOOST_TEST_CONTEXT(arch << " from layer " << l << " position " << p) {
          std::vector<KVCacheLayer> kv(3);
          ForwardOptions opt;
          opt.kv_cache = &kv;
          Ids head(Shape{3, p});
          for (int64_t r = 0; r < 3; ++r)
            for (int64_t t = 0; t < p; ++t) head.at(r, t) = ids.at(r, t);
          if (p > 0) (void)m.forward(head, opt);
          const Tensor tail = m.forward_from(l, slice(cache["blocks." + std::to_string(l) + ".hook_resid_pre"], 1, p, 10), opt);
          const Tensor want = slice(logits, 1, p, 10);
          double worst = 0;
          for (int64_t i = 0; i < want.numel(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(tail.data()[i]) - want.data()[i]));
          BOOST_TEST(worst <= 1e-5);
        }
      }
    std::vector<KVCacheLayer> uneven(3);
    uneven[1].len = 2;
    ForwardOptions opt;
    opt.kv_cache = &uneven;
    BOOST_TEST(error_of([&] { m.forward_from(0, Tensor::zeros({3, 1, 16}), opt); }).find("holds 2 positions at layer 1, 0 at layer 0") !=
               std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(patching_over_the_answers_window_equals_patching_whole_runs) {
  // the default metric's sweeps run only what reaches the answers; a metric of its own sees whole
  // runs of every position and block: the restored fractions agree to float32 rounding (the
  // window's products take fewer rows, which may pick another kernel; bit for bit on this
  // machine's default OpenBLAS kernels)
  const PatchingInputs in = window_inputs();
  for (const auto& [arch, cfg] : window_models()) {
    TransformerLM m(cfg, 22);
    const PatchingResult r = activation_patching(m, in);
    const double mc = r.clean_metric, mk = r.corrupted_metric;
    auto whole_runs = [&](const std::string& hook, const std::vector<std::string>& axes) {
      return generic_activation_patch(m, in.clean, in.corrupted, hook, axes, [&](const Tensor& logits, const std::vector<int64_t>&) {
        LogitDifferenceSum sum(in.answers);  // the default metric's float sum
        sum.add(logits, 0);
        return (sum.value() - mk) / (mc - mk);
      });
    };
    auto agree = [&](const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
      BOOST_TEST_REQUIRE(got.size() == want.size());
      double largest = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        BOOST_TEST(std::fabs(got[i] - want[i]) <= 2e-5 * std::max(1.0, std::fabs(want[i])), arch << " " << what << " at " << i);
        largest = std::max(largest, std::fabs(want[i]));
      }
      BOOST_TEST(largest > 5e-4, arch << " " << what);  // the comparison means something
    };
    const std::vector<std::pair<std::string, std::vector<std::string>>> sweeps = {
        {"hook_resid_pre", {"layer", "pos"}}, {"hook_z", {"layer", "head"}},       {"hook_z", {"layer", "head", "pos"}},
        {"hook_k", {"layer", "head", "pos"}}, {"hook_v", {"layer", "pos"}},        {"hook_q_input", {"layer", "head", "pos"}},
        {"hook_resid_mid", {"layer", "pos"}}, {"hook_mlp_out", {"layer", "pos"}},  {"attn.hook_pattern", {"layer", "head", "pos"}}};
    for (const auto& [hook, axes] : sweeps) {
      const PatchGrid g = generic_activation_patch(m, in, hook, axes);
      BOOST_TEST(g.clean_metric == mc);
      agree(g.values, whole_runs(hook, axes).values, hook);
    }
    std::vector<double> z, resid;
    for (int l = 0; l < 3; ++l) {
      z.insert(z.end(), r.z_exact[l].begin(), r.z_exact[l].end());
      resid.insert(resid.end(), r.resid_exact[l].begin(), r.resid_exact[l].end());
    }
    agree(z, whole_runs("hook_z", {"layer", "head"}).values, "activation_patching hook_z");
    agree(resid, whole_runs("hook_resid_pre", {"layer", "pos"}).values, "activation_patching hook_resid_pre");
  }
}

BOOST_AUTO_TEST_CASE(stacked_patched_runs_equal_the_runs_one_at_a_time) {
  // windowed runs of one start block go as the rows of one forward_from (the default here stacks
  // every run of a layer: the windows are a few tokens); at most 1 (each alone) and 2 (stacks cut
  // mid-layer, the odd run alone) give every sweep's values to float32 rounding: a copy's rows see
  // the same keys/values and weights, only the products' row counts (and so, under some OpenBLAS
  // kernels, their summation order) differ; relative 2e-5, as against whole runs above
  struct PatchStack {  // HEADLAB_TEST_PATCH_STACK for one scope
    explicit PatchStack(const char* n) { setenv("HEADLAB_TEST_PATCH_STACK", n, 1); }
    ~PatchStack() { unsetenv("HEADLAB_TEST_PATCH_STACK"); }
  };
  const PatchingInputs in = window_inputs();
  const std::vector<std::pair<std::string, std::vector<std::string>>> sweeps = {
      {"hook_resid_pre", {"layer", "pos"}}, {"hook_z", {"layer", "head"}}, {"hook_z", {"layer", "head", "pos"}},
      {"hook_v", {"layer", "pos"}},         {"hook_mlp_out", {"layer", "pos"}}};
  for (const auto& [arch, cfg] : window_models()) {
    TransformerLM m(cfg, 23);
    auto values = [&] {
      std::vector<std::vector<double>> v;
      const PatchingResult r = activation_patching(m, in);
      for (int l = 0; l < 3; ++l) v.push_back(r.z_exact[l]), v.push_back(r.resid_exact[l]);
      for (const auto& [hook, axes] : sweeps) v.push_back(generic_activation_patch(m, in, hook, axes).values);
      return v;
    };
    const std::vector<std::vector<double>> stacked = values();
    for (const char* most : {"1", "2"}) {
      const PatchStack limit(most);
      const std::vector<std::vector<double>> alone = values();
      BOOST_TEST_REQUIRE(alone.size() == stacked.size());
      double largest = 0;
      for (size_t s = 0; s < alone.size(); ++s)
        for (size_t i = 0; i < alone[s].size(); ++i) {
          BOOST_TEST(std::fabs(stacked[s][i] - alone[s][i]) <= 2e-5 * std::max(1.0, std::fabs(alone[s][i])),
                     arch << " at most " << most << ": sweep " << s << " value " << i);
          largest = std::max(largest, std::fabs(alone[s][i]));
        }
      BOOST_TEST(largest > 5e-4, arch);  // the comparison means something
    }
  }
}
