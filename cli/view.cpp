// headlab view: one self-contained HTML page (views/head_view.html, all code and data inlined,
// no network) to look at a model's heads: a head view and a model view of the attention patterns
// of a few examples, and the run's curves, gradient atlas and pruning results when present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "analysis/detectors.h"
#include "cli/precision_option.h"
#include "cli/threads_option.h"
#include "cli/commands.h"
#include "cli/edge_graph.h"
#include "datasets/tokenizer.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/over_training.h"
#include "train/run_dir.h"
#include "train/snapshots.h"
#include "train/trainer.h"
#include "views/pages.h"

namespace hl {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct ViewOpts {
  std::string run, checkpoint, tokens, text, tokenizer, out, edges, compare;
  std::string qk;  // --qk: headlab qk's qk.json (or its directory) for the QK attribution panel
  int edges_top = 20;
  std::string task = "copy";
  bool task_given = false;  // --task on the command line
  int examples = 4;
  uint64_t seed = 1234;
  int threads = 2;
  std::string precision = "float32";
};

// A CSV file as {"columns": [...], "rows": [[...]]}, numbers as numbers; null when absent. A row
// with the wrong number of fields is an error naming the file and line.
json read_csv(const std::string& path);

// `headlab compare ... --out DIR`'s files for the page's comparison panel; fails naming what is missing.
json read_compare_for_view(const std::string& given) {
  // the directory, or its compare.json
  const std::string parent = std::filesystem::path(given).parent_path().string();
  const std::string dir = std::filesystem::is_directory(given) ? given : parent.empty() ? "." : parent;
  json names;
  try {
    names = json::parse(read_file(dir + "/compare.json"));
  } catch (const std::exception& e) {
    fail("--compare ", dir, ": no readable compare.json (", e.what(), "); write it with headlab compare RUN_A RUN_B --out ", dir);
  }
  json curves = read_csv(dir + "/compare.csv"), heads = read_csv(dir + "/compare_heads.csv");
  if (curves.is_null() || heads.is_null() || !names.is_object() || !names.contains("a") || !names.contains("b"))
    fail("--compare ", dir, ": compare.csv, compare_heads.csv and compare.json of headlab compare are needed");
  return {{"a", names["a"]}, {"b", names["b"]}, {"curves", std::move(curves)}, {"heads", std::move(heads)}};
}

json read_csv(const std::string& path) {
  if (!file_exists(path)) return nullptr;
  std::istringstream in(read_file(path));
  std::string line;
  auto split = [](const std::string& s) {
    std::vector<std::string> f;
    std::string cur;
    for (char c : s) {
      if (c == ',') f.push_back(cur), cur.clear();
      else cur += c;
    }
    f.push_back(cur);
    return f;
  };
  if (!std::getline(in, line) || line.empty()) fail(path, ": empty (expected a header line)");
  json t = {{"columns", split(line)}, {"rows", json::array()}};
  const size_t n = t["columns"].size();
  for (int lineno = 2; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    const std::vector<std::string> f = split(line);
    if (f.size() < n) fail(path, ":", lineno, ": ", f.size(), " fields, expected ", n, " (", t["columns"].dump(), ")");
    json row = json::array();
    for (size_t i = 0; i < f.size(); ++i) {
      char* end = nullptr;
      const double v = std::strtod(f[i].c_str(), &end);
      if (i == n - 1 && f.size() > n) {  // a last field with commas (singular values): keep as text
        std::string rest = f[i];
        for (size_t k = i + 1; k < f.size(); ++k) rest += "," + f[k];
        row.push_back(rest);
        break;
      }
      if (!f[i].empty() && *end == '\0' && std::isfinite(v)) row.push_back(v);
      else row.push_back(f[i]);
    }
    t["rows"].push_back(row);
  }
  return t;
}

// metrics.jsonl as a table (step, loss, token_acc, exact_match); null when absent.
json read_metrics(const std::string& path) {
  if (!file_exists(path)) return nullptr;
  json t = {{"columns", {"step", "loss", "token_acc", "exact_match"}}, {"rows", json::array()}};
  std::istringstream in(read_file(path));
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    try {
      const json j = json::parse(line);
      t["rows"].push_back({j.at("step"), j.at("loss"), j.at("token_acc"), j.at("exact_match")});
    } catch (const json::exception& e) {
      fail(path, ":", lineno, ": not a metrics line (", e.what(), ")");
    }
  }
  return t;
}

using views::ViewExample;

// The Edges panel's data from an edges.json of `headlab edges` on this model.
json read_edges_for_view(const std::string& given, int top, const ModelConfig& cfg) {
  // edges.json, or the directory headlab edges wrote it in
  const std::string path = std::filesystem::is_directory(given) ? given + "/edges.json" : given;
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail("--edges ", path, ": not JSON (", e.what(), ")");
  }
  const EdgeGraphData g = read_edges_json(j, "--edges " + path);
  if (g.n_layers != cfg.n_layers || g.n_heads != cfg.n_heads || g.has_mlp != cfg.has_mlp())
    fail("--edges ", path, ": edges of ", g.n_layers, " layers x ", g.n_heads, " heads", g.has_mlp ? "" : " without MLPs",
         ", the model has ", cfg.n_layers, " x ", cfg.n_heads, cfg.has_mlp() ? "" : " without MLPs");
  return edges_for_page(g, top);
}

// The examples to show: given ids, given text (byte-level models, or encoded with the
// tokenizer), or rows of the task's held-out set (trailing padding removed).
std::vector<ViewExample> examples_for(const ViewOpts& o, const ModelConfig& cfg, const Task* task, const Tokenizer* tok) {
  std::vector<ViewExample> ex;
  if (!o.tokens.empty()) {
    ex.push_back({"--tokens", parse_token_ids(o.tokens, cfg.vocab_size), {}});
  } else if (!o.text.empty() && tok) {
    ViewExample e{"--text", tok->encode(o.text, "--text", true), {}};  // with its BOS/EOS
    if (e.ids.empty()) fail("--text: the text holds no tokens");
    ex.push_back(e);
  } else if (!o.text.empty()) {
    if (cfg.vocab_size != 256) fail("--text: the model's vocabulary has ", cfg.vocab_size, " tokens, not the 256 bytes of a text model");
    ViewExample e{"--text", {}, {}};
    for (unsigned char c : o.text) e.ids.push_back(c);
    ex.push_back(e);
  } else {
    for (std::vector<int32_t>& row : unpadded_rows(task->held_out(o.examples, o.seed, o.examples), o.examples))
      ex.push_back({"held-out " + std::to_string(ex.size()), std::move(row), {}});
  }
  for (const ViewExample& e : ex)
    if (static_cast<int64_t>(e.ids.size()) > cfg.max_seq_len)
      fail(e.name, ": ", e.ids.size(), " tokens exceed the model's max_seq_len ", cfg.max_seq_len);
  return ex;
}

int run_view(const ViewOpts& o) {
  if (o.run.empty() == o.checkpoint.empty()) fail("give a run directory or --checkpoint (one of them)");
  std::string ckpt = o.checkpoint, model_dir, run_dir = o.run;
  if (!o.run.empty()) {
    if (!fs::is_directory(o.run)) fail(o.run, ": not a directory (give a run directory of headlab train or prune)");
    for (const std::string& d : {o.run, o.run + "/base"})
      if (ckpt.empty() && file_exists(d + "/model.safetensors")) ckpt = d + "/model.safetensors", model_dir = d;
    // a model's revisions as downloaded (step0, step1000, ...): the page shows the last, and its
    // over-training panel what `detect --run DIR` (and the others) wrote into DIR
    if (ckpt.empty() && !file_exists(o.run + "/config.json"))
      if (const std::vector<int64_t> steps = revision_steps(o.run); !steps.empty()) {
        ckpt = model_dir = revision_path(o.run, steps.back());
        std::fprintf(stderr, "headlab view: %s holds revisions; showing the last, %s\n", o.run.c_str(), ckpt.c_str());
      }
    if (ckpt.empty())
      fail(o.run, ": no model.safetensors (nor base/model.safetensors) and no revision subdirectories (step0, step1000, ...): "
                  "not a run directory of headlab train or prune");
  } else if (fs::is_directory(ckpt)) {  // a Hugging Face GPT-2 directory
    model_dir = ckpt;
  } else {
    model_dir = fs::path(ckpt).parent_path().string();
    if (model_dir.empty()) model_dir = ".";
  }
  const std::string out = !o.out.empty() ? o.out : (o.run.empty() ? model_dir : o.run) + "/view.html";
  refuse_output_over_input("--out", out, {{"--checkpoint", ckpt}});
  refuse_replacing_run_file("--out", out);
  set_num_threads(command_threads(o.threads));
  const SafetensorsFile f = read_checkpoint(ckpt);
  const std::unique_ptr<TransformerLM> model = load_model(f);
  const ModelConfig& cfg = model->cfg;
  json edges_panel = o.edges.empty() ? json() : read_edges_for_view(o.edges, o.edges_top, cfg);
  const json compare_panel = o.compare.empty() ? json() : read_compare_for_view(o.compare);
  json qk_panel;  // read now: a bad file refuses before the forward passes
  if (!o.qk.empty()) {
    const std::string path = fs::is_directory(o.qk) ? o.qk + "/qk.json" : o.qk;
    if (!file_exists(path)) fail("--qk ", path, ": no such file (write it with headlab qk --out DIR)");
    json j;
    try {
      j = json::parse(read_file(path));
    } catch (const json::exception& e) {
      fail("--qk ", path, ": not JSON (", e.what(), ")");
    }
    qk_panel = views::qk_panel(j, "--qk " + path, cfg);
  }
  std::unique_ptr<Task> task;
  const TaskConfig tc = checkpoint_task(f, TaskConfig::preset(o.task));
  // --text is encoded with --tokenizer, or else with the tokenizer the model was trained with
  // (--task text --tokenizer), or the one in a GPT-2 model's directory, if any
  std::shared_ptr<const Tokenizer> tok;
  const bool dir_has_tokenizer = has_tokenizer_files(ckpt);
  const std::string tok_dir = !o.tokenizer.empty() ? o.tokenizer
                              : o.text.empty()     ? std::string()
                              : !tc.tokenizer.empty() ? tc.tokenizer
                              : dir_has_tokenizer  ? ckpt
                                                   : std::string();
  if (!tok_dir.empty()) {
    tok = load_tokenizer(tok_dir);
    check_tokenizer_fits(*tok, cfg.vocab_size, (o.tokenizer.empty() ? "the tokenizer in " : "--tokenizer ") + tok_dir);
  }
  if (o.text.empty()) {
    if (!o.tokens.empty()) {
      // Given tokens need the task only for their labels: a task that cannot be made here (data
      // given from Python, a file since moved) or does not fit leaves plain labels.
      try {
        std::unique_ptr<Task> t = make_task(tc);
        if (t->vocab_size() == cfg.vocab_size) task = std::move(t);
      } catch (const Error&) {
      }
    } else if (!tc.data.empty() && tc.data.front() == '(') {
      // trained from Python arrays: the trainer saved the held-out rows beside the checkpoint
      // (or in the run directory of a study); without them, the detectors' probe
      std::string rows;
      for (const std::string& d : {model_dir, o.run})
        if (rows.empty() && !d.empty() && file_exists(held_out_rows_path(d))) rows = held_out_rows_path(d);
      if (!rows.empty()) {
        TaskConfig saved = tc;
        saved.name = "tokens";
        saved.data = saved.eval_data = rows;
        saved.alphabet = static_cast<int>(cfg.vocab_size);  // the model's ids, whatever the rows hold
        task = task_for_model(cfg, saved, ckpt);
        std::fprintf(stderr, "headlab view: the run's data came from Python arrays; showing its held-out rows (%s)\n",
                     rows.c_str());
      } else {
        std::fprintf(stderr, "headlab view: the run's data came from Python arrays and %s holds no %s; showing random "
                             "tokens with a repeated block (give --tokens for sequences of your own)\n",
                     model_dir.c_str(), fs::path(held_out_rows_path(".")).filename().c_str());
      }
    } else if (!f.metadata.count("task") && !o.task_given) {
      // a model that names no task (a Hugging Face model, a revision) and none given: the probe below
    } else {
      task = task_for_model(cfg, tc, ckpt, "--tokens or --text");
    }
  }
  std::vector<ViewExample> examples;
  if (o.text.empty() && o.tokens.empty() && !task) {
    const int k = static_cast<int>(std::min<int64_t>(16, cfg.max_seq_len / 2));
    for (const Batch& b : varied_repeat_probe(o.examples, std::max(k, 2), static_cast<int>(cfg.vocab_size), o.seed))
      for (int64_t r = 0; r < b.size(); ++r)
        examples.push_back({"probe " + std::to_string(examples.size()),
                            std::vector<int32_t>(b.inputs.data.begin() + r * b.inputs.shape[1],
                                                 b.inputs.data.begin() + (r + 1) * b.inputs.shape[1]),
                            {}});
  } else {
    examples = examples_for(o, cfg, task.get(), tok ? &*tok : nullptr);
  }
  const int L = cfg.n_layers, H = cfg.n_heads;
  for (ViewExample& e : examples)
    for (int32_t id : e.ids)
      e.tokens.push_back(tok && tok->has_id(id) ? tok->token_text(id)
                         : task                   ? task->token_text(id)
                         : o.text.empty()         ? std::to_string(id)
                                                  : byte_token_text(id));
  for (const std::string& cut : views::fit_examples_to_page(examples, L, H)) std::fprintf(stderr, "headlab view: %s\n", cut.c_str());
  // one example's forward at a time (patterns only, no logits), and every example's patterns as
  // 16-bit fractions several times over: raw, base64, in the JSON, in the page
  int64_t longest = 1;
  double pattern_bytes = 0;
  for (const ViewExample& e : examples) {
    const auto T = static_cast<int64_t>(e.ids.size());
    longest = std::max(longest, T);
    pattern_bytes += 2.0 * L * H * static_cast<double>(T) * static_cast<double>(T + 1) / 2;
  }
  announce_memory("view",
                  estimate_step_bytes(cfg, 1, longest, false, false) - 4.0 * static_cast<double>(parameter_count(cfg)) +
                      5 * pattern_bytes,
                  std::to_string(examples.size()) + " example(s) of up to " + std::to_string(longest) + " tokens",
                  "--examples or the tokens given (--tokens, --text)");
  const json ex_json = views::head_view_examples(*model, examples);
  json data = {{"title", "headlab view: " + (o.run.empty() ? ckpt : o.run)},
               {"subtitle", std::to_string(L) + " layers x " + std::to_string(H) + " heads, d_model " +
                                std::to_string(cfg.d_model) + ", task " + (!o.text.empty() ? std::string("text") : task || !o.tokens.empty() ? tc.name : std::string("probe")) +
                                "; " + std::to_string(examples.size()) + " example(s)"},
               {"layers", L},
               {"heads", H},
               {"examples", ex_json},
               {"metrics", read_metrics(model_dir + "/metrics.jsonl")},
               {"atlas", read_csv(model_dir + "/grad_atlas.csv")},
               {"entropy", read_csv(model_dir + "/attn_entropy.csv")},
               {"prune_heads", o.run.empty() ? json() : read_csv(o.run + "/heads.csv")},
               {"prune_curves", o.run.empty() ? json() : read_csv(o.run + "/prune_curves.csv")},
               // what the heads do, when detect, patch and compose wrote into the run (headlab study)
               {"roles_detect", o.run.empty() ? json() : read_csv(o.run + "/detect/detect.csv")},
               {"roles_patch", o.run.empty() ? json() : read_csv(o.run + "/patch/patch_heads.csv")},
               {"roles_compose", o.run.empty() ? json() : read_csv(o.run + "/compose/compose.csv")},
               {"roles_baseline", o.run.empty() ? json() : read_csv(o.run + "/compose/compose_baseline.csv")}};
  if (!edges_panel.is_null()) data["edges"] = std::move(edges_panel);
  if (!compare_panel.is_null()) data["compare"] = std::move(compare_panel);
  if (!qk_panel.is_null()) data["qk"] = std::move(qk_panel);
  // heads over training: what `detect|patch|dla|compose|prune --run RUN` wrote into the run
  json over = json::array();
  if (!o.run.empty())
    for (const std::string& a : head_analysis_names()) {
      json t = read_csv(over_training_dir(o.run, a) + "/" + a + "_over_training.csv");
      if (!t.is_null()) over.push_back({{"analysis", a}, {"table", std::move(t)}});
    }
  if (!over.empty()) data["over_training"] = std::move(over);
  const std::string page = views::head_view_page(std::move(data));
  write_file_atomic(out, page);
  std::printf("wrote %s (%s): open it in a browser\n", out.c_str(), format_bytes(static_cast<double>(page.size())).c_str());
  return 0;
}

}  // namespace

int write_view_page(const std::string& run_dir, int threads) {
  ViewOpts o;
  o.run = run_dir;
  o.threads = threads;
  return run_view(o);
}

void add_view_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("view", "Write one offline HTML page to look at a model's heads (head view, model view, run curves)");
  auto o = std::make_shared<ViewOpts>();
  sub->add_option("run", o->run, "Run directory of headlab train or prune (its model, metrics, gradient atlas, pruning results)");
  sub->add_option("--checkpoint", o->checkpoint, "A model checkpoint instead of a run directory");
  sub->add_option("--out", o->out, "Output file (default: RUN/view.html, or view.html beside the checkpoint)");
  // An empty value would silently show the held-out examples instead: refused, as is giving both.
  const CLI::Validator given([](std::string& v) { return v.empty() ? std::string("is empty") : std::string(); }, "");
  CLI::Option* tokens = sub->add_option("--tokens", o->tokens, "Show these token ids (e.g. \"11 3 4 12 3 4\") instead of held-out examples")
                            ->check(given);
  sub->add_option("--text", o->text, "Show this text (one token per byte, or encoded with --tokenizer)")
      ->check(given)->excludes(tokens);
  sub->add_option("--tokenizer", o->tokenizer,
                  "Tokenizer directory (tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe): encodes --text and "
                  "labels the tokens (default: the one the model was trained with, if any)")->check(given);
  sub->add_option("--task", o->task, "Task of the examples when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--examples", o->examples, "Held-out examples to show")->capture_default_str()->check(in_range(1, 64));
  sub->add_option("--seed", o->seed, "Seed of the held-out examples")->capture_default_str()->check(in_range(0, 1.8e19));
  add_threads_option(sub, o->threads);
  sub->add_option("--edges", o->edges, "edges.json of headlab edges on this model: adds an Edges panel (the circuit's top edges)")
      ->check(given);
  sub->add_option("--compare", o->compare,
                  "Output directory of headlab compare RUN_A RUN_B: adds a panel with the two runs' curves and heads side by side")
      ->check(given);
  sub->add_option("--qk", o->qk, "qk.json of headlab qk on this model (or its directory): adds a QK attribution panel (the head's "
                  "query-side x key-side pair matrix)")
      ->check(given);
  sub->add_option("--edges-top", o->edges_top, "Edges the panel draws first (largest |exact|; the page offers up to 500)")
      ->capture_default_str()->check(in_range(1, 500));
  add_precision_option(sub, o->precision);
  sub->callback([&runner, o, sub] {
    o->task_given = sub->count("--task") > 0;
    runner = [o] {
      const PrecisionScope precision(precision_from_flag(o->precision));
      return run_view(*o);
    };
  });
}

}  // namespace hl
