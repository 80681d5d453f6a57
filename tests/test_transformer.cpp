// FeedForward, TransformerBlock, TransformerLM: gradchecks, parameter names (docs/formats.md), checkpoints,
// hooks, gates, KV-cache decoding.
#define BOOST_TEST_MODULE transformer
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>

#include "lib/gradcheck.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "tests/reference_model.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;
namespace tt = boost::test_tools;

namespace {
ModelConfig tiny(Norm norm = Norm::Pre) { return test_model({.norm = norm}); }
Ids ids_2x5() { return Ids(Shape{2, 5}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2}); }
}  // namespace

BOOST_AUTO_TEST_CASE(feedforward_gradcheck_each_activation) {
  for (Activation a : {Activation::GeluTanh, Activation::GeluErf, Activation::Relu}) {
    Rng r(1);
    ModelConfig c = test_model({.d_model = 6, .d_ff = 10});
    c.activation = a;
    FeedForward ff(c, r);
    for (auto& p : ff.parameters()) init_normal(p, r, 0.5f);
    Tensor x = Tensor::randn({2, 3, 6}, r).requires_grad_();
    // ReLU has a kink at 0: draw inputs until no hidden pre-activation lies within 0.05 of
    // it, so no finite-difference step crosses the kink.
    for (int tries = 0; a == Activation::Relu && tries < 1000; ++tries) {
      NoGradGuard ng;
      float closest = 1e9f;
      for (float v : ff.fc1.forward(x).to_vector()) closest = std::min(closest, std::fabs(v));
      if (closest > 0.05f) break;
      x = Tensor::randn({2, 3, 6}, r).requires_grad_();
    }
    auto inputs = ff.parameters();
    inputs.push_back(x);
    GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) { return ff.forward(x); }, inputs);
    BOOST_TEST_CONTEXT(to_string(a)) { BOOST_TEST(res.ok, res.message); }
  }
}

BOOST_AUTO_TEST_CASE(block_gradcheck_pre_and_post_norm) {
  for (Norm n : {Norm::Pre, Norm::Post}) {
    ModelConfig c = tiny(n);
    Rng r(2);
    TransformerBlock blk(c, r, nullptr);
    for (auto& [name, p] : blk.named_parameters()) init_normal(p, r, 0.3f);
    BOOST_TEST_REQUIRE(blk.ffn != nullptr);
    for (auto* ln : {&blk.ln1, blk.ln2.get()}) ln->weight = add_scalar(ln->weight, 1.f).detach().requires_grad_();
    blk.attn.gates.requires_grad_();
    Tensor x = Tensor::randn({2, 4, 8}, r).requires_grad_();
    auto inputs = blk.parameters();
    inputs.push_back(x);
    inputs.push_back(blk.attn.gates);
    MultiHeadAttention::Call call;
    call.causal = true;
    GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) { return blk.forward(x, call); }, inputs);
    BOOST_TEST_CONTEXT(to_string(n)) { BOOST_TEST(res.ok, res.message); }
  }
}

BOOST_AUTO_TEST_CASE(lm_gradcheck_every_parameter_and_gate) {
  struct V { const char* what; int H, Hkv; int64_t d_head; Norm norm; Positions pos; int64_t d_ff = 12; };
  for (V v : {V{"pre learned", 2, 0, 0, Norm::Pre, Positions::Learned},
              V{"post sinusoidal gqa", 4, 2, 0, Norm::Post, Positions::Sinusoidal},
              V{"mqa d_head 3", 2, 1, 3, Norm::Pre, Positions::Learned},
              V{"attention-only pre", 2, 0, 0, Norm::Pre, Positions::Learned, 0},
              V{"attention-only post", 2, 0, 0, Norm::Post, Positions::Learned, 0}}) {
    ModelConfig c = tiny(v.norm);
    c.d_ff = v.d_ff;
    c.n_heads = v.H;
    c.n_kv_heads = v.Hkv;
    c.d_head = v.d_head;
    c.positions = v.pos;
    c.head_bias = true;
    TransformerLM m(c, 3);
    Rng r(3);
    for (auto& [name, p] : m.named_parameters())
      if (name.find("ln") == std::string::npos) init_normal(p, r, 0.25f);
    m.set_gates_require_grad(true);
    auto inputs = m.parameters();
    for (int l = 0; l < c.n_layers; ++l) inputs.push_back(m.gates(l));
    const Ids ids = ids_2x5();
    GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) { return m.forward(ids); }, inputs);
    BOOST_TEST_CONTEXT(v.what) {
      BOOST_TEST(res.ok, res.message);
      BOOST_TEST(res.checked == m.num_parameters() + c.n_layers * c.n_heads);
    }
  }
}

BOOST_AUTO_TEST_CASE(live_positions_forward_equals_the_full_forward) {
  // Computing only the first live_len[b] positions of each row gives those positions' logits
  // of the full forward (within the round-off of a float64 reference), packed row after row;
  // the gradients through them pass a gradcheck. Pre and post norm, learned and sinusoidal.
  for (Norm norm : {Norm::Pre, Norm::Post}) {
    ModelConfig c = tiny(norm);
    c.positions = norm == Norm::Pre ? Positions::Learned : Positions::Sinusoidal;
    TransformerLM m(c, 5);
    const Ids ids = ids_2x5();
    const std::vector<int32_t> live = {3, 5};
    ForwardOptions opt;
    opt.live_len = live;
    {
      NoGradGuard ng;
      const Tensor packed = m.forward(ids, opt);  // (8, 7)
      BOOST_TEST(packed.shape() == Shape({8, 7}));
      const roundoff::Mat ref = roundoff::bounded_logits(m, ids);  // (2*5, 7)
      int64_t i = 0;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < live[b]; ++t, ++i)
          for (int64_t v = 0; v < 7; ++v) BOOST_TEST(std::fabs(packed.at({i, v}) - ref(b * 5 + t, v).v) <= ref(b * 5 + t, v).e);
    }
    GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) { return m.forward(ids, opt); }, m.parameters());
    BOOST_TEST(res.ok, res.message);
    // output_rows: the logits of some of the packed positions only (the last block's tail and
    // the head run on those), the same values
    const Ids out_rows(Shape{3}, {1, 2, 6});  // (0,1), (0,2), (1,3)
    opt.output_rows = &out_rows;
    {
      NoGradGuard ng;
      const Tensor some = m.forward(ids, opt);
      BOOST_TEST(some.shape() == Shape({3, 7}));
      const roundoff::Mat ref = roundoff::bounded_logits(m, ids);
      const int64_t at[3] = {1, 2, 5 + 3};
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t v = 0; v < 7; ++v) BOOST_TEST(std::fabs(some.at({i, v}) - ref(at[i], v).v) <= ref(at[i], v).e);
    }
    res = gradcheck([&](const std::vector<Tensor>&) { return m.forward(ids, opt); }, m.parameters());
    BOOST_TEST(res.ok, res.message);
    opt.output_rows = nullptr;
  }
  {  // every row live to the end, logits at some positions (induction's rows: targets on the repeat)
    TransformerLM m(tiny(), 7);
    const Ids ids = ids_2x5();
    const std::vector<int32_t> live = {5, 5};
    const Ids out_rows(Shape{4}, {2, 4, 7, 9});  // (0,2), (0,4), (1,2), (1,4)
    ForwardOptions opt;
    opt.live_len = live;
    opt.output_rows = &out_rows;
    {
      NoGradGuard ng;
      const Tensor some = m.forward(ids, opt);
      BOOST_TEST(some.shape() == Shape({4, 7}));
      const roundoff::Mat ref = roundoff::bounded_logits(m, ids);
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t v = 0; v < 7; ++v)
          BOOST_TEST(std::fabs(some.at({i, v}) - ref(out_rows.data[i], v).v) <= ref(out_rows.data[i], v).e);
    }
    const GradcheckResult res = gradcheck([&](const std::vector<Tensor>&) { return m.forward(ids, opt); }, m.parameters());
    BOOST_TEST(res.ok, res.message);
  }
  {  // an empty row, and key padding inside and after the live positions
    TransformerLM m(tiny(), 6);
    const Ids ids = ids_2x5();
    Tensor pad = Tensor::zeros({2, 5});
    pad.at({1, 1}) = 1.f;
    pad.at({1, 4}) = 1.f;
    const std::vector<int32_t> live = {0, 3};
    ForwardOptions opt;
    opt.live_len = live;
    opt.key_padding = pad;
    NoGradGuard ng;
    const Tensor packed = m.forward(ids, opt);  // row 1's positions 0..2
    BOOST_TEST(packed.shape() == Shape({3, 7}));
    const roundoff::Mat ref = roundoff::bounded_logits(m, ids, pad);
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t v = 0; v < 7; ++v) BOOST_TEST(std::fabs(packed.at({t, v}) - ref(5 + t, v).v) <= ref(5 + t, v).e);
  }
  TransformerLM m(tiny(), 5);
  const std::vector<int32_t> too_long = {3, 6};
  ForwardOptions opt;
  opt.live_len = too_long;
  BOOST_CHECK_EXCEPTION(m.forward(ids_2x5(), opt), Error,
                        [](const Error& e) { return std::string(e.what()) == "model: live_len 6 outside 0..5"; });
}

BOOST_AUTO_TEST_CASE(parameter_names_follow_interop) {
  ModelConfig c = tiny();
  c.n_layers = 1;
  TransformerLM m(c, 0);
  std::vector<std::string> names;
  for (auto& [n, t] : m.named_parameters()) names.push_back(n);
  const std::vector<std::string> expect = {
      "tok_emb.weight", "pos_emb.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
      "blocks.0.attn.W_Q.weight", "blocks.0.attn.W_Q.bias", "blocks.0.attn.W_K.weight", "blocks.0.attn.W_K.bias",
      "blocks.0.attn.W_V.weight", "blocks.0.attn.W_V.bias", "blocks.0.attn.W_O.weight", "blocks.0.attn.W_O.bias",
      "blocks.0.ln2.weight", "blocks.0.ln2.bias", "blocks.0.ffn.fc1.weight", "blocks.0.ffn.fc1.bias",
      "blocks.0.ffn.fc2.weight", "blocks.0.ffn.fc2.bias", "ln_f.weight", "ln_f.bias", "head.weight"};
  BOOST_TEST(names == expect, tt::per_element());
  BOOST_TEST(m.parameter("blocks.0.attn.W_O.weight").shape() == Shape({8, 8}));
  ModelConfig p = tiny(Norm::Post);
  p.positions = Positions::Sinusoidal;
  TransformerLM post(p, 0);
  for (auto& [n, t] : post.named_parameters()) {
    BOOST_TEST(n.find("ln_f") == std::string::npos);
    BOOST_TEST(n.find("pos_emb") == std::string::npos);
  }
  BOOST_TEST(post.sinusoid.at({3, 2}) == std::sin(3.0 / std::pow(10000.0, 2.0 / 8)), tt::tolerance(1e-6));
  BOOST_TEST(post.sinusoid.at({3, 3}) == std::cos(3.0 / std::pow(10000.0, 2.0 / 8)), tt::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(checkpoint_round_trip_is_exact) {
  for (int64_t d_ff : {12, 0}) {  // 0: attention-only
  ModelConfig c = tiny();
  c.n_kv_heads = 1;
  c.d_ff = d_ff;
  TransformerLM m(c, 5);
  m.gates(1).data()[0] = 0.f;
  const std::string path = temp_path("ckpt_roundtrip.safetensors");
  save_checkpoint(path, m);
  auto loaded = load_model(path);
  BOOST_TEST(loaded->cfg.to_json() == m.cfg.to_json());
  BOOST_TEST(loaded->gate_values() == m.gate_values());
  auto a = m.named_parameters(), b = loaded->named_parameters();
  BOOST_TEST(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) BOOST_TEST(a[i].second.to_vector() == b[i].second.to_vector());
  NoGradGuard ng;
  BOOST_TEST(m.forward(ids_2x5()).to_vector() == loaded->forward(ids_2x5()).to_vector());
  BOOST_TEST((loaded->blocks[0]->ffn == nullptr) == (d_ff == 0));
  std::filesystem::remove(path);
  }
}

BOOST_AUTO_TEST_CASE(parameter_shapes_are_the_models_parameters) {
  // the shapes a checkpoint is checked against before any model is built are exactly the ones
  // the model has, for every kind of config
  for (int variant = 0; variant < 6; ++variant) {
    ModelConfig c = tiny(variant % 2 ? Norm::Post : Norm::Pre);
    c.d_ff = variant >= 4 ? 0 : c.d_ff;  // attention-only
    c.positions = variant >= 2 ? Positions::Sinusoidal : Positions::Learned;
    c.attn_bias = variant == 1;
    c.mlp_bias = variant != 2;
    c.head_bias = variant == 3;
    c.n_heads = 4;
    c.n_kv_heads = variant == 3 ? 2 : 0;
    TransformerLM m(c, 1);
    const auto expected = parameter_shapes(c);
    const auto params = m.named_parameters();
    BOOST_TEST_REQUIRE(expected.size() == params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      BOOST_TEST(expected[i].first == params[i].first);
      BOOST_TEST(expected[i].second == params[i].second.shape());
    }
    BOOST_TEST(parameter_count(c) == m.num_parameters());
  }
}

BOOST_AUTO_TEST_CASE(checkpoint_rejects_mismatches) {
  TransformerLM m(tiny(), 5);
  SafetensorsWriter w;
  add_model(w, m);
  w.add("extra.weight", Tensor::zeros({2}));
  SafetensorsFile f = parse_safetensors(w.serialize(), "x.safetensors");
  BOOST_CHECK_EXCEPTION(load_model(f), Error, [](const Error& e) {
    return std::string(e.what()) ==
           "x.safetensors: unexpected tensor 'extra.weight' (not a parameter of the model its config describes)";
  });
  // a parameter with the wrong shape: config says d_ff 16 but the tensors are for 12
  SafetensorsWriter w2;
  add_model(w2, m);
  ModelConfig other = tiny();
  other.d_ff = 16;
  w2.set_meta("config", other.to_json());
  BOOST_CHECK_EXCEPTION(load_model(parse_safetensors(w2.serialize(), "y.safetensors")), Error, [](const Error& e) {
    return std::string(e.what()) ==
           "y.safetensors: tensor 'blocks.0.ffn.fc1.weight' has shape (12,8) but the config (d_model 8, 2 layers, 2 heads, "
           "d_ff 16, vocab 7, max_seq_len 6) needs (16,8)";
  });
  SafetensorsWriter w3;
  w3.add("tok_emb.weight", Tensor::zeros({7, 8}));
  BOOST_CHECK_EXCEPTION(load_model(parse_safetensors(w3.serialize(), "z.safetensors")), Error, [](const Error& e) {
    return std::string(e.what()) == "z.safetensors: metadata key 'config' is missing";
  });
  SafetensorsWriter w4;
  add_model(w4, m);
  w4.set_meta("config", R"({"vocab_size": 7, "d_model": 8, "n_layers": 1, "n_heads": 3, "d_ff": 4, "max_seq_len": 4})");
  BOOST_CHECK_EXCEPTION(load_model(parse_safetensors(w4.serialize(), "h.safetensors")), Error, [](const Error& e) {
    return std::string(e.what()).find("h.safetensors: attention: n_heads 3 does not divide d_model 8") == 0;
  });
}

BOOST_AUTO_TEST_CASE(lm_kv_cache_decoding_equals_full_forward) {
  ModelConfig c = tiny();
  c.n_heads = 4;
  c.n_kv_heads = 2;
  TransformerLM m(c, 9);
  NoGradGuard ng;
  const Ids ids = ids_2x5();
  Tensor full = m.forward(ids);  // (2,5,7)
  // both within the round-off of a float64 reference: so within twice its bound of each other
  const roundoff::Mat ref = roundoff::bounded_logits(m, ids);
  roundoff::check_within(full, ref, "full forward");
  std::vector<KVCacheLayer> cache;
  ForwardOptions opt;
  opt.kv_cache = &cache;
  for (int t = 0; t < 5; ++t) {
    Ids step(Shape{2, 1}, {ids.at(0, t), ids.at(1, t)});
    Tensor logits = m.forward(step, opt);  // (2,1,7)
    for (int b = 0; b < 2; ++b)
      for (int v = 0; v < 7; ++v)
        BOOST_TEST(std::fabs(logits.at({b, 0, v}) - full.at({b, t, v})) <= 2 * ref(b * 5 + t, v).e);
  }
}

BOOST_AUTO_TEST_CASE(hooks_record_activations_and_gradients) {
  ModelConfig c = tiny();
  TransformerLM m(c, 4);
  const Ids ids = ids_2x5();
  auto [logits, cache] = m.run_with_cache(ids, all_names(), /*with_grads=*/true);
  Ids targets(Shape{2, 5}, {3, 5, 2, 6, 1, 4, 4, 1, 2, -1});
  cross_entropy(logits, targets).backward();
  // exactly the documented hook points, with the documented shapes
  const auto points = hook_points(c);
  auto concrete = [](const std::string& doc) {  // "(B, T, 8)" -> "(2,5,8)" for B = 2, T = 5
    std::string out;
    for (char ch : doc)
      if (ch != ' ') out += ch == 'B' ? std::string("2") : ch == 'T' ? std::string("5") : std::string(1, ch);
    return out;
  };
  BOOST_TEST(cache.size() == points.size());
  for (auto& [name, shape] : points) {
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST_REQUIRE(cache.has(name));
      BOOST_TEST(cache[name].shape().str() == concrete(shape));
    }
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    BOOST_TEST(cache[b + "attn.hook_pattern"].shape() == Shape({2, 2, 5, 5}));
    BOOST_TEST(cache[b + "attn.hook_z"].shape() == Shape({2, 5, 2, 4}));
    BOOST_TEST(cache.grad(b + "attn.hook_z").shape() == Shape({2, 5, 2, 4}));
    BOOST_TEST(cache.grad(b + "attn.hook_pattern").shape() == Shape({2, 2, 5, 5}));
    BOOST_TEST(cache.grad(b + "hook_resid_post").shape() == Shape({2, 5, 8}));
    // dL/dW_O = dL/d(attn out)^T z: its column block for head 1 comes from z's head-1 slice only
    Tensor gwo = m.blocks[l]->attn.W_O.weight.grad();             // (8, 8)
    Tensor dout = reshape(cache.grad(b + "hook_attn_out"), {10, 8});
    Tensor z1 = reshape(slice(cache[b + "attn.hook_z"], 2, 1, 2), {10, 4});
    // both are sums of 10 products of the same float32 values, added in different orders
    const roundoff::Mat expect = roundoff::matmul(roundoff::from_tensor(dout), roundoff::from_tensor(z1), true, false);  // (8, 4)
    roundoff::check_within(head_cols(gwo, 1, 4), expect, "W_O head-1 gradient block");
  }
}

BOOST_AUTO_TEST_CASE(gate_zero_in_lm_equals_zeroed_columns_and_hook_ablation) {
  ModelConfig c = tiny();
  TransformerLM a(c, 6), b(c, 6), h(c, 6);
  a.gates(0).data()[1] = 0.f;
  Tensor wo = b.blocks[0]->attn.W_O.weight;
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t col = 4; col < 8; ++col) wo.at({r, col}) = 0.f;
  Hooks hooks;  // zero head 1 of layer 0's z
  hooks.add_forward("blocks.0.attn.hook_z", [](const Tensor& z, const std::string&) { return replace_head(z, 1); });
  ForwardOptions opt;
  opt.hooks = &hooks;
  const Ids ids = ids_2x5();
  NoGradGuard ng;
  Tensor la = a.forward(ids);
  BOOST_TEST(la.to_vector() == b.forward(ids).to_vector());
  BOOST_TEST(la.to_vector() == h.forward(ids, opt).to_vector());
  BOOST_TEST(la.to_vector() != TransformerLM(c, 6).forward(ids).to_vector());
}

BOOST_AUTO_TEST_CASE(mean_ablation_replaces_a_head_with_its_mean) {
  ModelConfig c = tiny();
  TransformerLM m(c, 8);
  const Ids ids = ids_2x5();
  NoGradGuard ng;
  const ActivationCache rec = m.run_with_cache(ids, name_is("blocks.1.attn.hook_z")).second;
  const Tensor z = rec["blocks.1.attn.hook_z"];                   // (2, 5, 2, 4)
  const Tensor mean_z0 = mean(reshape(slice(z, 2, 0, 1), {10, 4}), {0});  // head 0's mean output (4)
  ActivationCache after;
  Hooks hooks;
  hooks.add_forward("blocks.1.attn.hook_z", [&](const Tensor& zz, const std::string&) { return replace_head(zz, 0, mean_z0); });
  hooks.cache(after, name_is("blocks.1.attn.hook_z"));
  ForwardOptions o;
  o.hooks = &hooks;
  m.forward(ids, o);
  const Tensor got = after["blocks.1.attn.hook_z"];  // the cache records the replacement
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t j = 0; j < 8; ++j)
      BOOST_TEST(got.data()[r * 8 + j] == (j < 4 ? mean_z0.data()[j] : z.data()[r * 8 + j]));
}

BOOST_AUTO_TEST_CASE(config_validation_messages) {
  ModelConfig c = tiny();
  c.n_heads = 3;
  BOOST_CHECK_EXCEPTION(c.validate(), Error, [](const Error& e) {
    return std::string(e.what()) ==
           "attention: n_heads 3 does not divide d_model 8 (give d_head explicitly to use any head size)";
  });
  c.d_head = 4;
  BOOST_CHECK_NO_THROW(c.validate());
  c.n_kv_heads = 2;
  BOOST_CHECK_EXCEPTION(c.validate(), Error, [](const Error& e) {
    return std::string(e.what()) == "attention: n_kv_heads 2 must divide n_heads 3";
  });
  ModelConfig d = tiny();
  d.d_ff = -1;
  BOOST_CHECK_EXCEPTION(d.validate(), Error, [](const Error& e) {
    return std::string(e.what()) == "model config: d_ff must not be negative (0 = attention-only: no MLP), got -1";
  });
  d.d_ff = 0;  // attention-only
  BOOST_CHECK_NO_THROW(d.validate());
  TransformerLM m(tiny(), 1);
  BOOST_CHECK_EXCEPTION(m.forward(Ids(Shape{1, 7}, {0, 0, 0, 0, 0, 0, 0})), Error, [](const Error& e) {
    return std::string(e.what()) == "model: sequence of length 7 exceeds max_seq_len 6";
  });
}

BOOST_AUTO_TEST_CASE(attention_only_model_has_no_mlp_and_exactly_its_hook_points) {
  // d_ff 0: blocks of attention alone (Olsson et al.'s attention-only transformers); the forward
  // makes exactly the hook points the modules declare, and the logits are the reference's.
  ModelConfig c = tiny();
  c.d_ff = 0;
  TransformerLM m(c, 6);
  for (auto& [name, p] : m.named_parameters()) BOOST_TEST(name.find("ffn") == std::string::npos);
  BOOST_TEST(m.blocks[0]->ln2 == nullptr);
  auto [logits, cache] = m.run_with_cache(ids_2x5(), all_names(), false);
  std::vector<std::string> made = cache.names(), declared;
  for (auto& [name, shape] : hook_points(c)) declared.push_back(name);
  std::sort(made.begin(), made.end());
  std::sort(declared.begin(), declared.end());
  BOOST_TEST(made == declared, tt::per_element());
  BOOST_TEST(!cache.has("blocks.0.hook_mlp_out"));
  roundoff::check_within(logits, roundoff::bounded_logits(m, ids_2x5()), "attention-only forward");
}

// Dropout (embedding, residual, attention) draws only in training: eval() gives the same logits
// every time, and they equal a model without dropout of the same weights.
BOOST_AUTO_TEST_CASE(eval_turns_every_dropout_off) {
  ModelConfig c = tiny();
  c.dropout = 0.3f;
  c.attn_dropout = 0.2f;
  TransformerLM m(c, 5);
  ModelConfig plain_cfg = c;
  plain_cfg.dropout = plain_cfg.attn_dropout = 0.f;
  TransformerLM plain(plain_cfg, 5);
  NoGradGuard ng;
  m.train();
  BOOST_TEST(m.forward(ids_2x5()).to_vector() != m.forward(ids_2x5()).to_vector());
  m.eval();
  const std::vector<float> a = m.forward(ids_2x5()).to_vector();
  BOOST_TEST(a == m.forward(ids_2x5()).to_vector());
  plain.eval();
  BOOST_TEST(a == plain.forward(ids_2x5()).to_vector());
}
