// Named hook points and the activation cache: identity hooks change nothing, replacements
// take effect (ablation, patching), backward hooks see the gradients retain_grad sees, caches
// hold exactly what was asked for.
#define BOOST_TEST_MODULE hooks
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <map>
#include <set>

#include "analysis/heads.h"
#include "lib/fileutil.h"
#include "models/transformer.h"
#include "tests/reference_model.h"
#include "lib/gradcheck.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;

namespace {

ModelConfig small(Norm norm = Norm::Pre, int kv_heads = 0) {
  return test_model({.vocab = 9, .heads = 4, .kv_heads = kv_heads, .d_ff = 16, .max_seq_len = 8, .norm = norm});
}
const Ids ids() { return Ids(Shape{2, 6}, {1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 8, 7}); }
const Ids targets() { return Ids(Shape{2, 6}, {3, 5, 2, 6, 0, -1, 4, 1, 2, 8, 7, 3}); }

std::vector<std::string> names_of(const ModelConfig& c) {
  std::vector<std::string> n;
  for (auto& [name, shape] : hook_points(c)) n.push_back(name);
  return n;
}

// logits and every parameter gradient of one forward/backward with the given hooks
struct Run {
  std::vector<float> logits;
  std::vector<std::vector<float>> grads;
};
Run run(TransformerLM& m, const Hooks* hooks) {
  m.zero_grad();
  ForwardOptions opt;
  opt.hooks = hooks;
  Tensor logits = m.forward(ids(), opt);
  cross_entropy(logits, targets()).backward();
  Run r;
  r.logits = logits.to_vector();
  for (auto& [name, p] : m.named_parameters()) r.grads.push_back(p.grad().to_vector());
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(identity_hooks_change_nothing_bit_for_bit) {
  // At every hook point at once and at each alone: a hook that reads (returns nothing) or
  // returns its input, a cache of everything, a backward hook: logits and gradients bit for bit.
  ModelConfig attn_only = small();
  attn_only.d_ff = 0;
  for (const ModelConfig& c : {small(), small(Norm::Post, 2), attn_only}) {
    TransformerLM m(c, 3);
    const Run plain = run(m, nullptr);
    auto check = [&](const Hooks& h, const std::string& what) {
      const Run r = run(m, &h);
      BOOST_TEST_CONTEXT(what) {
        BOOST_TEST(r.logits == plain.logits);
        BOOST_TEST_REQUIRE(r.grads.size() == plain.grads.size());
        for (size_t i = 0; i < r.grads.size(); ++i) BOOST_TEST(r.grads[i] == plain.grads[i]);
      }
    };
    Hooks all;
    ActivationCache cache;
    int seen = 0, grads_seen = 0;
    all.add_forward(all_names(), [&](const Tensor&, const std::string&) { ++seen; return Tensor(); });
    all.add_forward(all_names(), [](const Tensor& act, const std::string&) { return act; });
    all.add_backward(all_names(), [&](const Tensor&, const std::string&) { ++grads_seen; });
    all.cache(cache, all_names(), true);
    check(all, "every point");
    BOOST_TEST(seen == static_cast<int>(names_of(c).size()));
    BOOST_TEST(grads_seen > 0);
    for (const std::string& name : names_of(c)) {
      Hooks one;
      one.add_forward(name, [](const Tensor& act, const std::string&) { return act; });
      one.add_backward(name, [](const Tensor&, const std::string&) {});
      check(one, name);
    }
  }
}

BOOST_AUTO_TEST_CASE(replacing_with_an_equal_copy_gives_the_same_model_within_round_off) {
  // A copy is a replacement: scores, pattern and result then take the unfused path. The logits
  // stay within the round-off of the float64 reference (tests/roundoff.h).
  for (const ModelConfig& c : {small(), small(Norm::Pre, 2)}) {
    TransformerLM m(c, 5);
    NoGradGuard ng;
    const roundoff::Mat ref = roundoff::bounded_logits(m, ids());
    for (const char* point : {"hook_q_input", "hook_k_input", "hook_v_input", "hook_q", "hook_k", "hook_v", "hook_attn_scores",
                              "hook_pattern", "hook_z", "hook_result"}) {
      Hooks h;
      h.add_forward(names_ending_with(std::string("attn.") + point), [](const Tensor& act, const std::string&) { return act.clone(); });
      ForwardOptions opt;
      opt.hooks = &h;
      roundoff::check_within(m.forward(ids(), opt), ref, std::string("copy at every ") + point);
    }
  }
}

BOOST_AUTO_TEST_CASE(patching_from_a_clean_cache_restores_the_clean_logits) {
  TransformerLM m(small(), 7);
  NoGradGuard ng;
  const Ids clean = ids();
  Ids corrupted = clean;
  corrupted.at(0, 1) = 7;  // one source symbol changed
  corrupted.at(1, 2) = 0;
  auto [clean_logits, clean_cache] = m.run_with_cache(clean, all_names());
  const Tensor corrupted_logits = m.forward(corrupted);
  BOOST_TEST(corrupted_logits.to_vector() != clean_logits.to_vector());
  auto patched = [&](NameFilter where) {
    Hooks h;
    h.add_forward(std::move(where), [&](const Tensor&, const std::string& name) { return clean_cache[name]; });
    ForwardOptions opt;
    opt.hooks = &h;
    return m.forward(corrupted, opt).to_vector();
  };
  // every hooked activation, or just the last residual stream: exactly the clean logits
  BOOST_TEST(patched(all_names()) == clean_logits.to_vector());
  BOOST_TEST(patched(name_is("blocks.1.hook_resid_post")) == clean_logits.to_vector());
  // patching the embeddings is the clean run itself
  const std::vector<float> from_embed = patched(name_is("hook_embed"));
  BOOST_TEST(from_embed == clean_logits.to_vector());
}

BOOST_AUTO_TEST_CASE(backward_hooks_see_the_gradients_retain_grad_sees) {
  for (const ModelConfig& c : {small(), small(Norm::Post, 2)}) {
    TransformerLM m(c, 9);
    // a forward hook keeps each activation (a graph tensor) with retain_grad; backward hooks and
    // the gradient cache record what they are handed
    std::map<std::string, Tensor> retained;
    std::map<std::string, std::vector<float>> handed;
    ActivationCache cache;
    Hooks h;
    h.add_forward(all_names(), [&](const Tensor& act, const std::string& name) {
      // the fused kernel's pattern is not a graph tensor, and the scores a hook sees are
      // recomputed beside it: their gradients come from the kernel's backward (checked below)
      // the split inputs' copies, when left as they are, are made beside the usual projection
      // (which reads the input itself): their gradients come through a tap on q, k and v
      // (split_qkv_inputs_... below)
      if (act.requires_grad() && name.find("hook_attn_scores") == std::string::npos &&
          name.find("hook_result") == std::string::npos && !name.ends_with("_input")) {
        act.retain_grad();
        retained[name] = act;
      }
      return Tensor();
    });
    h.add_backward(all_names(), [&](const Tensor& g, const std::string& name) { handed[name] = g.to_vector(); });
    h.cache(cache, all_names(), true);
    ForwardOptions opt;
    opt.hooks = &h;
    Tensor logits = m.forward(ids(), opt);
    cross_entropy(logits, targets()).backward();
    // layer norm's hook_scale is a constant of the forward (no graph): no gradient reaches it
    size_t scales = 0;
    for (const std::string& n : names_of(c)) scales += n.find("hook_scale") != std::string::npos;
    BOOST_TEST(scales == (c.norm == Norm::Pre ? 2u * c.n_layers + 1 : 0u));
    BOOST_TEST(retained.size() == names_of(c).size() - 6 * static_cast<size_t>(c.n_layers) - scales);
    // each head's result adds into the attention output: its gradient is that output's
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string b = "blocks." + std::to_string(l) + ".";
      const std::vector<float>&res = handed.at(b + "attn.hook_result"), &out = handed.at(b + "hook_attn_out");
      const size_t D = 8, H = static_cast<size_t>(c.n_heads);
      BOOST_TEST_REQUIRE(res.size() == out.size() * H);
      for (size_t r = 0; r < out.size() / D; ++r)
        for (size_t hd = 0; hd < H; ++hd)
          for (size_t e = 0; e < D; ++e) BOOST_TEST(res[(r * H + hd) * D + e] == out[r * D + e]);
    }
    for (auto& [name, t] : retained) {
      BOOST_TEST_CONTEXT(name) {
        BOOST_TEST_REQUIRE(handed.count(name));
        BOOST_TEST(handed[name] == t.grad().to_vector());
        BOOST_TEST(cache.grad(name).to_vector() == t.grad().to_vector());
      }
    }
    // the fused op's pattern is not a graph tensor: its gradient comes from the op's backward.
    // Check it through the gate identity dL/dg_h = sum_ij dL/dP_ij P_ij (gates are 1).
    m.zero_grad();
    m.set_gates_require_grad(true);
    auto [logits2, cache2] = m.run_with_cache(ids(), names_ending_with("hook_pattern"), true);
    cross_entropy(logits2, targets()).backward();
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string name = "blocks." + std::to_string(l) + ".attn.hook_pattern";
      BOOST_TEST_REQUIRE(handed.count(name));  // the backward hook of the first run saw it too
      const Tensor P = cache2[name], dP = cache2.grad(name);  // (2, H, 6, 6)
      const int64_t per_head = 6 * 6;
      for (int hd = 0; hd < c.n_heads; ++hd) {
        std::vector<roundoff::Bounded> terms;
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t i = 0; i < per_head; ++i) {
            const int64_t at = (b * c.n_heads + hd) * per_head + i;
            terms.push_back(roundoff::exact(dP.data()[at]) * roundoff::exact(P.data()[at]));
          }
        const roundoff::Bounded dg = roundoff::sum(terms);
        // both sides are float32 sums of the same products in different orders: 2x the bound
        BOOST_TEST(std::fabs(m.gates(l).grad().data()[hd] - dg.v) <= 2 * dg.e + 1e-12, name << " head " << hd);
      }
    }
    m.set_gates_require_grad(false);
    // On the unfused path (scores replaced by a graph copy) scores and pattern are graph
    // tensors: the hooks see exactly what retain_grad sees; and the fused path's dL/dS agrees
    // with it within round-off.
    std::map<std::string, Tensor> kept;
    std::map<std::string, Tensor> seen;
    Hooks u;
    u.add_forward(names_ending_with("hook_attn_scores"), [&](const Tensor& s, const std::string& name) {
      kept[name] = add_scalar(s, 0.f);
      kept[name].retain_grad();
      return kept[name];
    });
    u.add_forward(names_ending_with("hook_pattern"), [&](const Tensor& p, const std::string& name) {
      p.retain_grad();
      kept[name] = p;
      return Tensor();
    });
    u.add_backward(all_names(), [&](const Tensor& g, const std::string& name) { seen[name] = g.clone(); });
    m.zero_grad();
    opt.hooks = &u;
    cross_entropy(m.forward(ids(), opt), targets()).backward();
    BOOST_TEST(kept.size() == 2u * c.n_layers);
    for (auto& [name, t] : kept) BOOST_TEST(seen.at(name).to_vector() == t.grad().to_vector(), name);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string name = "blocks." + std::to_string(l) + ".attn.hook_attn_scores";
      const std::vector<float> fused = handed.at(name), unfused = seen.at(name).to_vector();
      float scale = 0;
      for (float x : unfused) scale = std::max(scale, std::fabs(x));
      // two float32 evaluations of a chain of ~T + d_head roundings per element, relative to the
      // largest gradient: 64 u is far above that and far below any real error
      for (size_t i = 0; i < fused.size(); ++i)
        BOOST_TEST(std::fabs(fused[i] - unfused[i]) <= 64 * roundoff::u * scale, name << " element " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_cache_holds_exactly_the_requested_names) {
  TransformerLM m(small(), 2);
  NoGradGuard ng;
  const std::vector<std::string> want = {"blocks.0.attn.hook_pattern", "blocks.1.hook_resid_mid", "hook_embed"};
  auto [logits, cache] = m.run_with_cache(ids(), names_in(want));
  BOOST_TEST(cache.names() == want);  // sorted by name, as asked
  BOOST_TEST(!cache.has_grad("hook_embed"));
  BOOST_CHECK_EXCEPTION(cache["blocks.0.attn.hook_z"], Error, [](const Error& e) {
    return std::string(e.what()) ==
           "activation cache: no 'blocks.0.attn.hook_z' (cached: blocks.0.attn.hook_pattern, blocks.1.hook_resid_mid, hook_embed)";
  });
  auto [l2, every] = m.run_with_cache(ids(), names_ending_with("hook_pattern"));
  BOOST_TEST(every.names() == (std::vector<std::string>{"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}));
}

BOOST_AUTO_TEST_CASE(a_replacement_of_the_wrong_shape_is_refused) {
  TransformerLM m(small(), 2);
  Hooks h;
  h.add_forward("blocks.0.attn.hook_z", [](const Tensor&, const std::string&) { return Tensor::zeros({2, 6, 8}); });
  ForwardOptions opt;
  opt.hooks = &h;
  BOOST_CHECK_EXCEPTION(m.forward(ids(), opt), Error, [](const Error& e) {
    return std::string(e.what()) ==
           "hook at blocks.0.attn.hook_z: the replacement has shape (2,6,8) but the activation is (2,6,4,2)";
  });
}

BOOST_AUTO_TEST_CASE(steering_the_pattern_changes_the_output_as_the_formula_says) {
  // Replace layer 1's pattern by uniform attention over the visible keys: z must then be the
  // running mean of v, which the cache shows.
  TransformerLM m(small(), 4);
  NoGradGuard ng;
  ActivationCache cache;
  Hooks h;
  h.add_forward("blocks.1.attn.hook_pattern", [](const Tensor& p, const std::string&) {
    Tensor u = Tensor::zeros(p.shape());  // (B, H, T, T)
    const int64_t T = p.size(2);
    for (int64_t bh = 0; bh < p.size(0) * p.size(1); ++bh)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) u.data()[(bh * T + i) * T + j] = 1.f / static_cast<float>(i + 1);
    return u;
  });
  h.cache(cache, names_in({"blocks.1.attn.hook_v", "blocks.1.attn.hook_z"}));
  ForwardOptions opt;
  opt.hooks = &h;
  m.forward(ids(), opt);
  const Tensor v = cache["blocks.1.attn.hook_v"], z = cache["blocks.1.attn.hook_z"];  // (2, 6, 4, 2)
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t e = 0; e < 8; ++e) {
        double mean = 0, mag = 0;
        for (int64_t j = 0; j <= i; ++j) {
          mean += v.data()[(b * 6 + j) * 8 + e];
          mag += std::fabs(v.data()[(b * 6 + j) * 8 + e]);
        }
        mean /= static_cast<double>(i + 1);
        // i+1 products with the rounded weight 1/(i+1), summed: gamma(i + 3) sum |terms|
        BOOST_TEST(std::fabs(z.data()[(b * 6 + i) * 8 + e] - mean) <= roundoff::gamma(i + 3.0) * mag / (i + 1) + 1e-30);
      }
}

BOOST_AUTO_TEST_CASE(split_qkv_inputs_give_each_head_its_own_copy) {
  // hook_k_input (B, T, H, d_model): a change to head 1's copy changes head 1's keys, so head 1's
  // pattern, and no other head's (compared with the same per-head path given an equal copy)
  for (const ModelConfig& c : {small(), small(Norm::Post)}) {
    TransformerLM m(c, 21);
    NoGradGuard ng;
    auto patterns = [&](bool change) {
      Hooks h;
      ActivationCache cache;
      h.add_forward("blocks.0.attn.hook_k_input", [change](const Tensor& x, const std::string&) {  // (B, T, H, D)
        BOOST_TEST(x.shape() == Shape({2, 6, 4, 8}));
        Tensor y = x.clone();
        if (change)
          for (int64_t i = 0; i < y.numel(); ++i)
            if ((i / 8) % 4 == 1) y.data()[i] += 0.5f * static_cast<float>(i % 5) - 1.f;
        return y;
      });
      h.cache(cache, name_is("blocks.0.attn.hook_pattern"));
      ForwardOptions opt;
      opt.hooks = &h;
      m.forward(ids(), opt);
      return cache["blocks.0.attn.hook_pattern"].to_vector();  // (B, H, T, T)
    };
    const std::vector<float> same = patterns(false), changed = patterns(true);
    for (int64_t hd = 0; hd < 4; ++hd) {
      bool differs = false, equal = true;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < 36; ++i) {
          const size_t at = static_cast<size_t>((b * 4 + hd) * 36 + i);
          differs = differs || same[at] != changed[at];
          equal = equal && same[at] == changed[at];
        }
      BOOST_TEST((hd == 1 ? differs : equal), "head " << hd);
    }
  }
}

BOOST_AUTO_TEST_CASE(split_qkv_inputs_backward_hooks_see_the_gradient_of_each_copy) {
  // left as they are (the usual projection, tapped) or replaced by an equal copy (each head from
  // its own copy, through autograd): the same gradients, to float32 rounding of sums of d_head terms
  TransformerLM m(small(Norm::Pre, 2), 23);
  for (const char* point : {"blocks.1.attn.hook_q_input", "blocks.0.attn.hook_k_input", "blocks.1.attn.hook_v_input"}) {
    auto gradient = [&](bool replace) {
      Hooks h;
      Tensor g;
      if (replace) h.add_forward(point, [](const Tensor& x, const std::string&) { return add_scalar(x, 0.f); });  // a graph copy
      h.add_backward(point, [&g](const Tensor& grad, const std::string&) { g = grad.clone(); });
      ForwardOptions opt;
      opt.hooks = &h;
      m.zero_grad();
      cross_entropy(m.forward(ids(), opt), targets()).backward();
      BOOST_TEST_REQUIRE(g.defined());
      return g;
    };
    const Tensor tapped = gradient(false), autograd = gradient(true);
    BOOST_TEST(tapped.shape() == autograd.shape());
    const int heads = std::string(point).find("q_input") != std::string::npos ? 4 : 2;  // kv heads for k and v
    BOOST_TEST(tapped.shape() == Shape({2, 6, heads, 8}));
    float scale = 0;
    for (int64_t i = 0; i < autograd.numel(); ++i) scale = std::max(scale, std::fabs(autograd.data()[i]));
    BOOST_TEST(scale > 0.f);
    for (int64_t i = 0; i < autograd.numel(); ++i)
      BOOST_TEST(std::fabs(tapped.data()[i] - autograd.data()[i]) <= 64 * roundoff::u * scale, point << " element " << i);
  }
}

BOOST_AUTO_TEST_CASE(split_qkv_inputs_pass_gradcheck) {
  // each head projected from its own (changed) copy: gradients of the parameters, the input and
  // the change against central differences, self- and cross-attention, with and without GQA
  for (int kv : {0, 1}) {
    Rng r(31), data(32);
    MultiHeadAttention mha(test_attention({.d_model = 8, .heads = 2, .kv_heads = kv, .bias = true}), r);
    const int kv_heads = kv ? kv : 2;
    Tensor xq = Tensor::randn({2, 3, 8}, data).requires_grad_(), xkv = Tensor::randn({2, 4, 8}, data).requires_grad_();
    Tensor dq = Tensor::randn({1, 1, 2, 8}, data).requires_grad_(), dk = Tensor::randn({1, 1, kv_heads, 8}, data).requires_grad_();
    Hooks h;
    h.add_forward("hook_q_input", [&](const Tensor& x, const std::string&) { return add(x, dq); });
    h.add_forward("hook_k_input", [&](const Tensor& x, const std::string&) { return add(x, dk); });
    h.add_forward("hook_v_input", [&](const Tensor& x, const std::string&) { return mul_scalar(x, 1.5f); });
    std::vector<Tensor> inputs = mha.parameters();
    for (const Tensor& t : {xq, xkv, dq, dk}) inputs.push_back(t);
    for (bool self : {false, true}) {
      auto fn = [&](const std::vector<Tensor>&) {
        MultiHeadAttention::Call call;
        call.hooks = &h;
        call.causal = self;
        return mha.forward(xq, self ? Tensor() : xkv, call);
      };
      const GradcheckResult res = gradcheck(fn, inputs);
      BOOST_TEST(res.ok, (self ? "self " : "cross ") << "kv " << kv << ": " << res.message);
    }
  }
}

BOOST_AUTO_TEST_CASE(stop_at_layer_returns_the_residual_stream_there_bit_for_bit) {
  TransformerLM m(small(), 4);
  NoGradGuard ng;
  auto [logits, cache] = m.run_with_cache(ids(), all_names());
  for (int stop = 0; stop <= m.cfg.n_layers; ++stop) {
    ForwardOptions opt;
    opt.stop_at_layer = stop;
    const Tensor resid = m.forward(ids(), opt);  // (B, T, d_model)
    const std::string name = stop < m.cfg.n_layers ? "blocks." + std::to_string(stop) + ".hook_resid_pre"
                                                   : "blocks." + std::to_string(stop - 1) + ".hook_resid_post";
    BOOST_TEST(resid.shape() == cache[name].shape());
    BOOST_TEST(resid.to_vector() == cache[name].to_vector(), name);
  }
  ForwardOptions past;
  past.stop_at_layer = m.cfg.n_layers + 1;
  BOOST_CHECK_EXCEPTION(m.forward(ids(), past), Error, [](const Error& e) {
    return std::string(e.what()) == "model: stop_at_layer 3 is past the model's 2 layers";
  });
}

BOOST_AUTO_TEST_CASE(recorded_forward_stops_early_and_records_what_the_whole_forward_does) {
  TransformerLM m(small(), 5);
  Batch b;
  b.inputs = ids();
  b.targets = targets();
  std::vector<std::string> want = {"blocks.0.attn.hook_pattern", "hook_embed"};  // stops after block 0
  const ActivationCache early = recorded_forward(m, b, names_in(want));
  NoGradGuard ng;
  auto [logits, full] = m.run_with_cache(ids(), all_names());
  BOOST_TEST(early.names() == (std::vector<std::string>{"blocks.0.attn.hook_pattern", "hook_embed"}));
  for (const std::string& n : want) BOOST_TEST(early[n].to_vector() == full[n].to_vector(), n);
  const ActivationCache last = recorded_forward(m, b, name_is("ln_final.hook_normalized"));  // needs the whole forward
  BOOST_TEST(last["ln_final.hook_normalized"].to_vector() == full["ln_final.hook_normalized"].to_vector());
}

// The names every caller builds through models/hooks.h, and TransformerLens's short forms.
BOOST_AUTO_TEST_CASE(hook_names_are_spelled_in_one_place) {
  BOOST_TEST(hook_name(1, "attn.hook_z") == "blocks.1.attn.hook_z");
  BOOST_TEST(attn_hook(12, "pattern") == "blocks.12.attn.hook_pattern");
  BOOST_TEST(hook_layer("blocks.12.attn.hook_z") == 12);
  BOOST_TEST(hook_layer("hook_embed") == -1);
  BOOST_TEST(hook_layer("ln_final.hook_scale") == -1);
  BOOST_TEST(hook_layer("blocks.x.hook_z") == -1);
  BOOST_TEST(in_block_name("blocks.3.ln2.hook_scale") == "ln2.hook_scale");
  BOOST_TEST(in_block_name("hook_embed") == "hook_embed");
  BOOST_TEST(get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern");
  BOOST_TEST(get_act_name("resid_pre", 2) == "blocks.2.hook_resid_pre");
  BOOST_TEST(get_act_name("scale", 0, "ln1") == "blocks.0.ln1.hook_scale");
  BOOST_TEST(get_act_name("scale") == "ln_final.hook_scale");
  BOOST_TEST(get_act_name("post", 1) == "blocks.1.mlp.hook_post");
  BOOST_TEST(get_act_name("pattern0") == "blocks.0.attn.hook_pattern");
  BOOST_TEST(get_act_name("embed") == "hook_embed");
  BOOST_TEST(get_act_name("blocks.0.hook_resid_pre") == "blocks.0.hook_resid_pre");
}

namespace {
// The hook names of docs/hooks.md's table, with `blocks.{l}.` as written. A row names one point
// or several: "`blocks.{l}.attn.hook_k`, `hook_v`" (a bare name: the first one's module) and
// "`blocks.{l}.ln1.hook_scale`, `ln2.hook_scale`" (a dotted name: in the first one's block).
std::set<std::string> documented_hook_names() {
  const std::string doc = read_file(HEADLAB_SOURCE_DIR "/docs/hooks.md");
  std::set<std::string> names;
  size_t at = doc.find("| name | shape | what |");
  BOOST_REQUIRE(at != std::string::npos);
  at = doc.find('\n', doc.find('\n', at) + 1) + 1;  // past the header and its rule
  while (at < doc.size() && doc[at] == '|') {
    const size_t end = doc.find('\n', at);
    const std::string first = doc.substr(at + 1, doc.find('|', at + 1) - at - 1);  // the name cell
    std::string lead;
    for (size_t q = first.find('`'); q != std::string::npos; q = first.find('`', first.find('`', q + 1) + 1)) {
      const std::string n = first.substr(q + 1, first.find('`', q + 1) - q - 1);
      if (lead.empty()) lead = n, names.insert(n);
      else if (n.find('.') == std::string::npos) names.insert(lead.substr(0, lead.rfind('.') + 1) + n);
      else names.insert((lead.starts_with("blocks.{l}.") ? std::string("blocks.{l}.") : std::string()) + n);
    }
    at = end + 1;
  }
  return names;
}
// A model's hook names with layer 0's as `blocks.{l}.` (the later layers repeat them).
std::set<std::string> model_hook_names(const ModelConfig& c) {
  std::set<std::string> names;
  for (const HookPointInfo& p : describe_hook_points(c)) {
    const int layer = hook_layer(p.name);
    if (layer < 0) names.insert(p.name);
    else if (layer == 0) names.insert("blocks.{l}." + in_block_name(p.name));
  }
  return names;
}
}  // namespace

// docs/hooks.md's table is the model's list: a point the model makes and the table leaves out,
// or a row no configuration makes, fails. Configurations with hook points of their own go in
// `configs`.
BOOST_AUTO_TEST_CASE(the_hook_table_in_the_docs_is_the_models) {
  const std::set<std::string> documented = documented_hook_names();
  const std::vector<ModelConfig> configs = {small()};
  std::set<std::string> made;
  for (const ModelConfig& c : configs) {
    const std::set<std::string> here = model_hook_names(c);
    for (const std::string& n : here) BOOST_TEST(documented.count(n) == 1u, "docs/hooks.md has no row for " << n);
    made.insert(here.begin(), here.end());
  }
  for (const std::string& n : documented) BOOST_TEST(made.count(n) == 1u, "docs/hooks.md lists " << n << ", which no model makes");
  BOOST_TEST(documented.size() > 20u);
}
