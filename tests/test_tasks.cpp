// Tasks: the registry, induction and text learn what they should, tokens files are read and
// their errors named, training can start from given weights.
#define BOOST_TEST_MODULE tasks
#include <boost/test/unit_test.hpp>
#include <set>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "models/checkpoint.h"
#include "train/trainer.h"
#include "tests/fixtures.h"

using namespace hl;
using hl::test::error_of;
namespace tt = boost::test_tools;
namespace fs = std::filesystem;

namespace {

// The learning tests train for seconds in Release; under AddressSanitizer they would take
// minutes and test learning, not memory: the sanitizer build skips them (the same code runs
// there in the shorter tests).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif

std::string tmp(const std::string& name) { return (fs::temp_directory_path() / ("headlab-tasks-" + name)).string(); }

TrainArgs args_for(const std::string& task) {
  TrainArgs a;
  a.task = TaskConfig::preset(task);
  a.threads = 2;
  a.eval_size = 256;
  return a;
}

// A tokens file: input_ids (N, T) of int64 and, when given, targets and loss_mask.
void write_tokens(const std::string& path, int64_t N, int64_t T, std::function<int64_t(int64_t, int64_t)> id,
                  bool with_mask = false, Shape mask_shape = Shape()) {
  SafetensorsWriter w;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t t = 0; t < T; ++t) ids.push_back(id(i, t));
  w.add_i64("input_ids", Shape{N, T}, ids);
  if (with_mask) {
    if (mask_shape.ndim == 0) mask_shape = Shape{N, T};
    w.add("loss_mask", Tensor::ones(mask_shape));
  }
  w.write(path);
}

}  // namespace

BOOST_AUTO_TEST_CASE(live_positions_end_at_each_rows_last_target) {
  Batch b;
  b.inputs = Ids(Shape{3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  b.targets = Ids(Shape{3, 4}, {-1, 3, -1, -1,  /**/ -1, -1, -1, -1,  /**/ 7, -1, 8, -1});
  std::vector<int32_t> len;
  Ids rows, targets;
  BOOST_TEST(b.live_positions(len, rows, targets));
  BOOST_TEST(len == std::vector<int32_t>({2, 0, 3}), tt::per_element());
  // packed positions: row 0's 0,1 then row 2's 0,1,2 -> targets at packed 1, 2 and 4
  BOOST_TEST(rows.shape == Shape({3}));
  BOOST_TEST(rows.data == std::vector<int32_t>({1, 2, 4}), tt::per_element());
  BOOST_TEST(targets.data == std::vector<int32_t>({3, 7, 8}), tt::per_element());
  b.targets = Ids(Shape{3, 4}, std::vector<int32_t>(12, -1));  // nothing counts
  BOOST_TEST(!b.live_positions(len, rows, targets));
  b.targets = Ids(Shape{3, 4}, std::vector<int32_t>(12, 0));  // every position counts
  BOOST_TEST(!b.live_positions(len, rows, targets));
  // every row live to the end, but the first position of each has no target: output rows only
  b.targets = Ids(Shape{3, 4}, {-1, 2, 3, 4, /**/ -1, 6, 7, 8, /**/ -1, 10, 11, 12});
  BOOST_TEST(b.live_positions(len, rows, targets));
  BOOST_TEST(len == std::vector<int32_t>({4, 4, 4}), tt::per_element());
  BOOST_TEST(rows.data == std::vector<int32_t>({1, 2, 3, 5, 6, 7, 9, 10, 11}), tt::per_element());
  BOOST_TEST(targets.data == std::vector<int32_t>({2, 3, 4, 6, 7, 8, 10, 11, 12}), tt::per_element());
  // varcopy: a row of n symbols is live up to its last answer position, 2n + 1
  auto task = make_task(TaskConfig::preset("varcopy"));
  Rng r(3);
  Batch v = task->sample(16, r);
  BOOST_TEST(v.live_positions(len, rows, targets));
  BOOST_TEST(targets.numel() == v.counted_targets());
  for (int64_t row = 0; row < 16; ++row) BOOST_TEST(len[row] == 2 * v.prompt_len[row] - 3);
}

// A task is one file that registers itself, its test and a row in the docs' task table.
BOOST_AUTO_TEST_CASE(every_registered_task_has_a_row_in_the_docs) {
  const std::string doc = read_file(HEADLAB_SOURCE_DIR "/docs/studies.md");
  for (const TaskInfo& t : task_registry()) {
    BOOST_TEST_CONTEXT("task " << t.name) {
      BOOST_TEST(doc.find("| `" + t.name + "` |") != std::string::npos);
      BOOST_TEST(t.preset.name == t.name);
      BOOST_TEST(!t.help.empty());
      BOOST_TEST(static_cast<bool>(t.make));
    }
  }
}

BOOST_AUTO_TEST_CASE(registry_lists_every_task_and_builds_it) {
  const std::vector<std::string> names = task_names();
  BOOST_TEST(names == (std::vector<std::string>{"copy", "reverse", "varcopy", "induction", "text", "tokens"}));
  for (const std::string& n : {"copy", "reverse", "varcopy", "induction"}) {
    const auto t = make_task(TaskConfig::preset(n));
    Rng rng(1);
    const Batch b = t->sample(4, rng);
    BOOST_TEST(b.inputs.shape == Shape({4, t->seq_len()}));
    for (int32_t v : b.inputs.data) BOOST_TEST((v >= 0 && v < t->vocab_size()));
    BOOST_TEST(t->rows_are_answers());
  }
  TaskConfig bad;
  bad.name = "nope";
  BOOST_TEST(error_of([&] { make_task(bad); }) ==
             "task: unknown task 'nope' (expected one of copy, reverse, varcopy, induction, text, tokens)");
}

BOOST_AUTO_TEST_CASE(induction_rows_repeat_a_block_at_a_random_place_and_count_its_second_copy) {
  const auto t = make_task(TaskConfig::preset("induction"));  // blocks of 4..12 in rows of 32
  BOOST_TEST(t->seq_len() == 32);
  BOOST_TEST(t->vocab_size() == 32);
  Rng rng(4);
  const Batch b = t->sample(200, rng);
  BOOST_TEST(!b.key_padding.defined());  // nothing padded
  std::set<int64_t> lengths, starts;
  for (int64_t r = 0; r < 200; ++r) {
    std::vector<int64_t> counted;
    for (int64_t p = 0; p < 32; ++p)
      if (b.targets.at(r, p) >= 0) counted.push_back(p);
    BOOST_TEST_REQUIRE(!counted.empty());
    const int64_t n = static_cast<int64_t>(counted.size()) + 1, start = counted.front() - n;  // the block, its first copy
    BOOST_TEST_REQUIRE((n >= 4 && n <= 12 && start >= 0 && start + 2 * n <= 32));
    BOOST_TEST(counted.back() - counted.front() == n - 2);  // consecutive: r_2..r_n of the second copy
    for (int64_t i = 0; i < n; ++i) BOOST_TEST(b.inputs.at(r, start + n + i) == b.inputs.at(r, start + i));
    for (int64_t p : counted) BOOST_TEST(b.targets.at(r, p) == b.inputs.at(r, p + 1));
    BOOST_TEST(b.prompt_len[r] == start + n + 1);
    lengths.insert(n), starts.insert(start);
  }
  BOOST_TEST(lengths.size() == 9u);  // every n in 4..12 drawn
  BOOST_TEST(starts.size() > 15u);   // and many places
}

// The rows the generator draws, written to a file and read back in order by the tokens task,
// train to the same numbers as the generator itself: the two paths are one computation.
BOOST_AUTO_TEST_CASE(induction_rows_from_the_generator_and_from_a_file_train_to_the_same_numbers) {
  TrainArgs gen = args_for("induction");
  gen.model.d_model = 32, gen.model.n_heads = 2, gen.model.d_ff = 0;
  gen.batch = 16, gen.steps = 30, gen.eval_every = 10, gen.eval_size = 64, gen.warmup = 5;
  const auto task = make_task(gen.task);
  const int64_t T = task->seq_len();
  auto write_rows = [&](const std::string& path, const std::vector<Batch>& batches) {
    std::vector<int64_t> ids;
    std::vector<float> mask;
    for (const Batch& b : batches)
      for (int64_t i = 0; i < b.size() * T; ++i) {
        ids.push_back(b.inputs.data[i]);
        mask.push_back(b.targets.data[i] >= 0 ? 1.f : 0.f);
      }
    const int64_t N = static_cast<int64_t>(ids.size()) / T;
    SafetensorsWriter w;
    w.add_i64("input_ids", Shape{N, T}, ids);
    w.add("loss_mask", Tensor::from(Shape{N, T}, mask));
    w.write(path);
  };
  std::vector<Batch> train_rows;  // what the trainer draws, step by step
  Rng rng = training_data_rng(gen.seed);
  for (int64_t s = 0; s < gen.steps; ++s) train_rows.push_back(task->sample(gen.batch, rng));
  write_rows(tmp("induction-train.safetensors"), train_rows);
  write_rows(tmp("induction-eval.safetensors"), task->held_out(gen.eval_size, gen.eval_seed, std::min(gen.eval_size, 128)));
  TrainArgs file = gen;
  file.task = TaskConfig::preset("tokens");
  file.task.data = tmp("induction-train.safetensors");
  file.task.eval_data = tmp("induction-eval.safetensors");
  file.task.shuffle = false;  // rows in file order: the generator's order
  file.task.alphabet = gen.task.alphabet;
  const TrainResult a = Trainer(gen).run(), b = Trainer(file).run();
  BOOST_TEST_REQUIRE(a.curve.size() == b.curve.size());
  for (size_t i = 0; i < a.curve.size(); ++i) {
    BOOST_TEST(a.curve[i].second.loss == b.curve[i].second.loss);
    BOOST_TEST(a.curve[i].second.token_acc == b.curve[i].second.token_acc);
  }
  BOOST_TEST(a.final_eval.exact_match == b.final_eval.exact_match);
}

BOOST_AUTO_TEST_CASE(a_two_layer_model_learns_induction) {
  if (kSanitizerBuild) return;
  // the induction regime (2 layers, 2 heads, attention-only, lr 1e-3 constant), 600 steps:
  // past the phase change (the docs' runs: 86-89% at step 300)
  TrainArgs a = args_for("induction");
  a.model.n_heads = 2, a.model.d_ff = 0;
  a.lr = 1e-3f, a.schedule = "constant", a.warmup = 200, a.steps = 600;
  Trainer t(a);
  const TrainResult r = t.run();
  BOOST_TEST(r.final_eval.token_acc >= 0.85, "token accuracy on the second copies " << r.final_eval.token_acc);
}

BOOST_AUTO_TEST_CASE(text_beats_the_unigram_entropy_of_its_file) {
  if (kSanitizerBuild) return;
  const std::string file = "/usr/share/common-licenses/GPL-3";  // on every Debian machine
  const std::string bytes = read_file(file);
  std::map<unsigned char, double> count;
  for (char ch : bytes) count[static_cast<unsigned char>(ch)] += 1;
  double entropy = 0;  // nats per byte, of the whole file
  for (auto& [ch, n] : count) entropy -= n / bytes.size() * std::log(n / bytes.size());
  TrainArgs a = args_for("text");
  a.task.data = file;
  a.steps = 300;
  a.eval_every = 300;
  Trainer t(a);
  BOOST_TEST(t.task().vocab_size() == 256);
  BOOST_TEST(!t.task().rows_are_answers());
  const TrainResult r = t.run();
  BOOST_TEST(r.final_eval.loss < entropy, "held-out loss " << r.final_eval.loss << " vs unigram entropy " << entropy);
  BOOST_TEST(r.final_eval.ar_exact_match == -1.0);  // no prompts: no greedy evaluation
  BOOST_TEST(t.task().token_text('\n') == "\\n");
  BOOST_TEST(t.task().token_text('a') == "a");
}

BOOST_AUTO_TEST_CASE(tokens_files_are_read_split_and_checked) {
  const std::string good = tmp("good.safetensors");
  write_tokens(good, 20, 6, [](int64_t i, int64_t t) { return (i + t) % 7; });
  TaskConfig c = TaskConfig::preset("tokens");
  c.data = good;
  auto task = make_task(c);
  BOOST_TEST(task->vocab_size() == 7);
  BOOST_TEST(task->seq_len() == 6);
  BOOST_TEST(!task->rows_are_answers());  // input_ids alone: language modelling
  {
    const std::string masked = tmp("masked.safetensors");
    write_tokens(masked, 20, 6, [](int64_t i, int64_t t) { return (i + t) % 7; }, true);
    TaskConfig m = TaskConfig::preset("tokens");
    m.data = masked;
    BOOST_TEST(make_task(m)->rows_are_answers());  // a loss mask marks each row's answer
    m.data = good;
    m.eval_data = masked;  // evaluation scores the held-out file's rows
    BOOST_TEST(make_task(m)->rows_are_answers());
  }
  const auto held = task->held_out(1000, 0, 128);  // the last 10%: rows 18 and 19
  BOOST_TEST_REQUIRE(held.size() == 1u);
  BOOST_TEST(held[0].inputs.shape == Shape({2, 6}));
  BOOST_TEST(held[0].inputs.at(0, 0) == 18 % 7);
  // language modelling targets: the next input, the last position not counted
  BOOST_TEST(held[0].targets.at(0, 0) == held[0].inputs.at(0, 1));
  BOOST_TEST(held[0].targets.at(0, 5) == -1);
  // --shuffle off: consecutive training rows in file order, wrapping around
  c.shuffle = false;
  task = make_task(c);
  Rng rng(1);
  Batch b;
  for (int step = 0; step < 3; ++step) {
    task->sample_into(b, 7, rng);
    for (int64_t r = 0; r < 7; ++r) BOOST_TEST(b.inputs.at(r, 0) == ((step * 7 + r) % 18 + 0) % 7);
  }
  // a .npy file gives the same rows
  {
    std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (20, 6), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::string npy = std::string("\x93NUMPY\x01\x00", 8);
    npy += static_cast<char>(header.size() & 0xff);
    npy += static_cast<char>(header.size() >> 8);
    npy += header;
    for (int64_t i = 0; i < 20; ++i)
      for (int64_t t = 0; t < 6; ++t) {
        const int64_t v = (i + t) % 7;
        npy.append(reinterpret_cast<const char*>(&v), 8);
      }
    write_file_atomic(tmp("good.npy"), npy);
    TaskConfig n = TaskConfig::preset("tokens");
    n.data = tmp("good.npy");
    const auto from_npy = make_task(n)->held_out(10, 0, 10);
    BOOST_TEST(from_npy[0].inputs.data == held[0].inputs.data);
    BOOST_TEST(from_npy[0].targets.data == held[0].targets.data);
    write_file_atomic(tmp("trunc.npy"), npy.substr(0, npy.size() - 5));
    n.data = tmp("trunc.npy");
    BOOST_TEST(error_of([&] { make_task(n); }) ==
               tmp("trunc.npy") + ": not a valid .npy file of input_ids: truncated: shape (20, 6) needs 960 bytes of data, the file has 955");
  }
  // errors: one line naming the file, the field and the shapes
  auto err = [&](const std::string& path, int vocab = 0) {
    TaskConfig e = TaskConfig::preset("tokens");
    e.data = path;
    e.alphabet = vocab;
    return error_of([&] { make_task(e); });
  };
  BOOST_TEST(err(good, 5) == "--alphabet 5: " + good + " holds the id 6, outside the vocabulary 0..4");
  const std::string neg = tmp("neg.safetensors");
  write_tokens(neg, 4, 3, [](int64_t i, int64_t t) { return i == 2 && t == 1 ? -3 : 1; });
  BOOST_TEST(err(neg) == neg + ": input_ids has the id -3 at row 2, position 1, outside 0..16777215");
  const std::string mask = tmp("mask.safetensors");
  write_tokens(mask, 4, 3, [](int64_t, int64_t) { return 1; }, true, Shape{4, 2});
  BOOST_TEST(err(mask) == mask + ": loss_mask has shape (4,2) but input_ids is (4,3)");
  const std::string f32 = tmp("f32.safetensors");
  {
    SafetensorsWriter w;
    w.add("input_ids", Tensor::zeros({4, 3}));
    w.write(f32);
  }
  BOOST_TEST(err(f32) == f32 + ": 'input_ids' is F32; token ids must be I32 or I64");
  const std::string trunc = tmp("trunc.safetensors");
  write_file_atomic(trunc, read_file(good).substr(0, 100));
  BOOST_TEST(err(trunc).find(trunc + ": not a valid safetensors file") == 0);
}

BOOST_AUTO_TEST_CASE(training_on_tokens_and_from_given_weights) {
  const std::string data = tmp("train.safetensors");
  write_tokens(data, 200, 12, [](int64_t i, int64_t t) { return (3 * i + t) % 9; });  // each row counts up
  TrainArgs a = args_for("tokens");
  a.task.data = data;
  a.steps = 150;
  a.eval_every = 150;
  a.model.d_model = 32;
  a.model.d_ff = 64;
  Trainer t(a);
  const TrainResult r = t.run();
  BOOST_TEST(r.final_eval.token_acc > 0.95, "next token of a counting sequence: " << r.final_eval.token_acc);
  // --init: a new run starts from these weights exactly
  const std::string ckpt = tmp("init.safetensors");
  save_checkpoint(ckpt, t.model());
  TrainArgs b = a;
  b.init = ckpt;
  b.seed = 77;  // its own seed would draw other weights
  Trainer from(b);
  auto p = t.model().named_parameters(), q = from.model().named_parameters();
  for (size_t i = 0; i < p.size(); ++i) BOOST_TEST(p[i].second.to_vector() == q[i].second.to_vector());
  TrainArgs wrong = b;
  wrong.model.d_ff = 48;
  BOOST_TEST(error_of([&] { Trainer x(wrong); }).find(ckpt + ": tensor 'blocks.0.ffn.fc1.weight' has shape (64,32) but the config") == 0);
}

BOOST_AUTO_TEST_CASE(token_batches_read_arrays_as_the_tokens_task_and_round_trip_through_a_file) {
  // 5 rows of 6 ids, a mask counting positions 2 and 3 (the predictions of tokens 3 and 4)
  TokenArrays a;
  a.input_ids = Ids(Shape{5, 6});
  for (int64_t i = 0; i < 30; ++i) a.input_ids.data[i] = static_cast<int32_t>((i * 7) % 11);
  a.loss_mask.assign(30, 0.f);
  for (int64_t r = 0; r < 5; ++r) a.loss_mask[r * 6 + 2] = a.loss_mask[r * 6 + 3] = 1.f;
  const std::vector<Batch> b = token_batches(a, 2, "arrays");
  BOOST_TEST_REQUIRE(b.size() == 3u);  // 2 + 2 + 1 rows, in order
  BOOST_TEST(b[2].inputs.shape == Shape({1, 6}));
  for (int64_t t = 0; t < 6; ++t)
    BOOST_TEST(b[1].targets.at(1, t) == (t == 2 || t == 3 ? a.input_ids.at(3, t + 1) : -1));
  // the same rows as held-out data of the tokens task made from them
  TaskConfig c = TaskConfig::preset("tokens");
  c.data = c.eval_data = "(arrays)";
  const auto held = make_tokens_task(c, a, &a)->held_out(5, 0, 2);
  for (size_t i = 0; i < held.size(); ++i) BOOST_TEST(held[i].targets.data == b[i].targets.data);
  // saved as a tokens file and read back by the task: the same rows
  const std::string path = tmp("rows.safetensors");
  save_token_rows(path, b);
  c.data = c.eval_data = path;
  const auto back = make_task(c)->held_out(5, 0, 2);
  for (size_t i = 0; i < back.size(); ++i) {
    BOOST_TEST(back[i].inputs.data == b[i].inputs.data);
    BOOST_TEST(back[i].targets.data == b[i].targets.data);
  }
  // nothing counted, and prompt lengths outside the rows, are refused
  a.loss_mask.assign(30, 0.f);
  BOOST_TEST(error_of([&] { token_batches(a, 2, "arrays"); }).find("arrays: no position has a target (its loss_mask is 0") == 0);
  a.loss_mask.clear();
  BOOST_TEST(error_of([&] { token_batches(a, 2, "arrays", {1, 2, 3, 4, 7}); }) ==
             "arrays: prompt_len 7 at row 4 is outside 0..6 (0: no answer)");
  // ids outside a model's vocabulary are named with their place (id 3 is 3 * 7 % 11 = 10)
  ModelConfig m;
  m.vocab_size = 10;
  BOOST_TEST(error_of([&] { check_data_fits_model(b, m, "data"); }) ==
             "data: input_ids holds the id 10 (row 0, position 3), outside the model's vocabulary 0..9");
}
