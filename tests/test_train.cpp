// Copy-task data, the training loop (learning, exact resume, determinism, non-finite stop),
// and the grads command against in-process autograd.
#define BOOST_TEST_MODULE train
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "cli/alloc_counter.h"
#include "train/settings.h"
#include "models/checkpoint.h"
#include "train/over_training.h"
#include "train/run_dir.h"
#include "train/snapshots.h"
#include "train/trainer.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
TrainArgs small_args(const std::string& out) {
  TrainArgs a;
  a.model.d_model = 32;
  a.model.n_layers = 2;
  a.model.n_heads = 2;
  a.model.d_ff = 64;
  a.task = TaskConfig::preset("copy");
  a.task.alphabet = 5;
  a.task.min_len = a.task.max_len = 4;
  a.batch = 32;
  a.steps = 40;
  a.eval_every = 10;
  a.checkpoint_every = 20;
  a.eval_size = 64;
  a.warmup = 5;
  a.model.dropout = 0.1f;  // exercises the dropout RNG in resume
  a.out = out;
  return a;
}
// metrics.jsonl without the wall-clock fields.
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
}  // namespace

BOOST_AUTO_TEST_CASE(copy_layout_and_targets) {
  TaskConfig c = TaskConfig::preset("copy");
  c.alphabet = 5;
  c.min_len = c.max_len = 3;
  CopyTask task(c);
  BOOST_TEST(task.vocab_size() == 8);
  BOOST_TEST(task.seq_len() == 7);
  Batch b = task.make({{1, 2, 3}});
  const int BOS = 6, SEP = 7;
  BOOST_TEST(b.inputs.data == (std::vector<int32_t>{BOS, 1, 2, 3, SEP, 1, 2}));
  BOOST_TEST(b.targets.data == (std::vector<int32_t>{-1, -1, -1, -1, 1, 2, 3}));
  BOOST_TEST(!b.key_padding.defined());
  TaskConfig r = c;
  r.reverse = true;
  Batch rb = CopyTask(r).make({{1, 2, 3}});
  BOOST_TEST(rb.inputs.data == (std::vector<int32_t>{BOS, 1, 2, 3, SEP, 3, 2}));
  BOOST_TEST(rb.targets.data == (std::vector<int32_t>{-1, -1, -1, -1, 3, 2, 1}));
}

BOOST_AUTO_TEST_CASE(variable_length_padding_and_mask) {
  TaskConfig c = TaskConfig::preset("varcopy");
  BOOST_TEST(c.alphabet == 64);
  CopyTask task(c);
  BOOST_TEST(task.vocab_size() == 67);
  BOOST_TEST(task.seq_len() == 33);  // padded to 34 tokens, input is all but the last
  Batch b = task.make({{5, 9}, std::vector<int32_t>(16, 1)});
  const int PAD = 64, BOS = 65, SEP = 66;
  // row 0: BOS 5 9 SEP 5 9 PAD...
  BOOST_TEST(b.inputs.at(0, 0) == BOS);
  BOOST_TEST(b.inputs.at(0, 3) == SEP);
  BOOST_TEST(b.inputs.at(0, 5) == 9);
  BOOST_TEST(b.inputs.at(0, 6) == PAD);
  int counted = 0;
  for (int t = 0; t < 33; ++t) counted += b.targets.at(0, t) >= 0;
  BOOST_TEST(counted == 2);
  BOOST_TEST(b.targets.at(0, 3) == 5);
  BOOST_TEST(b.targets.at(0, 4) == 9);
  BOOST_TEST(b.targets.at(0, 5) == -1);  // predicting PAD does not count
  BOOST_TEST(b.key_padding.at({0, 6}) == 1.f);
  BOOST_TEST(b.key_padding.at({0, 5}) == 0.f);
  BOOST_TEST(b.key_padding.at({1, 32}) == 0.f);  // the full-length row has no padding
  Rng rng(1);
  Batch s = task.sample(200, rng);
  int lo = 99, hi = 0;
  for (int p : s.prompt_len) lo = std::min(lo, p - 2), hi = std::max(hi, p - 2);  // prompt [BOS, x, SEP]
  BOOST_TEST(lo == 1);
  BOOST_TEST(hi == 16);
}

BOOST_AUTO_TEST_CASE(sample_into_equals_sample_and_reuses_buffers) {
  CopyTask task(TaskConfig::preset("varcopy"));
  Rng a(3), b(3);
  Batch reused;
  for (int i = 0; i < 3; ++i) {
    const Batch fresh = task.sample(16, a);
    task.sample_into(reused, 16, b);
    BOOST_TEST(reused.inputs.data == fresh.inputs.data);
    BOOST_TEST(reused.targets.data == fresh.targets.data);
    BOOST_TEST(reused.prompt_len == fresh.prompt_len);
    BOOST_TEST(reused.key_padding.to_vector() == fresh.key_padding.to_vector());
  }
}

BOOST_AUTO_TEST_CASE(a_training_step_allocates_nothing_in_its_steady_state) {
  if (!alloc_counter::available()) return;  // sanitizer builds intercept malloc themselves
  // the small model and the head counts of the varcopy studies: d_head 16, 8, 4 and 2 (with 34
  // keys OpenBLAS's SkylakeX kernels would malloc in every P V product of d_head 8 or less)
  for (int heads : {2, 4, 8, 16}) {
    BOOST_TEST_CONTEXT("heads " << heads) {
      TrainArgs a = small_args("");
      a.model.n_heads = heads;
      a.task = TaskConfig::preset("varcopy");  // padding masks included
      a.model.dropout = 0.1f;
      Trainer t(a);
      std::vector<NamedParam> params;
      for (auto& [name, p] : t.model().named_parameters()) params.push_back({name, p, true});
      Adam opt(params, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true);
      // Rows are computed up to their last target, so batches differ in size: the pool keeps
      // buffers of every size class a step needed, and a step of sizes seen before (here the
      // same draws again) allocates nothing.
      std::vector<Batch> draws(20);
      Rng rng(1);
      for (Batch& b : draws) t.task().sample_into(b, 16, rng);
      for (int i = 0; i < 40; ++i) train_step(t.model(), opt, draws[i % 20], 1.f);
      const uint64_t before = alloc_counter::count();
      for (int i = 0; i < 20; ++i) train_step(t.model(), opt, draws[i], 1.f);
      BOOST_TEST(alloc_counter::count() - before == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(held_out_is_fixed_and_seeded) {
  CopyTask task(TaskConfig::preset("copy"));
  auto a = task.held_out(100, 7, 30), b = task.held_out(100, 7, 30), c = task.held_out(100, 8, 30);
  BOOST_TEST(a.size() == 4u);
  BOOST_TEST(a[3].size() == 10);
  BOOST_TEST(a[0].inputs.data == b[0].inputs.data);
  BOOST_TEST(a[0].inputs.data != c[0].inputs.data);
}

BOOST_AUTO_TEST_CASE(tiny_copy_run_learns) {
  // (how fast is a benchmark's question, `headlab bench`: a timed test fails on a busy machine)
  TrainArgs a = small_args("");
  a.model.dropout = 0.f;
  a.steps = 300;
  a.eval_every = 300;
  a.lr = 3e-3f;
  Trainer t(a);
  TrainResult r = t.run();
  BOOST_TEST(r.final_eval.loss < 0.05);  // chance level is log(5) = 1.61
  BOOST_TEST(r.final_eval.token_acc > 0.99);
  BOOST_TEST(r.final_eval.ar_exact_match > 0.9);
}

// Greedy exact match as evaluation reports it (from the teacher-forced predictions where a
// row's answer is its own next inputs, decoded otherwise) against decoding every row.
BOOST_AUTO_TEST_CASE(greedy_exact_match_equals_decoding) {
  TrainArgs a = small_args("");
  a.task = TaskConfig::preset("varcopy");
  a.task.alphabet = 8;
  a.task.max_len = 8;
  a.model.dropout = 0.f;
  a.steps = 120;  // partly trained: some rows right, some wrong
  a.eval_every = 120;
  a.eval_size = 256;
  Trainer t(a);
  t.run();
  TransformerLM& model = t.model();
  const std::vector<Batch>& data = t.held_out();
  auto decoded_fraction = [&](const std::vector<Batch>& batches) {
    const auto answers = greedy_answers(model, batches);
    int64_t right = 0, rows = 0;
    for (size_t i = 0; i < batches.size(); ++i)
      for (int64_t r = 0; r < batches[i].size(); ++r, ++rows)
        right += answers[i][static_cast<size_t>(r)] == t.task().answer(batches[i], r);
    return static_cast<double>(right) / static_cast<double>(rows);
  };
  const EvalResult e = evaluate(model, t.task(), data, true);
  const double decoded = decoded_fraction(data);
  BOOST_TEST(e.ar_exact_match == decoded);
  BOOST_TEST(e.ar_exact_match == e.exact_match);
  BOOST_TEST(decoded > 0.1);
  BOOST_TEST(decoded < 0.9);
  // the first answer input of every row replaced: the teacher-forced predictions after it no
  // longer show what greedy decoding does, so evaluation decodes; the greedy answers are the same
  // (same prompts, same targets)
  std::vector<Batch> changed = data;
  for (Batch& b : changed)
    for (int64_t r = 0; r < b.size(); ++r) {
      int32_t& x = b.inputs.at(r, b.prompt_len[r]);
      if (b.targets.at(r, b.prompt_len[r]) >= 0) x = (x + 1) % a.task.alphabet;
    }
  const EvalResult c = evaluate(model, t.task(), changed, true);
  BOOST_TEST(c.ar_exact_match == decoded);
  BOOST_TEST(c.exact_match < decoded);
  BOOST_TEST_MESSAGE("greedy exact match " << decoded << ", teacher-forced on the changed inputs " << c.exact_match);
}

BOOST_AUTO_TEST_CASE(same_seed_same_metrics_and_resume_equals_uninterrupted) {
  const std::string full = fresh_dir("full"), again = fresh_dir("again"), cut = fresh_dir("cut");
  Trainer(small_args(full)).run();
  Trainer(small_args(again)).run();
  BOOST_TEST(metrics_without_time(full) == metrics_without_time(again), boost::test_tools::per_element());
  BOOST_TEST(metrics_without_time(full).size() == 4u);
  {  // "crash" at step 25: after the step-20 checkpoint and the step-20 eval
    Trainer t(small_args(cut));
    TrainObserver obs;
    obs.on_step = [](int64_t step, int64_t, float, double) {
      if (step == 25) throw std::runtime_error("simulated crash");
    };
    BOOST_CHECK_THROW(t.run(obs), std::runtime_error);
  }
  TrainArgs r = small_args(cut);
  r.resume = true;
  Trainer(r).run();
  BOOST_TEST(metrics_without_time(full) == metrics_without_time(cut), boost::test_tools::per_element());
  // the final models are identical bit for bit
  auto m1 = read_safetensors(full + "/model.safetensors"), m2 = read_safetensors(cut + "/model.safetensors");
  for (auto& [name, t] : m1.tensors) BOOST_TEST(t.bytes == m2.get(name).bytes);
}

BOOST_AUTO_TEST_CASE(resume_rejects_a_different_model) {
  const std::string dir = fresh_dir("mismatch");
  TrainArgs a = small_args(dir);
  a.steps = 20;
  Trainer(a).run();
  TrainArgs b = small_args(dir);
  b.model.d_ff = 48;
  b.resume = true;
  BOOST_CHECK_EXCEPTION(Trainer(b).run(), Error, [](const Error& e) {
    return std::string(e.what()).find("checkpoint config does not match the flags: d_ff is 64 in the checkpoint but 48") !=
           std::string::npos;
  });
  TrainArgs c = small_args(dir);  // without --resume an existing run is never overwritten
  BOOST_CHECK_EXCEPTION(Trainer{c}, Error, [](const Error& e) {
    return std::string(e.what()).find("already holds a run") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(non_finite_loss_stops_and_keeps_the_checkpoint) {
  const std::string dir = fresh_dir("nan");
  TrainArgs a = small_args(dir);
  a.model.dropout = 0.f;
  a.steps = 40;
  a.checkpoint_every = 5;
  a.clip = 0.f;
  Trainer t(a);
  TrainObserver obs;  // poison the weights after step 12: the next loss is NaN
  obs.on_step = [&](int64_t step, int64_t, float, double) {
    if (step == 12) t.model().head.weight.data()[0] = std::numeric_limits<float>::quiet_NaN();
  };
  BOOST_CHECK_EXCEPTION(t.run(obs), NonFiniteError, [](const NonFiniteError& e) {
    return std::string(e.what()).find("step 13: parameter head.weight is no longer finite; stopping without saving it "
                                      "(the last good checkpoint, step 10, is intact") == 0;
  });
  auto f = read_safetensors(dir + "/checkpoint.safetensors");
  BOOST_TEST(json::parse(f.meta("train_state"))["step"] == 10);
  for (float v : f.f32("head.weight").to_vector()) BOOST_TEST(std::isfinite(v));
  // A checkpoint is never written with non-finite weights, even when the loss is finite
  // (here the weights break between the step and the checkpoint at step 15).
  const std::string dir_w = fresh_dir("nan-weights");
  TrainArgs w = small_args(dir_w);
  w.steps = 20;
  w.checkpoint_every = 5;
  Trainer tw(w);
  TrainObserver obs_w;
  obs_w.on_step = [&](int64_t step, int64_t, float, double) {
    if (step == 15) tw.model().blocks[0]->ffn->fc1.weight.data()[0] = std::numeric_limits<float>::infinity();
  };
  BOOST_CHECK_EXCEPTION(tw.run(obs_w), NonFiniteError, [](const NonFiniteError& e) {
    return std::string(e.what()).find("step 15: parameter blocks.0.ffn.fc1.weight is no longer finite") == 0;
  });
  BOOST_TEST(json::parse(read_safetensors(dir_w + "/checkpoint.safetensors").meta("train_state"))["step"] == 10);
  // With --skip-nonfinite, steps whose loss is not finite while the weights are (an overflow)
  // are skipped and counted: embeddings of 3e38 overflow every layer norm's mean for steps 4-6,
  // then are restored.
  const std::string dir2 = fresh_dir("nan-skip");
  TrainArgs s = small_args(dir2);
  s.skip_nonfinite = true;
  s.steps = 10;
  s.eval_every = 10;
  Trainer t2(s);
  std::vector<float> saved;
  TrainObserver obs2;
  obs2.on_step = [&](int64_t step, int64_t, float, double) {
    Tensor& emb = t2.model().tok_emb.weight;
    if (step == 3) {
      saved = emb.to_vector();
      emb.fill_(3e38f);
    }
    if (step == 6) emb.copy_from(Tensor::from(emb.shape(), saved));
  };
  TrainResult r = t2.run(obs2);
  BOOST_TEST(r.skipped_steps == 3);
  BOOST_TEST(r.steps == 10);
  // but a skipped step cannot mend broken weights: then the run stops (no checkpoint yet here)
  const std::string dir3 = fresh_dir("nan-skip-weights");
  TrainArgs s3 = small_args(dir3);
  s3.skip_nonfinite = true;
  s3.steps = 10;
  Trainer t3(s3);
  TrainObserver obs3;
  obs3.on_step = [&](int64_t step, int64_t, float, double) {
    if (step == 3) t3.model().head.weight.data()[0] = std::numeric_limits<float>::quiet_NaN();
  };
  BOOST_CHECK_EXCEPTION(t3.run(obs3), NonFiniteError, [](const NonFiniteError& e) {
    return std::string(e.what()).find("step 4: parameter head.weight is no longer finite; stopping without saving it "
                                      "(no checkpoint was written yet") == 0;
  });
  BOOST_TEST(!file_exists(dir3 + "/checkpoint.safetensors"));
}

BOOST_AUTO_TEST_CASE(grads_command_matches_in_process_autograd) {
  const std::string dir = fresh_dir("grads");
  make_dirs(dir);
  const ModelConfig c =
      test_model({.vocab = 13, .d_model = 16, .heads = 4, .kv_heads = 2, .d_ff = 32, .max_seq_len = 33, .attn_bias = false});
  TransformerLM m(c, 42);
  save_checkpoint(dir + "/m.safetensors", m);
  CopyTask task(TaskConfig::preset("copy"));
  Rng rng(5);
  Batch b = task.sample(3, rng);
  SafetensorsWriter bw;
  bw.add_ids("input_ids", b.inputs, DType::I64);
  bw.add_ids("targets", b.targets, DType::I64);
  bw.write(dir + "/batch.safetensors");
  const std::string cmd = std::string(HEADLAB_BINARY) + " grads --threads 2 --checkpoint " + dir +
                          "/m.safetensors --batch " + dir + "/batch.safetensors --out " + dir + "/g.safetensors > /dev/null";
  // Same BLAS kernels in both processes: keep headlab from choosing others (see cli/main.cpp).
  ::setenv("HEADLAB_BLAS_CORE_CHOSEN", "as-the-test", 1);
  BOOST_REQUIRE(std::system(cmd.c_str()) == 0);
  set_num_threads(2);
  auto [logits, cache] = m.run_with_cache(b.inputs, names_ending_with("hook_pattern"));
  Tensor loss = cross_entropy(logits, b.targets);
  loss.backward();
  auto g = read_safetensors(dir + "/g.safetensors");
  BOOST_TEST(g.f32("loss").item() == loss.item());
  for (auto& [name, t] : m.named_parameters()) {
    Tensor dumped = g.f32("grad." + name);
    BOOST_TEST(dumped.shape() == t.shape());
    BOOST_TEST(dumped.to_vector() == t.grad().to_vector());
  }
  BOOST_TEST(g.f32("attn.1").shape() == Shape({3, 4, 33, 33}));
  BOOST_TEST(g.f32("attn.1").to_vector() == cache["blocks.1.attn.hook_pattern"].to_vector());
}

// Each row of the flag table writes the member that TrainArgs::to_json() keeps at the row's JSON
// pointer: changing the member through the row changes exactly that value.
BOOST_AUTO_TEST_CASE(every_flag_row_writes_the_setting_its_json_pointer_names) {
  const auto all_given = [](const std::string&) { return true; };
  const TrainFlagValues defaults;
  const json before = json::parse(resolve_train_flags(defaults, all_given).to_json());
  for (const TrainSetting& s : train_settings()) {
    BOOST_TEST_CONTEXT(s.flag) {
      BOOST_TEST(find_train_setting(s.flag) == &s);
      BOOST_TEST(find_train_setting(s.name()) == &s);
      TrainFlagValues v;
      std::visit(
          [&](auto* field) {
            using T = std::remove_pointer_t<decltype(field)>;
            if constexpr (std::is_same_v<T, bool>) {
              *field = !*field;
            } else if constexpr (std::is_same_v<T, std::string>) {
              *field = s.choices.empty() ? "some-file" : (*field == s.choices[0] ? s.choices[1] : s.choices[0]);
            } else {
              *field = static_cast<T>(*field == static_cast<T>(s.lo) ? s.lo + 1 : s.lo);
            }
          },
          s.field(v));
      // --mlp swiglu refuses an explicit --activation other than silu: left out for that row
      const auto given = [&s](const std::string& f) { return !(s.flag == "--mlp" && f == "--activation"); };
      const json after = json::parse(resolve_train_flags(v, given).to_json());
      const json::json_pointer p(s.json_pointer);
      BOOST_TEST(after.contains(p));
      BOOST_TEST(after.value(p, json()) != before.value(p, json()));
      // ...and nothing else but derived values (d_head follows d_model, kv_heads follows heads,
      // a fixed min_len follows the length, reverse follows the task)
      json rest_after = after, rest_before = before;
      for (json* j : {&rest_after, &rest_before})
        for (const std::string& path : {std::string("/model/d_head"), std::string("/model/n_kv_heads"),
                                                   std::string("/task/min_len"), std::string("/task/reverse"), s.json_pointer}) {
          const json::json_pointer q(path);
          if (j->contains(q)) j->at(q.parent_pointer()).erase(q.back());
        }
      BOOST_TEST(rest_after == rest_before);
    }
  }
}

// --resume: flags that define the run must match the stored run (also ones that are easy to
// forget, such as --decay-all and --data); --steps and --threads may change.
BOOST_AUTO_TEST_CASE(resume_checks_given_flags_against_the_stored_run) {
  TrainArgs stored = small_args("");
  TrainArgs given = stored;
  given.steps = 80;
  given.threads = 1;
  given.decay_all = true;
  const auto given_flags = [](std::set<std::string> flags) {
    return [flags](const std::string& f) { return flags.count(f) > 0; };
  };
  const TrainArgs r = resume_with_flags(stored, given, given_flags({"--steps", "--threads"}), "ckpt");
  BOOST_TEST(r.steps == 80);
  BOOST_TEST(r.threads == 1);
  BOOST_TEST(r.decay_all == false);
  BOOST_TEST(r.model.d_model == stored.model.d_model);
  BOOST_CHECK_EXCEPTION(resume_with_flags(stored, given, given_flags({"--decay-all"}), "ckpt"), Error, [](const Error& e) {
    return std::string(e.what()) == "--decay-all true does not match the run being resumed (false in ckpt)";
  });
  given.task.data = "other.txt";
  BOOST_CHECK_EXCEPTION(resume_with_flags(stored, given, given_flags({"--data"}), "ckpt"), Error, [](const Error& e) {
    return std::string(e.what()) == "--data \"other.txt\" does not match the run being resumed (null in ckpt)";
  });
  // a setting given on resume equal to the stored one is fine
  BOOST_CHECK_NO_THROW(resume_with_flags(stored, stored, given_flags({"--d-model", "--lr", "--task"}), "ckpt"));
}

BOOST_AUTO_TEST_CASE(validate_applies_the_table_ranges_and_choices) {
  auto message = [](TrainArgs a) {
    try {
      a.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("valid");
  };
  TrainArgs a = small_args("");
  BOOST_TEST(message(a) == "valid");
  a.lr = std::nanf("");
  BOOST_TEST(message(a) == "--lr: the value is not a finite number");
  a = small_args("");
  a.optimizer = "lion";
  BOOST_TEST(message(a) == "--optimizer must be one of adamw, adam, sgd, got 'lion'");
  a = small_args("");
  a.threads = 2000;
  BOOST_TEST(message(a) == "--threads: value 2000 is outside [1, 1024]");
}

// ---- snapshots: the resume state kept at chosen steps ------------------------------------------

namespace {
// The tensors of two safetensors files are the same, bit for bit.
void same_tensors(const std::string& a, const std::string& b) {
  const SafetensorsFile fa = read_safetensors(a), fb = read_safetensors(b);
  BOOST_TEST(fa.tensors.size() == fb.tensors.size());
  for (auto& [name, t] : fa.tensors) BOOST_TEST_CONTEXT(name) { BOOST_TEST((t.bytes == fb.get(name).bytes)); }
}
json train_state_without_time(const std::string& path) {
  json st = json::parse(read_safetensors(path).meta("train_state"));
  for (const char* k : {"wall_s", "train_s", "eval_s"}) st.erase(k);
  return st;
}
}  // namespace

BOOST_AUTO_TEST_CASE(snapshots_hold_the_resume_state_and_a_run_continues_from_them_exactly) {
  const std::string full = fresh_dir("snap-full");
  TrainArgs a = small_args(full);
  a.snapshot_every = 10;
  a.snapshot_at = {0, 15};
  Trainer t(a);
  // the plan announced up front: every step still to write, each the size of the resume state
  BOOST_TEST(t.snapshot_plan().steps == (std::vector<int64_t>{0, 10, 15, 20, 30, 40}), boost::test_tools::per_element());
  t.run();
  BOOST_TEST(snapshot_steps(full) == (std::vector<int64_t>{0, 10, 15, 20, 30, 40}), boost::test_tools::per_element());
  BOOST_TEST(snapshot_path(full, 15) == full + "/snapshots/step_00000015.safetensors");
  for (int64_t s : snapshot_steps(full)) {
    const double bytes = static_cast<double>(fs::file_size(snapshot_path(full, s)));
    BOOST_TEST(bytes <= t.snapshot_plan().bytes_each);
    BOOST_TEST(bytes >= t.snapshot_plan().bytes_each - 128);  // the digits of the step and the times
  }
  // the last snapshot is the final checkpoint (the same tensors and state, not the times)
  same_tensors(snapshot_path(full, 40), full + "/checkpoint.safetensors");
  BOOST_TEST(train_state_without_time(snapshot_path(full, 40)) == train_state_without_time(full + "/checkpoint.safetensors"));
  // step 0 holds the initial weights: those of a fresh model of the seed, and zero moments
  {
    const SafetensorsFile f = read_safetensors(snapshot_path(full, 0));
    TransformerLM fresh(checkpoint_config(f), a.seed);
    for (auto& [name, p] : fresh.named_parameters()) BOOST_TEST(f.f32(name).to_vector() == p.to_vector());
    BOOST_TEST(json::parse(f.meta("train_state"))["step"] == 0);
    BOOST_TEST(json::parse(f.meta("train_state"))["optimizer_steps"] == 0);
  }
  // A new run directory whose checkpoint is a snapshot (15: between checkpoints; 0: the start)
  // trains to the original run's final weights bit for bit, and keeps writing snapshots.
  for (int64_t from : {int64_t{15}, int64_t{0}}) {
    BOOST_TEST_CONTEXT("from step " << from) {
      const std::string fork = fresh_dir("snap-fork-" + std::to_string(from));
      make_dirs(fork);
      fs::copy_file(snapshot_path(full, from), fork + "/checkpoint.safetensors");
      TrainArgs r = resume_args(fork, TrainArgs{}, [](const std::string&) { return false; });
      BOOST_TEST(r.snapshot_every == 10);  // the run's settings come with the snapshot
      const std::vector<int64_t> later = from == 15 ? std::vector<int64_t>{20, 30, 40}
                                                    : std::vector<int64_t>{0, 10, 15, 20, 30, 40};
      Trainer resumed(r);
      BOOST_TEST(resumed.snapshot_plan().steps == later, boost::test_tools::per_element());  // those after its step
      resumed.run();
      same_tensors(full + "/model.safetensors", fork + "/model.safetensors");
      same_tensors(full + "/checkpoint.safetensors", fork + "/checkpoint.safetensors");
      BOOST_TEST(snapshot_steps(fork) == later, boost::test_tools::per_element());
      for (int64_t s : later) same_tensors(snapshot_path(full, s), snapshot_path(fork, s));
    }
  }
}

BOOST_AUTO_TEST_CASE(snapshot_errors_name_the_run_and_what_it_has) {
  const std::string dir = fresh_dir("snap-none");
  make_dirs(dir);
  BOOST_TEST(snapshot_steps(dir).empty());
  BOOST_TEST(error_of([&] { require_snapshot(dir, 5); }) ==
             dir + " has no snapshots (" + how_to_make_snapshots() + ")");
  make_dirs(snapshot_dir(dir));
  for (int64_t s : {0, 100, 200}) write_file_atomic(snapshot_path(dir, s), "x");
  write_file_atomic(snapshot_dir(dir) + "/notes.txt", "not a snapshot");
  write_file_atomic(snapshot_dir(dir) + "/step_12x.safetensors", "not a step");
  BOOST_TEST(snapshot_steps(dir) == (std::vector<int64_t>{0, 100, 200}), boost::test_tools::per_element());
  BOOST_TEST(require_snapshot(dir, 100) == snapshot_path(dir, 100));
  BOOST_TEST(error_of([&] { require_snapshot(dir, 150); }) == dir + " has no snapshot at step 150; it has 0, 100, 200");
  // more snapshots than the disk holds: one message with the count, the sizes and the directory
  const std::string msg = error_of([&] { check_snapshots_fit_on_disk(dir, 1000, 1e18); });
  BOOST_TEST(msg.find("snapshots: 1000 snapshots of ") == 0);
  BOOST_TEST(msg.find("free under " + dir) != std::string::npos);
  BOOST_TEST(error_of([&] { check_snapshots_fit_on_disk(dir, 2, 1.0); }) == "(no error)");
  // the settings: steps out of the run's range, and snapshots without a run directory
  TrainArgs a = small_args("");
  a.snapshot_at = {0, 41};
  BOOST_TEST(error_of([&] { a.validate(); }) == "--snapshot-at 41 is outside the run's steps 0..40 (0 = the initial weights)");
  a.snapshot_at = {10};
  BOOST_TEST(error_of([&] { Trainer{a}; }).find("snapshots are kept in the run's directory: give --out") == 0);
  // which steps a run keeps: multiples of --snapshot-every from 0, and --snapshot-at
  a.snapshot_every = 15;
  a.snapshot_at = {7, 30};
  BOOST_TEST(planned_snapshot_steps(a) == (std::vector<int64_t>{0, 7, 15, 30}), boost::test_tools::per_element());
  BOOST_TEST(snapshot_due(a, 45));
  BOOST_TEST(!snapshot_due(a, 8));
}

// The steps the loop reads: every snapshot, and the final checkpoint once (here a snapshot holds
// its step, so the snapshot is read); a stopped run's checkpoint sits among its snapshots in order.
BOOST_AUTO_TEST_CASE(scores_over_training_read_every_snapshot_and_the_final_checkpoint_once) {
  const std::string dir = fresh_dir("over-steps");
  TrainArgs a = small_args(dir);
  a.steps = 20;
  a.snapshot_every = 10;
  Trainer(a).run();
  HeadScoreOptions o;
  const ScoresOverTraining s = scores_over_training(dir, "compose", o);
  BOOST_TEST(s.steps == (std::vector<int64_t>{0, 10, 20}), boost::test_tools::per_element());
  BOOST_TEST(s.checkpoints.back() == snapshot_path(dir, 20));
  BOOST_TEST(s.score_names == (std::vector<std::string>{"q_composition", "k_composition", "v_composition"}),
             boost::test_tools::per_element());
  for (size_t i = 0; i < s.steps.size(); ++i) {  // the values are each file's own scores
    const HeadScores h = head_scores("compose", read_checkpoint(s.checkpoints[i]), s.checkpoints[i], o);
    for (size_t k = 0; k < 3; ++k)
      for (int l = 0; l < 2; ++l)
        for (int hd = 0; hd < 2; ++hd) {
          const double v = s.at(k, i, l, hd), want = h.grids[k][static_cast<size_t>(l)][static_cast<size_t>(hd)];
          BOOST_TEST((l == 0 ? std::isnan(v) && std::isnan(want) : v == want));
        }
  }
  // the scores move with training: the last step's differ from the first's
  BOOST_TEST(s.at(1, 0, 1, 0) != s.at(1, 2, 1, 0));
  // a run whose checkpoint (step 10) falls between snapshots (0 and 20): read in step order
  fs::copy_file(snapshot_path(dir, 10), dir + "/checkpoint.safetensors", fs::copy_options::overwrite_existing);
  fs::remove(snapshot_path(dir, 10));
  const ScoresOverTraining t = scores_over_training(dir, "compose", o);
  BOOST_TEST(t.steps == (std::vector<int64_t>{0, 10, 20}), boost::test_tools::per_element());
  BOOST_TEST(t.checkpoints[1] == dir + "/checkpoint.safetensors");
  // a snapshot file under another step's name is refused, not scored as that step
  fs::rename(snapshot_path(dir, 20), snapshot_path(dir, 25));
  BOOST_TEST(error_of([&] { scores_over_training(dir, "compose", o); }) ==
             snapshot_path(dir, 25) + ": holds the weights of step 20, not of step 25 (a renamed or copied file)");
  BOOST_TEST(error_of([&] { scores_over_training(dir, "roles", o); }) ==
             "analysis 'roles' is not one of detect, patch, importance, dla, compose");
}

// A run's data files are fingerprinted in 1 MiB blocks, not read whole; the text is the one runs
// recorded before (FNV-1a of the bytes), so their resumes still match.
BOOST_AUTO_TEST_CASE(data_file_fingerprint_is_streamed_and_unchanged) {
  const std::string dir = fresh_dir("fingerprint");
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/a", "a");
  // the hash runs have recorded: FNV-1a's loop from the basis 1469598103934665603 (computed apart in Python)
  BOOST_TEST(file_fingerprint(dir + "/a") == "1 bytes, fnv1a 44bd8ad473cd9906");
  std::string big(3 * (1 << 20) + 12345, '\0');  // three blocks and a piece
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  write_file_atomic(dir + "/big", big);
  BOOST_TEST(file_fingerprint(dir + "/big") == fingerprint(big));
  BOOST_TEST(file_fingerprint(dir + "/big").starts_with(std::to_string(big.size()) + " bytes, fnv1a "));
  BOOST_TEST(error_of([&] { file_fingerprint(dir); }) == dir + ": is a directory, not a regular file: give a file");
}
