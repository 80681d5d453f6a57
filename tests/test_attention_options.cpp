// The attention options (docs/architectures.md): rotary positions (both pairings), NoPE,
// QK-norm, the score scale and soft-cap, sliding windows. Relative-position shift, pairing
// equivalence, KV-cache decoding, the window in every kernel path, gradchecks, hooks made =
// declared, a checkpoint round trip, presets and refusals.
#define BOOST_TEST_MODULE attention_options
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>

#include <sys/mman.h>
#include <unistd.h>

#include "analysis/edges.h"
#include "lib/gradcheck.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "tests/fixtures.h"
#include "train/settings.h"

using namespace hl;
using namespace hl::test;
namespace tt = boost::test_tools;

namespace {

Rng& rng() {
  static Rng r(91);
  return r;
}

float max_diff(const Tensor& a, const Tensor& b) {
  BOOST_TEST_REQUIRE(a.shape() == b.shape());
  float d = 0.f;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::fabs(a.data()[i] - b.data()[i]));
  return d;
}

AttentionConfig rotary_attention(int64_t d_model, int heads, int kv_heads, bool interleaved = false) {
  AttentionConfig c = test_attention({.d_model = d_model, .heads = heads, .kv_heads = kv_heads});
  c.rotary = true;
  c.rope.d_head = c.head_dim();
  c.rope.interleaved = interleaved;
  c.max_positions = 32;
  return c;
}

// Every attention option on: rotary (partial), QK-norm, a soft-cap, alternating windows, biases.
ModelConfig every_option() {
  ModelConfig c = test_model({.d_model = 16, .layers = 2, .heads = 2, .max_seq_len = 8});
  c.attn_bias = false;
  c.positions = Positions::Rotary;
  c.rotary_dim = 4;
  c.rope_theta = 500.f;
  c.rotary_style = "interleaved";
  c.qk_norm = true;
  c.attn_scale = 0.3f;
  c.attn_softcap = 2.f;
  c.sliding_window = 2;
  c.window_layers = "alternate";
  c.qkv_bias = true;
  c.o_bias = false;
  return c;
}

std::unique_ptr<TransformerLM> random_model(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<TransformerLM>(c, seed);
  Rng r(seed);
  for (auto& [name, p] : m->named_parameters()) {
    init_normal(p, r, 0.4f);
    if (name.find("norm.weight") != std::string::npos || name.find("ln") != std::string::npos)
      if (name.find("weight") != std::string::npos)
        for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] += 1.f;
  }
  return m;
}

Ids ids_2x5() { return Ids(Shape{2, 5}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2}); }

TrainArgs resolve(const std::string& arch, std::vector<std::string> given_flags, const std::function<void(TrainFlagValues&)>& set) {
  TrainFlagValues v;
  v.args.model.arch = arch;
  v.args.task.name = "induction";
  set(v);
  return resolve_train_flags(v, [given_flags](const std::string& f) {
    return f == "--arch" || std::find(given_flags.begin(), given_flags.end(), f) != given_flags.end();
  }, true);
}

}  // namespace

BOOST_AUTO_TEST_CASE(presets_set_the_attention_options) {
  const TrainArgs llama = resolve("llama", {}, [](TrainFlagValues&) {});
  BOOST_TEST(to_string(llama.model.positions) == "rotary");
  llama.model.validate();
  TransformerLM m(llama.model, 1);  // a rotary model: no position embedding, q and k turned
  BOOST_TEST(!m.pos_emb);
  BOOST_TEST(m.blocks[0]->attn.cfg.rotary);
  BOOST_TEST(m.blocks[0]->attn.cfg.rope.rot_dim() == llama.model.head_dim());
  const TrainArgs neox = resolve("neox", {}, [](TrainFlagValues&) {});
  BOOST_TEST(to_string(neox.model.positions) == "rotary");
  BOOST_TEST(neox.model.rotary_pct == 0.25f);
  BOOST_TEST(neox.model.rotary_dims() == neox.model.head_dim() / 4);
  neox.model.validate();
  // an explicit --rotary-dim takes the preset's fraction's place
  const TrainArgs neox8 = resolve("neox", {"--rotary-dim"}, [](TrainFlagValues& v) { v.args.model.rotary_dim = 2; });
  BOOST_TEST(neox8.model.rotary_dims() == 2);
  const TrainArgs gemma = resolve("gemma2", {}, [](TrainFlagValues&) {});
  BOOST_TEST(gemma.model.attn_softcap == 50.f);
  BOOST_TEST(gemma.model.window_of_layer(0) == 4096);
  BOOST_TEST(gemma.model.window_of_layer(1) == 0);
  gemma.model.validate();
  // an explicit --sliding-window 0 takes the preset's window pattern with it
  const TrainArgs global = resolve("gemma2", {"--sliding-window"}, [](TrainFlagValues& v) { v.args.model.sliding_window = 0; });
  BOOST_TEST(global.model.window_layers == "all");
  global.model.validate();
}

BOOST_AUTO_TEST_CASE(rotary_patterns_depend_only_on_relative_position_and_nope_on_none) {
  for (const Positions pos : {Positions::Rotary, Positions::None})
    for (const char* style : {"half", "interleaved"}) {
      ModelConfig c = test_model({.d_model = 16, .layers = 2, .heads = 2, .d_ff = 0, .max_seq_len = 16});
      c.positions = pos;
      c.rotary_style = style;
      auto m = random_model(c, 2);
      const Ids ids = ids_2x5();
      auto patterns = [&](int32_t start) {
        Ids p(ids.shape);
        for (int64_t i = 0; i < p.numel(); ++i) p.data[static_cast<size_t>(i)] = start + static_cast<int32_t>(i % 5);
        std::vector<Tensor> got;
        Hooks hk;
        for (int l = 0; l < 2; ++l)
          hk.add_forward(attn_hook(l, "pattern"), [&got](const Tensor& t, const std::string&) {
            got.push_back(t.detach());
            return t;
          });
        ForwardOptions opt;
        opt.hooks = &hk;
        opt.position_ids = &p;
        NoGradGuard ng;
        m->forward(ids, opt);
        return got;
      };
      const std::vector<Tensor> at0 = patterns(0), at7 = patterns(7);
      BOOST_TEST_CONTEXT(to_string(pos) << " " << style) {
        for (int l = 0; l < 2; ++l) BOOST_TEST(max_diff(at0[l], at7[l]) < 2e-5f);
      }
    }
}

BOOST_AUTO_TEST_CASE(rotate_half_equals_interleaved_under_the_row_permutation_of_wq_wk) {
  for (const int64_t dim : {int64_t{0}, int64_t{4}}) {
    AttentionConfig half = rotary_attention(24, 2, 1), inter = rotary_attention(24, 2, 1, true);
    half.rope.dim = inter.rope.dim = dim;
    Rng r1(3), r2(3);
    MultiHeadAttention a(half, r1), b(inter, r2);
    const int64_t dh = 12, rd = dim ? dim : dh, h2 = rd / 2;
    // interleaved row 2i <- half row i, row 2i+1 <- half row i + rd/2, within each head
    auto permute = [&](const Tensor& from, Tensor& to, int heads) {
      for (int h = 0; h < heads; ++h)
        for (int64_t j = 0; j < dh; ++j) {
          const int64_t src = j >= rd ? j : (j % 2 ? j / 2 + h2 : j / 2);
          for (int64_t col = 0; col < 24; ++col) to.at({h * dh + j, col}) = from.at({h * dh + src, col});
        }
    };
    permute(a.W_Q.weight, b.W_Q.weight, 2);
    permute(a.W_K.weight, b.W_K.weight, 1);
    const Tensor x = Tensor::randn({2, 7, 24}, rng());
    MultiHeadAttention::Call call;
    call.causal = true;
    NoGradGuard ng;
    BOOST_TEST_CONTEXT("rotary_dim " << dim) {
      BOOST_TEST(max_diff(a.forward(x, Tensor(), call), b.forward(x, Tensor(), call)) < 1e-5f);
    }
  }
}

BOOST_AUTO_TEST_CASE(kv_cache_decoding_equals_the_full_forward_with_rotary_and_a_window) {
  for (const int64_t window : {int64_t{0}, int64_t{2}})
    for (const int64_t d_model : {int64_t{8}, int64_t{48}}) {
      AttentionConfig c = rotary_attention(d_model, 4, 2);
      c.window = window;
      Rng r(4);
      MultiHeadAttention mha(c, r);
      const Tensor x = Tensor::randn({2, 6, d_model}, rng());
      NoGradGuard ng;
      MultiHeadAttention::Call full;
      full.causal = true;
      const Tensor all = mha.forward(x, Tensor(), full);
      KVCacheLayer cache;
      MultiHeadAttention::Call inc;
      inc.causal = true;
      inc.kv_cache = &cache;
      std::vector<Tensor> parts = {mha.forward(slice(x, 1, 0, 3), Tensor(), inc)};
      for (int t = 3; t < 6; ++t) parts.push_back(mha.forward(slice(x, 1, t, t + 1), Tensor(), inc));
      BOOST_TEST_CONTEXT("window " << window << " d_model " << d_model) {
        BOOST_TEST(max_diff(concat(parts, 1), all) < 1e-5f);
      }
    }
}

BOOST_AUTO_TEST_CASE(packed_live_positions_with_a_soft_cap_equal_the_full_forward_and_its_gradients) {
  // live_len (training's skip of the positions after a row's last target, the edge passes) takes
  // soft-capped scores through a padded layout: the live rows' logits and the parameters'
  // gradients of a loss on them equal the full forward's
  auto m = random_model(every_option(), 21);
  const Ids ids(Shape{3, 8}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 0, 3, 6, 5, 4, 3, 2, 1, 5, 5, 0, 1, 2, 3});
  const std::vector<int32_t> live = {5, 8, 3};
  Ids rows(Shape{16});
  for (int32_t b = 0, i = 0; b < 3; ++b)
    for (int32_t t = 0; t < live[static_cast<size_t>(b)]; ++t) rows.data[static_cast<size_t>(i++)] = b * 8 + t;
  ForwardOptions lo;
  lo.live_len = live;
  const Tensor packed = m->forward(ids, lo);  // (16, vocab)
  const Tensor V = reshape(m->forward(ids), {24, m->cfg.vocab_size});
  const Tensor full = gather_rows(V, rows);
  BOOST_TEST(max_diff(packed, full) < 1e-5f);
  auto grads = [&](const Tensor& logits) {
    sum(mul(logits, logits), {0, 1}).backward();
    std::vector<float> g;
    for (auto& [name, p] : m->named_parameters()) {
      const std::vector<float> v = p.grad().to_vector();
      g.insert(g.end(), v.begin(), v.end());
    }
    m->zero_grad();
    return g;
  };
  const std::vector<float> gp = grads(m->forward(ids, lo)), gf = grads(gather_rows(reshape(m->forward(ids), {24, m->cfg.vocab_size}), rows));
  BOOST_TEST_REQUIRE(gp.size() == gf.size());
  float worst = 0.f, biggest = 0.f;
  for (size_t i = 0; i < gp.size(); ++i) worst = std::max(worst, std::fabs(gp[i] - gf[i])), biggest = std::max(biggest, std::fabs(gf[i]));
  BOOST_TEST(biggest > 0.1f);
  BOOST_TEST(worst <= 1e-4f * biggest);
}

BOOST_AUTO_TEST_CASE(a_window_of_t_is_global_and_a_window_of_1_sees_itself_in_every_kernel_path) {
  // dh 2: small-head kernels; dh 12: the reference path; T 80: long slices; then packed, varlen
  for (const int64_t dh : {int64_t{2}, int64_t{12}})
    for (const int64_t T : {int64_t{5}, int64_t{40}, int64_t{80}}) {
      const int H = 2;
      const Tensor qkv = Tensor::randn({2, T, 3 * H * dh}, rng());
      const std::vector<Tensor> p = split(qkv, {H * dh, H * dh, H * dh}, 2);
      const Tensor q = p[0], k = p[1], v = p[2];
      auto args = [&](int64_t window) {
        AttentionArgs a;
        a.n_heads = H;
        a.causal = true;
        a.window = window;
        return a;
      };
      const std::vector<int32_t> len = {static_cast<int32_t>(T), static_cast<int32_t>(T)};
      const Tensor flat = reshape(qkv, {2 * T, 3 * H * dh});
      NoGradGuard ng;
      BOOST_TEST_CONTEXT("dh " << dh << " T " << T) {
        const Tensor global = attention(q, k, v, args(0));
        BOOST_TEST(max_diff(attention(q, k, v, args(T)), global) < 1e-6f);
        BOOST_TEST(max_diff(attention_packed(qkv, args(T + 3)), global) < 1e-6f);
        BOOST_TEST(max_diff(reshape(attention_varlen(flat, len, args(T)), global.shape()), global) < 1e-6f);
        // window 1: each query's output is its own value
        BOOST_TEST(max_diff(attention(q, k, v, args(1)), v) < 1e-6f);
        BOOST_TEST(max_diff(attention_packed(qkv, args(1)), v) < 1e-6f);
        BOOST_TEST(max_diff(reshape(attention_varlen(flat, len, args(1)), v.shape()), v) < 1e-6f);
        Tensor pattern;
        attention(q, k, v, args(1), &pattern);
        for (int64_t i = 0; i < T; i += 7) BOOST_TEST(pattern.at({1, 1, i, i}) == 1.f);
      }
    }
}

BOOST_AUTO_TEST_CASE(soft_cap_and_qk_norm_gradchecks_and_a_huge_cap_is_none) {
  struct Case { const char* what; bool qk_norm; float softcap; int64_t window; };
  for (const Case cs : {Case{"soft-cap", false, 0.7f, 0}, Case{"qk-norm", true, 0.f, 0}, Case{"qk-norm soft-cap window", true, 1.5f, 2}}) {
    AttentionConfig c = rotary_attention(10, 2, 1);  // d_head 5: rotary on 4 of them
    c.rope.dim = 4;
    c.qk_norm = cs.qk_norm;
    c.softcap = cs.softcap;
    c.window = cs.window;
    c.qkv_bias = true;
    Rng r(8);
    MultiHeadAttention mha(c, r);
    for (auto& [name, p] : mha.named_parameters()) init_normal(p, r, 0.5f);
    if (cs.qk_norm)
      for (Tensor* w : {&mha.q_norm->weight, &mha.k_norm->weight})
        for (int64_t i = 0; i < w->numel(); ++i) w->data()[i] += 1.f;
    Tensor x = Tensor::randn({2, 4, 10}, rng()).requires_grad_();
    std::vector<Tensor> inputs = mha.parameters();
    inputs.push_back(x);
    const GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) {
      MultiHeadAttention::Call call;
      call.causal = true;
      return mha.forward(x, Tensor(), call);
    }, inputs);
    BOOST_TEST_CONTEXT(cs.what) { BOOST_TEST(res.ok, res.message); }
  }
  AttentionConfig c = rotary_attention(16, 2, 2);
  Rng r1(9), r2(9);
  MultiHeadAttention plain(c, r1);
  c.softcap = 1e30f;
  MultiHeadAttention capped(c, r2);
  const Tensor x = Tensor::randn({2, 6, 16}, rng());
  MultiHeadAttention::Call call;
  call.causal = true;
  NoGradGuard ng;
  BOOST_TEST(max_diff(plain.forward(x, Tensor(), call), capped.forward(x, Tensor(), call)) < 1e-6f);
}

BOOST_AUTO_TEST_CASE(lm_gradcheck_with_every_option) {
  ModelConfig c = every_option();
  c.n_layers = 2;
  c.d_model = 8;
  c.rotary_dim = 2;
  auto m = random_model(c, 3);
  const Ids ids = ids_2x5();
  const GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) { return m->forward(ids); }, m->parameters());
  BOOST_TEST(res.ok, res.message);
  BOOST_TEST(res.checked == m->num_parameters());
}

BOOST_AUTO_TEST_CASE(hooks_made_are_declared_with_their_shapes_and_identity_hooks_change_nothing) {
  for (const bool all : {true, false}) {
    ModelConfig c = every_option();
    if (!all) c.attn_softcap = 0.f, c.qk_norm = false, c.positions = Positions::None;
    auto m = random_model(c, 6);
    NoGradGuard ng;
    const Tensor plain = m->forward(ids_2x5());
    auto [logits, cache] = m->run_with_cache(ids_2x5(), all_names());
    std::vector<std::string> made = cache.names(), declared;
    for (const HookPointInfo& p : describe_hook_points(c)) {
      declared.push_back(p.name);
      if (!cache.has(p.name)) continue;
      std::string want = p.shape;  // "(B, T, 2, 8)" -> "(2,5,2,8)"
      want.erase(std::remove(want.begin(), want.end(), ' '), want.end());
      for (auto [from, to] : {std::pair<std::string, std::string>{"B", "2"}, {"T", "5"}})
        for (size_t at; (at = want.find(from)) != std::string::npos;) want.replace(at, 1, to);
      BOOST_TEST_CONTEXT(p.name) { BOOST_TEST(cache[p.name].shape().str() == want); }
    }
    std::sort(made.begin(), made.end());
    std::sort(declared.begin(), declared.end());
    BOOST_TEST_CONTEXT(all) {
      BOOST_TEST(made == declared, tt::per_element());
      BOOST_TEST(cache.has("blocks.0.attn.hook_rot_q") == all);
      BOOST_TEST(cache.has("blocks.1.attn.k_norm.hook_normalized") == all);
      BOOST_TEST(cache.has("blocks.0.attn.hook_attn_scores_capped") == all);
      BOOST_TEST(logits.to_vector() == plain.to_vector(), tt::per_element());
      // identity hooks on every point: the same logits, bit for bit
      Hooks hk;
      for (const std::string& name : declared) hk.add_forward(name, [](const Tensor& t, const std::string&) { return t; });
      ForwardOptions opt;
      opt.hooks = &hk;
      BOOST_TEST(m->forward(ids_2x5(), opt).to_vector() == plain.to_vector(), tt::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(checkpoint_round_trip_with_every_option) {
  const ModelConfig c = every_option();
  auto m = random_model(c, 5);
  const std::string path = temp_path("attention_options_roundtrip.safetensors");
  save_checkpoint(path, *m);
  auto loaded = load_model(path);
  std::filesystem::remove(path);
  BOOST_TEST(loaded->cfg.to_json() == c.to_json());
  const auto expected = parameter_shapes(c);
  const auto params = m->named_parameters();
  BOOST_TEST_REQUIRE(expected.size() == params.size());
  for (size_t i = 0; i < params.size(); ++i) BOOST_TEST(expected[i].first == params[i].first);
  NoGradGuard ng;
  BOOST_TEST(m->forward(ids_2x5()).to_vector() == loaded->forward(ids_2x5()).to_vector(), tt::per_element());
  // a config without the keys (an older file) reads as today's attention
  const ModelConfig old = ModelConfig::from_json(R"({"vocab_size":7,"d_model":8,"n_layers":1,"n_heads":2,"d_ff":4,"max_seq_len":6})", "old.json");
  BOOST_TEST(to_string(old.positions) == "learned");
  BOOST_TEST((!old.qk_norm && old.attn_softcap == 0.f && old.sliding_window == 0 && old.rotary_pct == 1.f));
}

BOOST_AUTO_TEST_CASE(bad_values_and_contradicting_resumes_are_refused_naming_the_setting) {
  auto refused = [](const ModelConfig& c, const std::string& msg) {
    BOOST_CHECK_EXCEPTION(c.validate(), Error, [&](const Error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return std::string(e.what()) == msg;
    });
  };
  ModelConfig c = every_option();
  c.rotary_dim = 3;
  refused(c, "model config: rotary_dim 3 must be even and at most d_head 8 (0 = rotary_pct's)");
  c = every_option();
  c.rotary_dim = 0;
  c.rotary_pct = 0.2f;  // 1.6 of 8 dims
  refused(c, "model config: rotary_pct 0.2 of d_head 8 is 1 dims; rotary needs an even number, at least 2 (or give rotary_dim)");
  c = every_option();
  c.attn_softcap = -1.f;
  refused(c, "model config: attn_softcap must be positive (0 = no cap), got -1");
  c = every_option();
  c.sliding_window = 0;
  refused(c, "model config: window_layers 'alternate' needs a sliding_window (the local layers' window)");
  // one letter per layer (GPT-Neo's attention_types, layer_types): local where L
  c = every_option();
  c.window_layers = "GL";
  BOOST_TEST(c.window_of_layer(0) == 0);
  BOOST_TEST(c.window_of_layer(1) == 2);
  BOOST_CHECK_NO_THROW(c.validate());
  c.window_layers = "GLG";
  refused(c, "model config: window_layers 'GLG' has 3 letters for 2 layers (one L or G per layer)");
  c.window_layers = "Gl";
  refused(c, "model config: window_layers 'Gl' is not all, alternate, L:G (local:global layers, e.g. 5:1) or one L/G per layer");
  // a cap below 0 given as a flag: the table's range names the flag
  BOOST_CHECK_EXCEPTION(resolve("", {"--attn-softcap"}, [](TrainFlagValues& v) { v.args.model.attn_softcap = -2.f; }).validate(),
                        Error, [](const Error& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          return std::string(e.what()).rfind("--attn-softcap", 0) == 0;
                        });
  // resuming with an option the run did not have: the stored value is its default, not null
  const TrainArgs stored = resolve("", {}, [](TrainFlagValues&) {});
  const TrainArgs given = resolve("", {"--qk-norm"}, [](TrainFlagValues& v) { v.args.model.qk_norm = true; });
  BOOST_CHECK_EXCEPTION(resume_with_flags(TrainArgs::from_json(stored.to_json(), "run/checkpoint.safetensors"), given,
                                          [](const std::string& f) { return f == "--qk-norm"; }, "run/checkpoint.safetensors"),
                        Error, [](const Error& e) {
                          return std::string(e.what()) == "--qk-norm true does not match the run being resumed (false in run/checkpoint.safetensors)";
                        });
}

BOOST_AUTO_TEST_CASE(a_left_padded_rotary_row_equals_the_row_alone) {
  // position_ids from the padding: the padded row's real tokens sit at 0, 1, ... as alone
  ModelConfig c = every_option();
  c.sliding_window = 0, c.window_layers = "all";
  auto m = random_model(c, 12);
  const Ids alone(Shape{1, 3}, {4, 1, 5});
  const Ids padded(Shape{1, 5}, {0, 0, 4, 1, 5});
  Tensor key_padding = Tensor::zeros({1, 5});
  key_padding.at({0, 0}) = key_padding.at({0, 1}) = 1.f;
  const Ids positions = positions_from_padding(key_padding);
  ForwardOptions opt;
  opt.key_padding = key_padding;
  opt.position_ids = &positions;
  NoGradGuard ng;
  const Tensor want = m->forward(alone), got = slice(m->forward(padded, opt), 1, 2, 5);
  BOOST_TEST(max_diff(got, want) < 2e-5f);
  // the positions are read: real tokens at 0, 2, 3 (not a shift of 0, 1, 2) give another row
  const Ids gapped(Shape{1, 5}, {0, 0, 0, 2, 3});
  opt.position_ids = &gapped;
  BOOST_TEST(max_diff(slice(m->forward(padded, opt), 1, 2, 5), want) > 1e-3f);
}

BOOST_AUTO_TEST_CASE(edges_take_every_attention_option) {
  // exact edges equal the hooked reference with each option: tests/test_edges.cpp
  ModelConfig c = test_model();
  c.positions = Positions::Rotary, c.qk_norm = true, c.attn_scale = 1.f, c.attn_softcap = 5.f, c.sliding_window = 3;
  c.qkv_bias = c.o_bias = true;
  BOOST_CHECK_NO_THROW(check_edge_model(c));
  c.n_kv_heads = 1;  // grouped keys and values: taken, the analyses run on the ungrouped model (edge_model)
  BOOST_CHECK_NO_THROW(check_edge_model(c));
}

BOOST_AUTO_TEST_CASE(layers_that_turn_alike_share_one_rotary_table) {
  // four layers, local ones turning with their own base (Gemma 3): layers 0 and 2 read one table,
  // 1 and 3 another, each equal bit for bit to the table built alone; a model's tables are its
  // own (a second model builds its own, so nothing outlives the model that holds it)
  ModelConfig c = test_model({.d_model = 16, .layers = 4, .heads = 2, .max_seq_len = 8});
  c.positions = Positions::Rotary;
  c.rope_theta = 500.f;
  c.rope_theta_local = 50.f;
  c.sliding_window = 2;
  c.window_layers = "LGLG";
  TransformerLM model(c, 1), other(c, 1);
  auto table = [](const TransformerLM& m, int l) { return m.blocks[l]->attn.rotary_cos_sin; };
  BOOST_TEST(table(model, 0).data() == table(model, 2).data());
  BOOST_TEST(table(model, 1).data() == table(model, 3).data());
  BOOST_TEST(table(model, 0).data() != table(model, 1).data());
  BOOST_TEST(table(model, 0).data() != table(other, 0).data());
  for (int l = 0; l < 4; ++l) {
    const AttentionConfig a = c.attention(l);
    RotaryArgs ra = a.rope;
    ra.d_head = c.head_dim();
    BOOST_TEST(ra.theta == (l % 2 ? 500.f : 50.f));
    const Tensor alone = rotary_table(c.max_seq_len, ra);
    BOOST_TEST(max_diff(table(model, l), alone) == 0.f);
  }
}

namespace {
// Pages of t's storage the process has touched (mincore), the first and last left out (they may
// hold the allocator's own bookkeeping).
size_t touched_pages(const Tensor& t) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.data()) / page + 1) * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data() + t.numel()) / page - 1) * page;
  if (end <= begin) return 0;
  std::vector<unsigned char> in((end - begin) / page);
  BOOST_TEST_REQUIRE(mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) == 0);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_model_built_to_be_loaded_leaves_its_qkv_slab_untouched) {
  // the loader builds the model under SkipInitGuard and writes every parameter next: the
  // query/key/value slab (48 MiB here: its own mapping, above glibc's largest mmap threshold, so
  // fresh pages) is not written by the constructor, so its
  // pages do not sit beside the file's tensors (0.9 GiB at Gemma-2-2B's shape); built to be used,
  // it holds the initialised W_Q, W_K, W_V
  ModelConfig c = test_model({.d_model = 2048, .layers = 1, .heads = 8, .max_seq_len = 8});
  std::unique_ptr<TransformerLM> loaded;
  {
    SkipInitGuard loaded_next;
    loaded = std::make_unique<TransformerLM>(c, 0);
  }
  const TransformerLM used(c, 0);
  const Tensor& skipped = loaded->blocks[0]->attn.W_Q.weight;
  BOOST_TEST(touched_pages(skipped) <= 2u);  // a sanitizer's allocator writes a page of its own inside
  BOOST_TEST(touched_pages(used.blocks[0]->attn.W_Q.weight) > 4000u);  // W_Q's 16 MiB of 4 KiB pages, all written
}
