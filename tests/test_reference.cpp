// headlab against PyTorch, in every test run and without PyTorch: tests/data/reference_gpt.safetensors
// holds what PyTorch computed for a small GPT (scripts/make_reference.py): the loss, logits,
// every gradient, the attention maps, and the held-out loss after each of 20 AdamW steps with
// clipping and the warmup + cosine schedule.
#define BOOST_TEST_MODULE reference
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "lib/optim.h"
#include "models/checkpoint.h"
#include "tests/reference_model.h"

using namespace hl;
using json = nlohmann::json;

namespace {

const SafetensorsFile& file() {
  static const SafetensorsFile f = read_safetensors(HEADLAB_SOURCE_DIR "/tests/data/reference_gpt.safetensors");
  return f;
}

// The model with the file's initial weights (the file also holds the reference tensors, so it
// is read tensor by tensor rather than as a checkpoint).
std::unique_ptr<TransformerLM> reference_model() {
  auto m = std::make_unique<TransformerLM>(checkpoint_config(file()), 0);
  for (auto& [name, t] : m->named_parameters()) {
    const Shape s = t.shape();
    t.copy_from(file().f32(name, &s));
  }
  return m;
}

// The mean cross-entropy over counted targets from float64 logits with round-off bounds:
// -(1/n) sum (z_y - m - log sum exp(z - m)), as headlab's fused log-softmax + NLL.
roundoff::Bounded bounded_loss(const roundoff::Mat& logits, const Ids& targets) {
  using namespace roundoff;
  std::vector<Bounded> per_row;
  for (int64_t r = 0; r < logits.rows; ++r) {
    const int32_t y = targets.data[static_cast<size_t>(r)];
    if (y < 0) continue;
    Bounded m = logits(r, 0);
    for (int64_t c = 1; c < logits.cols; ++c)
      if (logits(r, c).v > m.v) m = logits(r, c);
    std::vector<Bounded> e;
    for (int64_t c = 0; c < logits.cols; ++c) e.push_back(exp(logits(r, c) - m));
    per_row.push_back(logits(r, y) - m - log(sum(e)));
  }
  return -(sum(per_row) / exact(static_cast<double>(per_row.size())));
}

// Largest |a - b| / scale over a tensor.
double worst(const Tensor& a, const Tensor& b, double scale) {
  double w = 0;
  for (int64_t i = 0; i < a.numel(); ++i) w = std::max(w, std::fabs(double(a.data()[i]) - b.data()[i]) / scale);
  return w;
}
double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(double(t.data()[i])));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(forward_backward_and_attention_match_pytorch) {
  set_num_threads(2);
  auto m = reference_model();
  const Ids ids = file().ids("input_ids"), targets = file().ids("targets");
  auto [logits, cache] = m->run_with_cache(ids, names_ending_with("hook_pattern"));
  Tensor loss = cross_entropy(logits, targets);
  loss.backward();

  // Logits and loss: headlab's and PyTorch's float32 values must both lie within the round-off
  // bound of one float64 evaluation (tests/roundoff.h), which holds for any summation order.
  const roundoff::Mat ref = roundoff::bounded_logits(*m, ids);
  roundoff::check_within(logits, ref, "headlab logits");
  roundoff::check_within(file().f32("ref.logits"), ref, "PyTorch logits");
  const roundoff::Bounded L = bounded_loss(ref, targets);
  BOOST_TEST(std::fabs(loss.item() - L.v) <= L.e, "headlab loss " << loss.item() << " vs " << L.v << " +- " << L.e);
  BOOST_TEST(std::fabs(file().f32("ref.loss").item() - L.v) <= L.e, "PyTorch loss vs " << L.v << " +- " << L.e);

  // Gradients. Each element is a sum over the B*T = 68 tokens of products carried back through
  // the blocks; along any path there are at most K = layers (d_model + d_ff + T) + vocab + B*T
  // = 307 roundings, each adding u relative to the terms it sums. To first order both float32
  // results are within K u sum|terms| of the exact value, and sum|terms| is of the order of the
  // model's largest gradient (sums of random-sign terms; the W_K biases, whose true gradient is 0,
  // are pure round-off of terms of that size). So |headlab - PyTorch| <= 2 K u max|grad| per
  // element. Measured: about 60 times below it; a sign or index error in any backward is O(1).
  const ModelConfig& c = m->cfg;
  const double K = c.n_layers * (c.d_model + c.d_ff + c.max_seq_len) + c.vocab_size + ids.numel();
  double scale = 0;
  for (auto& [name, p] : m->named_parameters()) scale = std::max(scale, max_abs(file().f32("ref.grad." + name)));
  for (auto& [name, p] : m->named_parameters()) {
    const double w = worst(p.grad(), file().f32("ref.grad." + name), 2 * K * roundoff::u * scale);
    BOOST_TEST_MESSAGE("gradient " << name << ": " << w << " of the bound");
    BOOST_TEST(w <= 1.0, name << ": " << w << "x the bound");
  }
  // Patterns: softmax weights in [0, 1]; their scores carry the same kind of bound with
  // K = d_model + d_head roundings through ln1 and the projections.
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string name = "blocks." + std::to_string(l) + ".attn.hook_pattern";
    const double bound = 2 * (c.d_model + c.head_dim() + c.max_seq_len) * roundoff::u * (l + 1) * 8;
    const double w = worst(cache[name], file().f32("ref.attn." + std::to_string(l)), bound);
    BOOST_TEST_MESSAGE(name << ": " << w << " of the bound");
    BOOST_TEST(w <= 1.0, name << ": " << w << "x the bound");
  }
}

BOOST_AUTO_TEST_CASE(twenty_adamw_steps_follow_pytorch) {
  set_num_threads(2);
  auto m = reference_model();
  const json hp = json::parse(file().meta("reference"));
  std::vector<NamedParam> params;  // as the trainer: no weight decay on biases, norms, embeddings
  for (auto& [name, t] : m->named_parameters())
    params.push_back({name, t, t.ndim() >= 2 && name.find("emb") == std::string::npos});
  Adam opt(params, hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"], /*decoupled=*/true);
  const LrSchedule sched{parse_schedule(hp["schedule"]), hp["lr"], hp["warmup"], hp["total"], hp["min_lr_ratio"]};
  const Ids all_ids = file().ids("train.input_ids"), all_targets = file().ids("train.targets");  // (20, B, T)
  const int64_t steps = all_ids.shape[0], B = all_ids.shape[1], T = all_ids.shape[2];
  const Ids held_ids = file().ids("heldout.input_ids"), held_targets = file().ids("heldout.targets");
  const std::vector<float> ref = file().f32("ref.heldout_loss").to_vector();
  BOOST_TEST_REQUIRE(ref.size() == static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    auto slice_of = [&](const Ids& a) {
      return Ids(Shape{B, T}, std::vector<int32_t>(a.data.begin() + s * B * T, a.data.begin() + (s + 1) * B * T));
    };
    opt.lr = sched.at(s);
    Tensor loss = cross_entropy(m->forward(slice_of(all_ids)), slice_of(all_targets));
    loss.backward();
    clip_grad_norm(opt.params(), hp["clip"]);
    opt.step();
    opt.zero_grad();
    NoGradGuard ng;
    const float held = cross_entropy(m->forward(held_ids), held_targets).item();
    // Adam normalises each update to about lr per element, so a relative gradient difference d
    // moves a weight by about lr d per step, and where a gradient is pure round-off (W_K biases)
    // by up to lr, but there the loss does not depend on the weight. Over k steps the weights
    // then differ by k lr d, and the loss by about k lr d |dL/dw|_1: with d ~ 1e-5 (above), lr
    // 3e-3 and |dL/dw|_1 ~ 30 here, under 1e-8 k; the bound 1e-5 (1 + k) relative leaves room
    // for the loss's own round-off and for growth through the steps. A wrong bias correction,
    // eps, decay group or schedule step changes the loss by 1e-4 or more within a few steps.
    const double tol = 1e-5 * (1 + s) * std::fabs(ref[s]);
    BOOST_TEST_MESSAGE("step " << s + 1 << ": held-out loss differs by " << std::fabs(held - ref[s]) / tol << " of the bound");
    BOOST_TEST(std::fabs(held - ref[s]) <= tol, "step " << s + 1 << ": held-out loss " << held << " vs PyTorch " << ref[s]);
  }
  // And the weights after 20 steps: by the argument above they differ by about k lr d ~ 1e-6,
  // bounded here by 1e-4 of each tensor's scale (measured: 1e-5; decaying the biases and norms
  // too, a shrink of 6e-4, fails it). The W_K biases
  // are the exception the argument names: their gradient is round-off, so each side moves them
  // by up to |m/sqrt(v)| lr <= 4 lr per step in its own direction.
  double lr_sum = 0;
  for (int64_t s = 0; s < steps; ++s) lr_sum += sched.at(s);
  for (auto& [name, p] : m->named_parameters()) {
    const Tensor want = file().f32("ref.final." + name);
    const bool round_off_gradient = name.find("W_K.bias") != std::string::npos;
    const double bound = round_off_gradient ? 2 * 4 * lr_sum : 1e-4 * std::max(max_abs(want), 1e-2);
    const double w = worst(p, want, bound);
    BOOST_TEST_MESSAGE(name << " after 20 steps: " << w << " of the bound");
    BOOST_TEST(w <= 1.0, name << " after 20 steps: " << w << "x the bound");
  }
}
