// The block options (docs/architectures.md): RMSNorm (both forms), sandwich norms, gated MLPs,
// ReLU², parallel blocks, embedding scale, final soft-cap. For each combination: a gradcheck of
// every parameter, parameter names and shapes, an exact checkpoint round trip, the hook points
// made = declared, the forward against a block written out from the published definitions, and
// patching a residual hook at every position with the clean activation restoring the clean run.
#define BOOST_TEST_MODULE blocks
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>

#include "analysis/decompose.h"
#include "analysis/edges.h"
#include "analysis/patching.h"
#include "lib/gradcheck.h"
#include "models/checkpoint.h"
#include "models/hf_gpt2.h"
#include "models/transformer.h"
#include "tests/fixtures.h"
#include "train/settings.h"

using namespace hl;
using namespace hl::test;
namespace tt = boost::test_tools;

namespace {

struct Variant {
  const char* what;
  NormKind normalization = NormKind::LayerNorm;
  bool sandwich = false;
  Mlp mlp = Mlp::Plain;
  Activation act = Activation::GeluTanh;
  bool parallel = false;
  bool embed_scale = false;
  float softcap = 0.f;
  int64_t d_ff = 12;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"rmsnorm", NormKind::RMSNorm},
      {"rmsnorm_1p sandwich", NormKind::RMSNorm1p, true},
      {"layernorm sandwich geglu erf", NormKind::LayerNorm, true, Mlp::GeGLU, Activation::GeluErf},
      {"swiglu", NormKind::LayerNorm, false, Mlp::SwiGLU},
      {"relu2", NormKind::LayerNorm, false, Mlp::Plain, Activation::Relu2},
      {"parallel", NormKind::LayerNorm, false, Mlp::Plain, Activation::GeluTanh, true},
      {"parallel rmsnorm swiglu", NormKind::RMSNorm, false, Mlp::SwiGLU, Activation::GeluTanh, true},
      {"embed scale, soft-cap 2", NormKind::LayerNorm, false, Mlp::Plain, Activation::GeluTanh, false, true, 2.f},
      {"gemma2-like", NormKind::RMSNorm1p, true, Mlp::GeGLU, Activation::GeluTanh, false, true, 3.f},
      {"parallel sandwich attention-only", NormKind::RMSNorm, true, Mlp::Plain, Activation::GeluTanh, true, false, 0.f, 0},
  };
  return v;
}

ModelConfig config(const Variant& v) {
  ModelConfig c = test_model({.d_ff = v.d_ff});
  c.normalization = v.normalization;
  c.sandwich_norm = v.sandwich;
  c.mlp = v.mlp;
  c.activation = v.act;
  c.parallel_block = v.parallel;
  c.embed_scale = v.embed_scale;
  c.final_softcap = v.softcap;
  c.head_bias = true;
  return c;
}

// Every parameter drawn again (norm gains near 1 but not 1, so a gain left out shows).
std::unique_ptr<TransformerLM> random_model(const ModelConfig& c, uint64_t seed, float scale = 0.4f) {
  auto m = std::make_unique<TransformerLM>(c, seed);
  Rng r(seed);
  for (auto& [name, p] : m->named_parameters()) {
    init_normal(p, r, scale);
    const bool gain = name.find("ln") != std::string::npos && name.find("weight") != std::string::npos;
    if (gain && c.normalization != NormKind::RMSNorm1p)  // 1 + w is the 1p form's own gain
      for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] += 1.f;
  }
  return m;
}

Ids ids_2x5() { return Ids(Shape{2, 5}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2}); }

// The published definitions, in float64 from the module's weights: LayerNorm
// (x - mean) / sqrt(var + eps) * w + b; RMSNorm x / sqrt(mean(x^2) + eps) * w (Gemma: * (1 + w)).
std::vector<double> norm_ref(const std::vector<double>& x, const LayerNorm& ln, NormKind kind) {
  const size_t D = static_cast<size_t>(ln.weight.numel());
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / D; ++r) {
    double mu = 0, ms = 0;
    if (kind == NormKind::LayerNorm)
      for (size_t d = 0; d < D; ++d) mu += x[r * D + d] / static_cast<double>(D);
    for (size_t d = 0; d < D; ++d) ms += (x[r * D + d] - mu) * (x[r * D + d] - mu) / static_cast<double>(D);
    const double s = std::sqrt(ms + ln.eps);
    for (size_t d = 0; d < D; ++d) {
      const double w = ln.weight.data()[d] + (kind == NormKind::RMSNorm1p ? 1.0 : 0.0);
      y[r * D + d] = (x[r * D + d] - mu) / s * w + (kind == NormKind::LayerNorm ? ln.bias.data()[d] : 0.0);
    }
  }
  return y;
}

std::vector<double> to_double(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return std::vector<double>(f.begin(), f.end());
}
std::vector<double> add(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}
std::vector<double> linear_ref(const std::vector<double>& x, const Linear& l) {
  const int64_t out = l.weight.size(0), in = l.weight.size(1), N = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(static_cast<size_t>(N * out));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = l.bias.defined() ? l.bias.data()[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * l.weight.data()[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}
double act_ref(Activation a, double v) {
  switch (a) {
    case Activation::GeluTanh: return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case Activation::GeluErf: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Activation::Relu: return v > 0 ? v : 0;
    case Activation::Relu2: return v > 0 ? v * v : 0;
    case Activation::Silu: return v / (1 + std::exp(-v));
  }
  return v;
}
// Plain: fc2(act(fc1 x)); gated: fc2(act(gate x) * fc1 x) with silu (SwiGLU) or the gelu (GeGLU).
std::vector<double> mlp_ref(const std::vector<double>& x, const FeedForward& f, const ModelConfig& c) {
  std::vector<double> h = linear_ref(x, f.fc1);
  if (c.mlp == Mlp::Plain) {
    for (double& v : h) v = act_ref(c.activation, v);
  } else {
    const std::vector<double> g = linear_ref(x, *f.gate);
    const Activation a = c.mlp == Mlp::SwiGLU ? Activation::Silu : c.activation;
    for (size_t i = 0; i < h.size(); ++i) h[i] *= act_ref(a, g[i]);
  }
  return linear_ref(h, f.fc2);
}

}  // namespace

BOOST_AUTO_TEST_CASE(lm_gradcheck_every_parameter_of_every_block_option) {
  for (const Variant& v : variants()) {
    ModelConfig c = config(v);
    c.n_layers = 1;
    if (v.act == Activation::Relu2) continue;  // its kink at 0: gradchecked as an op (test_gradcheck)
    auto m = random_model(c, 3, 0.3f);
    const Ids ids = ids_2x5();
    GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) { return m->forward(ids); }, m->parameters());
    BOOST_TEST_CONTEXT(v.what) {
      BOOST_TEST(res.ok, res.message);
      BOOST_TEST(res.checked == m->num_parameters());
    }
  }
}

BOOST_AUTO_TEST_CASE(parameter_names_shapes_and_checkpoint_round_trip) {
  for (const Variant& v : variants()) {
    BOOST_TEST_CONTEXT(v.what) {
      const ModelConfig c = config(v);
      auto m = random_model(c, 5);
      const auto expected = parameter_shapes(c);
      const auto params = m->named_parameters();
      BOOST_TEST_REQUIRE(expected.size() == params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        BOOST_TEST(expected[i].first == params[i].first);
        BOOST_TEST(expected[i].second == params[i].second.shape());
      }
      auto has = [&](const std::string& n) {
        return std::any_of(params.begin(), params.end(), [&](auto& p) { return p.first == n; });
      };
      BOOST_TEST(has("blocks.0.ln1.bias") == (v.normalization == NormKind::LayerNorm));
      BOOST_TEST(has("blocks.1.ln1_post.weight") == v.sandwich);
      BOOST_TEST(has("blocks.1.ln2_post.weight") == (v.sandwich && v.d_ff > 0));
      BOOST_TEST(has("blocks.0.ffn.gate.weight") == (v.mlp != Mlp::Plain && v.d_ff > 0));
      const std::string path = temp_path("blocks_roundtrip.safetensors");
      save_checkpoint(path, *m);
      auto loaded = load_model(path);
      std::filesystem::remove(path);
      BOOST_TEST(loaded->cfg.to_json() == c.to_json());
      NoGradGuard ng;
      BOOST_TEST(m->forward(ids_2x5()).to_vector() == loaded->forward(ids_2x5()).to_vector(), tt::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(hook_points_made_are_the_declared_ones) {
  for (const Variant& v : variants()) {
    const ModelConfig c = config(v);
    auto m = random_model(c, 6);
    NoGradGuard ng;
    auto [logits, cache] = m->run_with_cache(ids_2x5(), all_names());
    std::vector<std::string> made = cache.names(), declared;
    for (auto& [name, shape] : hook_points(c)) declared.push_back(name);
    std::sort(made.begin(), made.end());
    std::sort(declared.begin(), declared.end());
    BOOST_TEST_CONTEXT(v.what) {
      BOOST_TEST(made == declared, tt::per_element());
      BOOST_TEST(cache.has("blocks.0.hook_resid_mid") == (!v.parallel && v.d_ff > 0));
      BOOST_TEST(cache.has("blocks.0.ln1_post.hook_scale") == v.sandwich);
      BOOST_TEST(cache.has("blocks.0.mlp.hook_pre_linear") == (v.mlp != Mlp::Plain && v.d_ff > 0));
      // a hooked forward is the unhooked one, bit for bit
      BOOST_TEST(logits.to_vector() == m->forward(ids_2x5()).to_vector(), tt::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(forward_equals_the_published_definitions) {
  // Each block rebuilt in float64 from the modules' weights, taking attention's output from the
  // forward's own hook (attention is tested on its own): the wiring of norms, sandwich norms,
  // parallel branches, MLP, embedding scale and soft-cap is what is checked.
  for (const Variant& v : variants()) {
    const ModelConfig c = config(v);
    auto m = random_model(c, 7);
    NoGradGuard ng;
    auto [logits, cache] = m->run_with_cache(ids_2x5(), all_names());
    const Ids ids = ids_2x5();
    std::vector<double> x(static_cast<size_t>(10 * c.d_model));
    const double emb_scale = v.embed_scale ? static_cast<double>(std::sqrt(static_cast<float>(c.d_model))) : 1.0;
    for (int64_t r = 0; r < 10; ++r)
      for (int64_t d = 0; d < c.d_model; ++d)
        x[r * c.d_model + d] = m->tok_emb.weight.data()[ids.data[r] * c.d_model + d] * emb_scale +
                               m->pos_emb->weight.data()[(r % 5) * c.d_model + d];
    double worst = 0, mag = 0;
    auto compare = [&](const std::vector<double>& want, const Tensor& got) {
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(want[i] - got.data()[i]));
        mag = std::max(mag, std::fabs(want[i]));
      }
    };
    for (int l = 0; l < c.n_layers; ++l) {
      const TransformerBlock& b = *m->blocks[l];
      const std::string p = "blocks." + std::to_string(l) + ".";
      compare(norm_ref(x, b.ln1, v.normalization), cache[p + "ln1.hook_normalized"]);
      // attention's output as the forward made it (W_O applied), before any sandwich norm
      std::vector<double> a = to_double(cache[p + "attn.hook_result"]);  // (B, T, H, D): sum over heads
      std::vector<double> attn(x.size(), 0.0);
      for (size_t r = 0; r < 10; ++r)
        for (int h = 0; h < c.n_heads; ++h)
          for (int64_t d = 0; d < c.d_model; ++d) attn[r * c.d_model + d] += a[(r * c.n_heads + h) * c.d_model + d];
      if (b.attn.W_O.bias.defined())
        for (size_t r = 0; r < 10; ++r)
          for (int64_t d = 0; d < c.d_model; ++d) attn[r * c.d_model + d] += b.attn.W_O.bias.data()[d];
      if (v.sandwich) attn = norm_ref(attn, *b.ln1_post, v.normalization);
      compare(attn, cache[p + "hook_attn_out"]);
      std::vector<double> out = add(x, attn);
      if (b.ffn) {
        const std::vector<double>& read = v.parallel ? x : out;  // a parallel MLP reads the block's input
        std::vector<double> mlp = mlp_ref(norm_ref(read, *b.ln2, v.normalization), *b.ffn, c);
        if (v.sandwich) mlp = norm_ref(mlp, *b.ln2_post, v.normalization);
        compare(mlp, cache[p + "hook_mlp_out"]);
        out = add(out, mlp);
      }
      compare(out, cache[p + "hook_resid_post"]);
      x = to_double(cache[p + "hook_resid_post"]);  // the next block from the forward's own input
    }
    std::vector<double> z = linear_ref(norm_ref(x, *m->ln_f, v.normalization), m->head);
    if (v.softcap > 0)
      for (double& t : z) t = v.softcap * std::tanh(t / v.softcap);
    compare(z, logits);
    // float32 against float64 through a few layers of d_model 8: 1e-5 of the largest value
    BOOST_TEST_CONTEXT(v.what) { BOOST_TEST(worst <= 1e-5 * (1 + mag)); }
  }
}

BOOST_AUTO_TEST_CASE(patching_a_residual_hook_with_the_clean_activation_restores_the_clean_run) {
  const Ids clean = ids_2x5(), corrupted(Shape{2, 5}, {2, 3, 0, 2, 6, 5, 4, 1, 1, 2});
  for (const Variant& v : variants()) {
    const ModelConfig c = config(v);
    auto m = random_model(c, 8);
    Tensor clean_logits, corrupted_logits;
    {
      NoGradGuard ng;
      clean_logits = m->forward(clean);
      corrupted_logits = m->forward(corrupted);
    }
    // the largest |patched - clean| logit
    const PatchMetric distance = [&](const Tensor& logits, const std::vector<int64_t>&) {
      double d = 0;
      for (int64_t i = 0; i < logits.numel(); ++i) d = std::max(d, std::fabs(double(logits.data()[i]) - clean_logits.data()[i]));
      return d;
    };
    BOOST_TEST(distance(corrupted_logits, {}) > 0.01);  // the corruption changes the logits: the test can fail
    std::vector<std::string> hooks = {"hook_resid_pre", "hook_resid_post"};
    if (!v.parallel && v.d_ff > 0) hooks.push_back("hook_resid_mid");
    for (const std::string& hook : hooks) {
      const PatchGrid g = generic_activation_patch(*m, clean, corrupted, hook, {"layer"}, distance);
      BOOST_TEST_CONTEXT(v.what << " " << hook) {
        BOOST_TEST(g.values == std::vector<double>(static_cast<size_t>(c.n_layers), 0.0), tt::per_element());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(soft_cap_and_embedding_scale_limits) {
  ModelConfig c = config({"plain"});
  auto m = random_model(c, 9);
  ModelConfig capped = c;
  capped.final_softcap = 1e30f;  // a cap far above every logit: tanh(s / cap) cap == s within round-off
  TransformerLM mc(capped, 9);
  for (auto& [name, p] : mc.named_parameters()) p.copy_from(m->parameter(name));
  NoGradGuard ng;
  const Tensor a = m->forward(ids_2x5()), b = mc.forward(ids_2x5());
  for (int64_t i = 0; i < a.numel(); ++i) BOOST_TEST(b.data()[i] == a.data()[i], tt::tolerance(1e-6f));
  // a small cap bounds every logit
  capped.final_softcap = 0.5f;
  TransformerLM small(capped, 9);
  for (float z : small.forward(ids_2x5()).to_vector()) BOOST_TEST(std::fabs(z) <= 0.5f);
  // embed_scale: hook_embed is the token embedding times sqrt(d_model)
  ModelConfig scaled = c;
  scaled.embed_scale = true;
  TransformerLM ms(scaled, 9);
  auto [logits, cache] = ms.run_with_cache(ids_2x5(), all_names());
  const float k = std::sqrt(8.f);
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t d = 0; d < 8; ++d)
      BOOST_TEST(cache["hook_embed"].data()[r * 8 + d] == ms.tok_emb.weight.data()[ids_2x5().data[r] * 8 + d] * k);
}

BOOST_AUTO_TEST_CASE(bad_block_options_get_one_message_naming_the_option) {
  auto refused = [](ModelConfig c, const std::string& message) {
    BOOST_CHECK_EXCEPTION(c.validate(), Error, [&](const Error& e) {
      BOOST_TEST(std::string(e.what()) == message);
      return true;
    });
  };
  ModelConfig c = test_model();
  c.final_softcap = -1.f;
  refused(c, "model config: final_softcap must be a positive cap, or 0 for none, got -1");
  c = test_model({.norm = Norm::Post});
  c.parallel_block = true;
  refused(c, "model config: parallel_block needs norm pre (a post-norm block has no such form)");
  c.parallel_block = false;
  c.sandwich_norm = true;
  refused(c, "model config: sandwich_norm needs norm pre (a post-norm block has no such form)");
  c = test_model();
  c.mlp = Mlp::GeGLU;
  c.activation = Activation::Relu;
  refused(c, "model config: mlp geglu takes activation gelu_tanh or gelu_erf (its gate's gelu), got relu");
  BOOST_CHECK_EXCEPTION(ModelConfig::from_json(R"({"vocab_size":7,"d_model":8,"n_layers":1,"n_heads":2,"d_ff":4,
    "max_seq_len":6,"normalization":"batchnorm"})", "m.json"), Error, [](const Error& e) {
    return std::string(e.what()) == "m.json: config: unknown normalization 'batchnorm' (expected layernorm, rmsnorm or rmsnorm_1p)";
  });
}

BOOST_AUTO_TEST_CASE(a_config_without_block_options_is_the_gpt2_style_block) {
  const ModelConfig c = ModelConfig::from_json(
      R"({"vocab_size":7,"d_model":8,"n_layers":1,"n_heads":2,"d_ff":4,"max_seq_len":6})", "old.json");
  BOOST_TEST(to_string(c.normalization) == "layernorm");
  BOOST_TEST(!c.sandwich_norm);
  BOOST_TEST(to_string(c.mlp) == "plain");
  BOOST_TEST(!c.parallel_block);
  BOOST_TEST(!c.embed_scale);
  BOOST_TEST(c.final_softcap == 0.f);
  BOOST_TEST(c.arch.empty());
}

BOOST_AUTO_TEST_CASE(arch_presets_set_defaults_that_explicit_flags_override) {
  auto resolve = [](const std::string& arch, std::vector<std::string> given_flags, auto set) {
    TrainFlagValues v;
    v.args.model.arch = arch;
    v.args.task.name = "induction";
    set(v);
    return resolve_train_flags(v, [given_flags](const std::string& f) {
      return f == "--arch" || std::find(given_flags.begin(), given_flags.end(), f) != given_flags.end();
    }, true);
  };
  const TrainArgs llama = resolve("llama", {}, [](TrainFlagValues&) {});
  BOOST_TEST(to_string(llama.model.normalization) == "rmsnorm");
  BOOST_TEST(to_string(llama.model.mlp) == "swiglu");
  BOOST_TEST(!llama.model.mlp_bias);
  BOOST_TEST(!llama.model.attn_bias);
  BOOST_TEST(llama.model.n_layers == 2);  // induction's training defaults still apply
  BOOST_TEST(llama.model.arch == "llama");
  // an explicit flag wins over the preset
  const TrainArgs plain = resolve("llama", {"--mlp"}, [](TrainFlagValues& v) { v.mlp = "plain"; });
  BOOST_TEST(to_string(plain.model.mlp) == "plain");
  BOOST_TEST(to_string(plain.model.normalization) == "rmsnorm");
  const TrainArgs gemma = resolve("gemma2", {}, [](TrainFlagValues&) {});
  BOOST_TEST(gemma.model.sandwich_norm);
  BOOST_TEST(gemma.model.embed_scale);
  BOOST_TEST(gemma.model.final_softcap == 30.f);
  BOOST_TEST(to_string(gemma.model.normalization) == "rmsnorm_1p");
  const TrainArgs gpt2 = resolve("gpt2", {}, [](TrainFlagValues&) {});
  ModelConfig same = gpt2.model;  // gpt2 is today's defaults: only the recorded name differs
  same.arch = "";
  BOOST_TEST(same.to_json() == resolve("", {}, [](TrainFlagValues&) {}).model.to_json());
  // resuming a run with another preset is refused naming the flag
  BOOST_CHECK_EXCEPTION(resume_with_flags(gpt2, llama, [](const std::string& f) { return f == "--arch"; }, "run/checkpoint.safetensors"),
                        Error, [](const Error& e) {
                          return std::string(e.what()) ==
                                 "--arch \"llama\" does not match the run being resumed (\"gpt2\" in run/checkpoint.safetensors)";
                        });
}

BOOST_AUTO_TEST_CASE(dla_with_a_final_soft_cap_attributes_the_logit_before_the_cap) {
  // components + the bias term sum to the logit before the cap: the same model without the cap
  ModelConfig c = config({"gemma2-like", NormKind::RMSNorm1p, true, Mlp::GeGLU, Activation::GeluTanh, false, true, 0.5f});
  auto m = random_model(c, 10);
  ModelConfig uncapped = c;
  uncapped.final_softcap = 0.f;
  TransformerLM u(uncapped, 10);
  for (auto& [name, p] : u.named_parameters()) p.copy_from(m->parameter(name));
  Batch batch;
  batch.inputs = ids_2x5();
  batch.targets = Ids(Shape{2, 5}, {3, -1, 2, 6, 0, -1, 1, 1, 2, 4});
  const DlaResult r = direct_logit_attribution(*m, {batch});
  NoGradGuard ng;
  const Tensor want = u.forward(batch.inputs);  // (2, 5, 7)
  for (int64_t b = 0; b < 2; ++b) {
    double logit = 0, sum = r.bias_per_row[b];
    int n = 0;
    for (int64_t t = 0; t < 5; ++t)
      if (const int32_t y = batch.targets.at(b, t); y >= 0) logit += want.data()[(b * 5 + t) * 7 + y], ++n;
    logit /= n;
    for (const auto& comp : r.per_row) sum += comp[b];
    BOOST_TEST(std::fabs(r.logit_per_row[b] - logit) <= 1e-5 * (1 + std::fabs(logit)));
    BOOST_TEST(std::fabs(sum - logit) <= 1e-5 * (1 + std::fabs(logit)));
    BOOST_TEST(std::fabs(logit) > 0.5);  // beyond the cap: the capped logit would differ
  }
}

BOOST_AUTO_TEST_CASE(each_preset_keeps_the_dla_and_decomposition_identities_and_clean_patching_restores_the_run) {
  // tiny models of each --arch preset (d_head 8: neox's quarter turns 2 dims; gemma2's window of 3
  // hides keys, its final cap 2 bends the logits); exact edges of each preset: tests/test_edges.cpp
  const Ids clean = ids_2x5(), corrupted(Shape{2, 5}, {2, 3, 0, 2, 6, 5, 4, 1, 1, 2});
  for (const std::string arch : {"gpt2", "llama", "neox", "gemma2"}) {
    BOOST_TEST_CONTEXT(arch) {
      ModelConfig c = preset_model(arch, test_model({.d_model = 16, .d_ff = 12}));
      if (arch == "gemma2") c.sliding_window = 3, c.final_softcap = 2.f;
      auto m = random_model(c, 12);
      NoGradGuard ng;
      // decomposition: the components sum to the residual stream entering every layer
      auto [logits, cache] = m->run_with_cache(clean, decomposition_hooks());
      for (int layer = 0; layer <= c.n_layers; ++layer) {
        const ResidStack st = decompose_resid(*m, cache, layer);
        const Tensor& resid = layer < c.n_layers ? cache["blocks." + std::to_string(layer) + ".hook_resid_pre"]
                                                 : cache["blocks." + std::to_string(c.n_layers - 1) + ".hook_resid_post"];
        const int64_t N = resid.numel();
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < N; ++i) {
          double sum = 0, mag = 0;
          for (int64_t k = 0; k < st.components(); ++k) sum += st.values[k * N + i], mag += std::fabs(st.values[k * N + i]);
          worst = std::max(worst, std::fabs(sum - resid.data()[i]));
          scale = std::max(scale, mag);
        }
        BOOST_TEST(worst <= 1e-5 * (1 + scale), "layer " << layer << ": components miss the residual by " << worst);
      }
      // DLA: the components plus the bias term sum to the logit (before a final cap: the same
      // model without it)
      ModelConfig uncapped = c;
      uncapped.final_softcap = 0.f;
      TransformerLM u(uncapped, 12);
      for (auto& [name, p] : u.named_parameters()) p.copy_from(m->parameter(name));
      Batch batch;
      batch.inputs = clean;
      batch.targets = Ids(Shape{2, 5}, {3, -1, 2, 6, 0, -1, 1, 1, 2, 4});
      const DlaResult r = direct_logit_attribution(*m, {batch});
      const Tensor want = u.forward(batch.inputs);  // (2, 5, 7)
      for (int64_t b = 0; b < 2; ++b) {
        double logit = 0, sum = r.bias_per_row[b];
        int n = 0;
        for (int64_t t = 0; t < 5; ++t)
          if (const int32_t y = batch.targets.at(b, t); y >= 0) logit += want.data()[(b * 5 + t) * 7 + y], ++n;
        logit /= n;
        for (const auto& comp : r.per_row) sum += comp[b];
        BOOST_TEST(std::fabs(r.logit_per_row[b] - logit) <= 1e-5 * (1 + std::fabs(logit)));
        BOOST_TEST(std::fabs(sum - logit) <= 1e-5 * (1 + std::fabs(logit)));
      }
      // patching every position of a residual hook with the clean activation restores the clean run
      const Tensor clean_logits = m->forward(clean), corrupted_logits = m->forward(corrupted);
      const PatchMetric distance = [&](const Tensor& l, const std::vector<int64_t>&) {
        double d = 0;
        for (int64_t i = 0; i < l.numel(); ++i) d = std::max(d, std::fabs(double(l.data()[i]) - clean_logits.data()[i]));
        return d;
      };
      BOOST_TEST(distance(corrupted_logits, {}) > 0.01);  // the corruption changes the logits: the test can fail
      std::vector<std::string> hooks = {"hook_resid_pre", "hook_resid_post"};
      if (!c.parallel_block) hooks.push_back("hook_resid_mid");
      for (const std::string& hook : hooks) {
        const PatchGrid g = generic_activation_patch(*m, clean, corrupted, hook, {"layer"}, distance);
        BOOST_TEST(g.values == std::vector<double>(static_cast<size_t>(c.n_layers), 0.0), tt::per_element());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(rms_hook_scale_is_the_divisor_and_a_replaced_one_is_used) {
  for (NormKind kind : {NormKind::RMSNorm, NormKind::RMSNorm1p}) {
    ModelConfig c = config({"rms"});
    c.normalization = kind;
    c.sandwich_norm = true;
    auto m = random_model(c, 11);
    NoGradGuard ng;
    auto [logits, cache] = m->run_with_cache(ids_2x5(), all_names());
    // hook_scale is sqrt(mean(x^2) + eps) of the norm's input
    const Tensor &s = cache["blocks.0.ln1.hook_scale"], &x = cache["blocks.0.hook_resid_pre"];
    for (int64_t r = 0; r < 10; ++r) {
      double ms = 0;
      for (int64_t d = 0; d < 8; ++d) ms += std::pow(double(x.data()[r * 8 + d]), 2) / 8;
      BOOST_TEST(std::fabs(s.data()[r] - std::sqrt(ms + 1e-5)) <= 1e-6 * std::sqrt(ms + 1e-5));
    }
    // twice the scale halves the normalized output, x / (2 s) * gain (TransformerLens's use)
    Hooks h;
    h.add_forward("blocks.1.ln1_post.hook_scale", [](const Tensor& t, const std::string&) { return mul_scalar(t, 2.f); });
    ActivationCache doubled;
    h.cache(doubled, all_names());
    ForwardOptions opt;
    opt.hooks = &h;
    m->forward(ids_2x5(), opt);
    const Tensor &y = cache["blocks.1.ln1_post.hook_normalized"], &y2 = doubled["blocks.1.ln1_post.hook_normalized"];
    for (int64_t i = 0; i < y.numel(); ++i) BOOST_TEST(std::fabs(y2.data()[i] - 0.5f * y.data()[i]) <= 1e-6 * (1 + std::fabs(y.data()[i])));
  }
}

BOOST_AUTO_TEST_CASE(gpt2_export_refuses_every_block_option_naming_it) {
  // a GPT-2 directory of such a model would load elsewhere and compute something else
  const std::string tail = "; GPT-2's layout cannot express it";
  auto refused = [&](auto set, const std::string& why) {
    ModelConfig c = test_model({.attn_bias = true});
    set(c);
    TransformerLM m(c, 1);
    BOOST_CHECK_EXCEPTION(check_hf_gpt2_exportable(m), Error, [&](const Error& e) {
      BOOST_TEST(std::string(e.what()) == "export --format hf-gpt2: " + why + tail);
      return true;
    });
  };
  refused([](ModelConfig& c) { c.activation = Activation::Relu2; }, "the model's activation is relu2, GPT-2's are gelu and relu");
  refused([](ModelConfig& c) { c.normalization = NormKind::RMSNorm; }, "the model's normalization is rmsnorm, GPT-2's is layernorm");
  refused([](ModelConfig& c) { c.sandwich_norm = true; }, "the model has sandwich norms (sandwich_norm)");
  refused([](ModelConfig& c) { c.mlp = Mlp::SwiGLU; c.activation = Activation::GeluTanh; }, "the model's MLP is gated (mlp \"swiglu\")");
  refused([](ModelConfig& c) { c.parallel_block = true; }, "the model has parallel blocks (parallel_block)");
  refused([](ModelConfig& c) { c.embed_scale = true; }, "the model scales its embeddings (embed_scale)");
  refused([](ModelConfig& c) { c.final_softcap = 30.f; }, "the model soft-caps its logits (final_softcap)");
  BOOST_CHECK_NO_THROW(check_hf_gpt2_exportable(TransformerLM(test_model({.attn_bias = true}), 1)));
}

BOOST_AUTO_TEST_CASE(kv_cache_decoding_and_live_positions_equal_the_full_forward) {
  // the two other forwards (a token at a time with a KV cache; only the live positions, as
  // training on the copy tasks runs) give the full forward's logits for every block option
  for (const Variant& v : variants()) {
    auto m = random_model(config(v), 12);
    NoGradGuard ng;
    const Ids ids = ids_2x5();
    const Tensor full = m->forward(ids);  // (2, 5, 7)
    std::vector<KVCacheLayer> cache;
    ForwardOptions opt;
    opt.kv_cache = &cache;
    double worst = 0;
    for (int t = 0; t < 5; ++t) {
      const Tensor step = m->forward(Ids(Shape{2, 1}, {ids.at(0, t), ids.at(1, t)}), opt);  // (2, 1, 7)
      for (int b = 0; b < 2; ++b)
        for (int k = 0; k < 7; ++k) worst = std::max(worst, double(std::fabs(step.at({b, 0, k}) - full.at({b, t, k}))));
    }
    const std::vector<int32_t> live = {3, 5};
    ForwardOptions lopt;
    lopt.live_len = live;
    const Tensor packed = m->forward(ids, lopt);  // (8, 7): row 0's 3 positions, then row 1's 5
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t b = i < 3 ? 0 : 1, t = i < 3 ? i : i - 3;
      for (int k = 0; k < 7; ++k) worst = std::max(worst, double(std::fabs(packed.at({i, k}) - full.at({b, t, k}))));
    }
    BOOST_TEST_CONTEXT(v.what) { BOOST_TEST(worst <= 1e-5); }  // float32 round-off of other summation orders
  }
}

BOOST_AUTO_TEST_CASE(the_fused_gated_activation_equals_the_unfused_ops_forward_and_backward) {
  // gated_act(g, u) = act(g) * u in one pass and both gradients in one backward: the same values
  // as the activation op then mul, within float32 rounding, for every activation, on element
  // counts that leave a vector remainder (37 * 3) and that split over threads (4099)
  for (const int64_t n : {int64_t(111), int64_t(4099)})
    for (const Activation a : {Activation::Silu, Activation::GeluTanh, Activation::GeluErf, Activation::Relu, Activation::Relu2}) {
      BOOST_TEST_CONTEXT(to_string(a) << " n " << n) {
        Rng r(7);
        auto rnd = [&](bool grad) {
          Tensor t = Tensor::empty({n});
          for (int64_t i = 0; i < n; ++i) t.data()[i] = 3.f * r.normal();
          if (grad) t.requires_grad_(true);
          return t;
        };
        const Tensor g1 = rnd(true), u1 = rnd(true), w = rnd(false);  // w: a random upstream gradient
        const Tensor g2 = g1.detach().clone().requires_grad_(true), u2 = u1.detach().clone().requires_grad_(true);
        const Tensor fused = gated_act(g1, u1, a);
        const Tensor act = a == Activation::Silu       ? silu(g2)
                           : a == Activation::GeluTanh ? gelu_tanh(g2)
                           : a == Activation::GeluErf  ? gelu_erf(g2)
                           : a == Activation::Relu     ? relu(g2)
                                                       : relu2(g2);
        const Tensor unfused = mul(act, u2);
        sum(mul(fused, w)).backward();
        sum(mul(unfused, w)).backward();
        auto worst = [&](const Tensor& x, const Tensor& y) {
          double d = 0;
          for (int64_t i = 0; i < n; ++i)
            d = std::max(d, std::fabs(double(x.data()[i]) - y.data()[i]) / (1e-6 + std::fabs(double(y.data()[i]))));
          return d;
        };
        BOOST_TEST(worst(fused, unfused) <= 1e-6);
        BOOST_TEST(worst(g1.grad(), g2.grad()) <= 1e-6);
        BOOST_TEST(worst(u1.grad(), u2.grad()) <= 1e-6);
      }
    }
}
