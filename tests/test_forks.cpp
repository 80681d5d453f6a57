// Counterfactual forks (train/interventions.h, Trainer with fork_from): a fork with no
// intervention is the original run bit for bit; a gated head's output and gradients are zero; a
// frozen head's weights never change; a re-initialised head is redrawn with its moments reset;
// bad input is refused with one message.
#define BOOST_TEST_MODULE forks
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/checkpoint.h"
#include "train/interventions.h"
#include "train/snapshots.h"
#include "train/trainer.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// 2 layers x 2 heads on a 4-token copy task, 40 steps with dropout (its RNG must carry over).
TrainArgs small_args(const std::string& out) {
  TrainArgs a;
  a.model.d_model = 16;
  a.model.n_layers = 2;
  a.model.n_heads = 2;
  a.model.d_ff = 32;
  a.model.attn_bias = true;  // the heads' bias slices are part of what freeze keeps
  a.task = TaskConfig::preset("copy");
  a.task.alphabet = 5;
  a.task.min_len = a.task.max_len = 4;
  a.batch = 16;
  a.steps = 40;
  a.eval_every = 10;
  a.checkpoint_every = 20;
  a.eval_size = 32;
  a.warmup = 5;
  a.model.dropout = 0.1f;
  a.out = out;
  return a;
}

// The original run, with a snapshot (its full training state) at step 20.
struct Original {
  std::string dir, state;
};
const Original& original() {
  static const Original o = [] {
    Original r{fresh_dir("fork-original"), ""};
    TrainArgs a = small_args(r.dir);
    a.snapshot_at = {20};
    Trainer t(a);
    write_summary(a.out, t.args(), t.run());
    r.state = snapshot_path(r.dir, 20);
    return r;
  }();
  return o;
}

TrainArgs fork_of(const std::string& out, std::vector<std::string> gate = {}, std::vector<std::string> freeze = {},
                  std::vector<std::string> reinit = {}) {
  TrainArgs given;
  given.out = out;
  given.gate_heads = std::move(gate), given.freeze_heads = std::move(freeze), given.reinit_heads = std::move(reinit);
  return fork_args(original().state, given, [](const std::string&) { return false; });
}

std::vector<std::string> metrics_without_time(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    j.erase("wall_s");
    j.erase("tokens_per_s");
    out.push_back(j.dump());
  }
  return out;
}

std::vector<float> values(const Tensor& t) { return t.to_vector(); }

}  // namespace

BOOST_AUTO_TEST_CASE(fork_without_intervention_is_the_original_bit_for_bit) {
  const std::string dir = fresh_dir("fork-plain");
  TrainResult r;
  {
    Trainer t(fork_of(dir));
    r = t.run();
    write_summary(dir, t.args(), r);
  }
  const SafetensorsFile a = read_safetensors(original().dir + "/model.safetensors"), b = read_safetensors(dir + "/model.safetensors");
  for (const auto& [name, _] : a.tensors) BOOST_TEST(values(a.f32(name)) == values(b.f32(name)), name);
  // the same metrics at every eval: the original's up to the fork, the fork's own after it
  BOOST_TEST(metrics_without_time(dir) == metrics_without_time(original().dir), boost::test_tools::per_element());
  BOOST_TEST(metrics_without_time(dir).size() == 4u);
  const json s = json::parse(read_file(dir + "/summary.json")), so = json::parse(read_file(original().dir + "/summary.json"));
  BOOST_TEST(s.at("final") == so.at("final"));
  BOOST_TEST(s.at("config").at("fork_from").get<std::string>() == original().state);
}

BOOST_AUTO_TEST_CASE(gated_head_has_zero_output_and_zero_gradients) {
  const std::string dir = fresh_dir("fork-gate");
  TrainArgs a = fork_of(dir, {"1.0=0"});
  Trainer t(a);
  bool checked = false;
  TrainObserver obs;
  obs.on_gradients = [&](int64_t step, TransformerLM& m) {
    if (step != 21) return;
    for (const HeadSlice& s : head_slices(m, 1, 0)) {
      const Tensor g = s.param.grad();
      BOOST_TEST_REQUIRE(g.defined());
      double worst = 0;
      for (int64_t k : s.indices) worst = std::max(worst, std::fabs(static_cast<double>(g.data()[k])));
      BOOST_TEST(worst == 0.0, s.name);
    }
    // the other head of the layer does learn
    double other = 0;
    for (const HeadSlice& s : head_slices(m, 1, 1))
      for (int64_t k : s.indices) other += std::fabs(static_cast<double>(s.param.grad().data()[k]));
    BOOST_TEST(other > 0);
    checked = true;
  };
  t.run(obs);
  BOOST_TEST(checked);
  BOOST_TEST(t.model().gates(1).data()[0] == 0.f);
  BOOST_TEST(t.model().gates(1).data()[1] == 1.f);
  const Batch b = t.held_out()[0];
  auto [logits, cache] = t.model().run_with_cache(b.inputs, names_ending_with("hook_z"));
  const Tensor z = cache["blocks.1.attn.hook_z"];  // (B, T, H, d_head)
  const int64_t dh = a.model.head_dim(), H = 2;
  double zero_head = 0, live_head = 0;
  for (int64_t i = 0; i < z.numel(); ++i) ((i / dh) % H == 0 ? zero_head : live_head) += std::fabs(static_cast<double>(z.data()[i]));
  BOOST_TEST(zero_head == 0.0);
  BOOST_TEST(live_head > 0.0);
}

BOOST_AUTO_TEST_CASE(frozen_head_keeps_its_weights_exactly_and_resumes_frozen) {
  const std::string dir = fresh_dir("fork-freeze");
  TrainArgs a = fork_of(dir, {}, {"0.1"});
  a.steps = 40;
  std::vector<std::vector<float>> at_fork;
  {
    Trainer t(a);
    // the values at the fork: those of the original's state file
    const std::unique_ptr<TransformerLM> m = load_model(original().state);
    for (const HeadSlice& s : head_slices(*m, 0, 1)) {
      std::vector<float> v;
      for (int64_t k : s.indices) v.push_back(s.param.data()[k]);
      at_fork.push_back(v);
    }
    write_summary(dir, t.args(), t.run());
    size_t i = 0;
    for (const HeadSlice& s : head_slices(t.model(), 0, 1)) {
      std::vector<float> v;
      for (int64_t k : s.indices) v.push_back(s.param.data()[k]);
      BOOST_TEST(v == at_fork[i++], s.name);  // bit for bit, despite AdamW's moments and weight decay
    }
    // and the rest of the model did train: head 0 of layer 0 moved
    const std::unique_ptr<TransformerLM> m0 = load_model(original().state);
    BOOST_TEST(values(t.model().blocks[0]->attn.W_Q.weight) != values(m0->blocks[0]->attn.W_Q.weight));
  }
  // resumed with more steps, the stored freeze still holds
  TrainArgs more;
  more.steps = 50;
  TrainArgs r = resume_args(dir, more, [](const std::string& f) { return f == "--steps"; });
  BOOST_TEST(r.freeze_heads == std::vector<std::string>{"0.1"}, boost::test_tools::per_element());
  Trainer t2(r);
  t2.run();
  size_t i = 0;
  for (const HeadSlice& s : head_slices(t2.model(), 0, 1)) {
    std::vector<float> v;
    for (int64_t k : s.indices) v.push_back(s.param.data()[k]);
    BOOST_TEST(v == at_fork[i++], s.name);
  }
}

BOOST_AUTO_TEST_CASE(reinit_redraws_the_head_and_resets_its_moments) {
  const std::string dir = fresh_dir("fork-reinit");
  TrainArgs a = fork_of(dir, {}, {}, {"1.1"});
  a.steps = 20;  // the fork's first state is the snapshot's step: nothing trained after it
  Trainer t(a);
  t.run();
  const std::unique_ptr<TransformerLM> m0 = load_model(original().state);
  // W_Q rows of head 1: new values, of the initialiser's scale (std 0.02)
  const std::vector<HeadSlice> now = head_slices(t.model(), 1, 1), before = head_slices(*m0, 1, 1);
  double ss = 0;
  int changed = 0;
  for (size_t k = 0; k < now[0].indices.size(); ++k) {
    const float v = now[0].param.data()[now[0].indices[k]];
    ss += static_cast<double>(v) * v;
    changed += v != before[0].param.data()[before[0].indices[k]];
  }
  BOOST_TEST(changed == static_cast<int>(now[0].indices.size()));
  const double sd = std::sqrt(ss / static_cast<double>(now[0].indices.size()));
  BOOST_TEST(sd > 0.015);  // 128 draws of N(0, 0.02^2): the sample sd is within 0.02 +- 25%
  BOOST_TEST(sd < 0.025);
  // biases start at zero, and the optimizer's moments of the head are zero
  for (const HeadSlice& s : now)
    if (s.param.ndim() == 1)
      for (int64_t k : s.indices) BOOST_TEST(s.param.data()[k] == 0.f);
  for (const auto& [name, st] : t.optimizer().state())
    for (const HeadSlice& s : now)
      if (st.defined() && name.size() > s.name.size() && name.compare(name.size() - s.name.size(), s.name.size(), s.name) == 0)
        for (int64_t k : s.indices) BOOST_TEST(st.data()[k] == 0.f);
  // the other head of the layer is untouched
  const std::vector<HeadSlice> other = head_slices(t.model(), 1, 0), other0 = head_slices(*m0, 1, 0);
  for (size_t k = 0; k < other[0].indices.size(); ++k)
    BOOST_TEST(other[0].param.data()[other[0].indices[k]] == other0[0].param.data()[other0[0].indices[k]]);
}

BOOST_AUTO_TEST_CASE(a_run_begun_from_init_weights_forks_from_its_snapshot) {
  const std::string dir = fresh_dir("fork-init-original"), fork = fresh_dir("fork-init-fork");
  TrainArgs a = small_args(dir);
  a.init = original().dir + "/model.safetensors";
  a.steps = 20;
  a.snapshot_at = {10};
  {
    Trainer t(a);
    t.run();
  }
  TrainArgs given;
  given.out = fork;
  Trainer f(fork_args(snapshot_path(dir, 10), given, [](const std::string&) { return false; }));
  f.run();
  const SafetensorsFile x = read_safetensors(dir + "/model.safetensors"), y = read_safetensors(fork + "/model.safetensors");
  for (const auto& [name, _] : x.tensors) BOOST_TEST(values(x.f32(name)) == values(y.f32(name)), name);
}

BOOST_AUTO_TEST_CASE(bad_forks_are_refused_with_one_message) {
  const std::string dir = fresh_dir("fork-bad");
  TrainArgs given;
  given.out = dir;
  auto none = [](const std::string&) { return false; };
  BOOST_TEST(error_of([&] { fork_args(original().dir + "/snapshots/step_00000030.safetensors", given, none); })
                 .find("no training state at") != std::string::npos);
  BOOST_TEST(error_of([&] { require_snapshot(original().dir, 30); }).find("has no snapshot at step 30; it has 20") != std::string::npos);
  BOOST_TEST(error_of([&] { fork_args(original().dir + "/model.safetensors", given, none); }).find("holds no training state") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { Trainer t(fork_of(dir, {"2.0=0"})); }).find("--gate 2.0=0: layer 2 is outside 0..1") != std::string::npos);
  BOOST_TEST(error_of([&] { Trainer t(fork_of(dir, {}, {"0.2"})); }).find("--freeze 0.2: head 2 is outside 0..1") != std::string::npos);
  BOOST_TEST(error_of([&] { Trainer t(fork_of(dir, {"0.1"})); }).find("expected LAYER.HEAD=VALUE") != std::string::npos);
  BOOST_TEST(error_of([&] { Trainer t(fork_of(dir, {"0.1=x"})); }).find("finite number") != std::string::npos);
  BOOST_TEST(error_of([&] { Trainer t(fork_of(dir, {}, {}, {"0.1", "0.1"})); }).find("given twice") != std::string::npos);
  // a different model is not a fork of this run
  TrainArgs wide = given;
  wide.model.d_model = 32;
  BOOST_TEST(error_of([&] { fork_args(original().state, wide, [](const std::string& f) { return f == "--d-model"; }); })
                 .find("--d-model 32 does not match") != std::string::npos);
  // into the run it forks
  TrainArgs same = fork_of(original().dir);
  BOOST_TEST(error_of([&] { Trainer t(same); }).find("needs a directory of its own") != std::string::npos);
  // interventions without a fork
  TrainArgs plain = small_args(dir);
  plain.freeze_heads = {"0.0"};
  BOOST_TEST(error_of([&] { plain.validate(); }).find("apply to a fork") != std::string::npos);
  BOOST_TEST(!fs::exists(dir + "/checkpoint.safetensors"));  // nothing half-written
}
