// headlab view: one self-contained HTML page (cli/view.html, all code and data inlined, no
// network) to look at a model's heads: a head view and a model view of the attention patterns
// of a few examples, and the run's curves, gradient atlas and pruning results when present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "analysis/detectors.h"
#include "cli/commands.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"
#include "train/run_dir.h"
#include "train/trainer.h"

namespace hl {

extern const std::string_view kViewPage;  // cli/view.html, embedded by CMake

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct ViewOpts {
  std::string run, checkpoint, tokens, text, out;
  std::string task = "copy";
  int examples = 4;
  uint64_t seed = 1234;
  int threads = 2;
};

// Patterns above this many bytes (uint16, before base64) take fewer examples: the page of a
// 12-layer x 12-head x 128-token model stays under 20 MB.
constexpr double kMaxPatternBytes = 12e6;

std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = static_cast<uint8_t>(bytes[i]) << 16 | (i + 1 < bytes.size() ? static_cast<uint8_t>(bytes[i + 1]) << 8 : 0) |
                       (i + 2 < bytes.size() ? static_cast<uint8_t>(bytes[i + 2]) : 0);
    out += abc[n >> 18 & 63];
    out += abc[n >> 12 & 63];
    out += i + 1 < bytes.size() ? abc[n >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? abc[n & 63] : '=';
  }
  return out;
}

// A CSV file as {"columns": [...], "rows": [[...]]}, numbers as numbers; null when absent. A row
// with the wrong number of fields is an error naming the file and line.
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

// JSON that is safe inside <script>: '<', '>' and '&' only occur in strings, where \u escapes
// mean the same characters, so "</script>" in a token cannot end the element.
std::string script_safe(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else out += c;
  }
  return out;
}

struct Example {
  std::string name;
  std::vector<int32_t> ids;
};

// The examples to show: given ids, given text (byte-level models), or rows of the task's
// held-out set (trailing padding removed).
std::vector<Example> examples_for(const ViewOpts& o, const ModelConfig& cfg, const Task* task) {
  std::vector<Example> ex;
  if (!o.tokens.empty()) {
    std::string text = o.tokens;
    std::replace(text.begin(), text.end(), ',', ' ');
    std::stringstream ss(text);
    std::string tok;
    Example e{"--tokens", {}};
    while (ss >> tok) e.ids.push_back(static_cast<int32_t>(parse_int(tok, 0, cfg.vocab_size - 1, "--tokens (ids of the vocabulary)")));
    if (e.ids.empty()) fail("--tokens: no token ids given");
    ex.push_back(e);
  } else if (!o.text.empty()) {
    if (cfg.vocab_size != 256) fail("--text: the model's vocabulary has ", cfg.vocab_size, " tokens, not the 256 bytes of a text model");
    Example e{"--text", {}};
    for (unsigned char c : o.text) e.ids.push_back(c);
    ex.push_back(e);
  } else {
    const std::vector<Batch> held = task->held_out(o.examples, o.seed, o.examples);
    for (const Batch& b : held)
      for (int64_t r = 0; r < b.size(); ++r) {
        int64_t T = b.inputs.shape[1];
        if (b.key_padding.defined())
          while (T > 1 && b.key_padding.data()[r * b.inputs.shape[1] + T - 1] != 0.f) --T;
        Example e{"held-out " + std::to_string(ex.size()), {}};
        for (int64_t t = 0; t < T; ++t) e.ids.push_back(b.inputs.at(r, t));
        ex.push_back(e);
      }
  }
  for (const Example& e : ex)
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
    if (ckpt.empty()) fail(o.run, ": no model.safetensors (nor base/model.safetensors): not a run directory of headlab train or prune");
  } else {
    model_dir = fs::path(ckpt).parent_path().string();
    if (model_dir.empty()) model_dir = ".";
  }
  const std::string out = !o.out.empty() ? o.out : (o.run.empty() ? model_dir : o.run) + "/view.html";
  refuse_output_over_input("--out", out, {{"--checkpoint", ckpt}});
  refuse_replacing_run_file("--out", out);
  set_num_threads(o.threads);
  const SafetensorsFile f = read_safetensors(ckpt);
  const std::unique_ptr<TransformerLM> model = load_model(f);
  const ModelConfig& cfg = model->cfg;
  std::unique_ptr<Task> task;
  const TaskConfig tc = checkpoint_task(f, TaskConfig::preset(o.task));
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
    } else {
      task = task_for_model(cfg, tc, ckpt);
    }
  }
  std::vector<Example> examples;
  if (o.text.empty() && o.tokens.empty() && !task) {
    const int k = static_cast<int>(std::min<int64_t>(16, cfg.max_seq_len / 2));
    for (const Batch& b : varied_repeat_probe(o.examples, std::max(k, 2), static_cast<int>(cfg.vocab_size), o.seed))
      for (int64_t r = 0; r < b.size(); ++r)
        examples.push_back({"probe " + std::to_string(examples.size()),
                            std::vector<int32_t>(b.inputs.data.begin() + r * b.inputs.shape[1],
                                                 b.inputs.data.begin() + (r + 1) * b.inputs.shape[1])});
  } else {
    examples = examples_for(o, cfg, task.get());
  }
  const int L = cfg.n_layers, H = cfg.n_heads;
  // fewer examples when the patterns would make the page too large, and a shorter first one when
  // it alone would
  if (!examples.empty()) {
    const double per_pair = 2.0 * L * H;  // bytes per (query, key) pair of the causal triangle
    const size_t T0 = examples[0].ids.size();
    size_t fit = T0;
    while (fit > 1 && per_pair * static_cast<double>(fit) * static_cast<double>(fit + 1) / 2 > kMaxPatternBytes) --fit;
    if (fit < T0) {
      std::fprintf(stderr, "headlab view: showing the first %zu of the %zu tokens of %s (the page stays under 20 MB)\n", fit,
                   T0, examples[0].name.c_str());
      examples[0].ids.resize(fit);
    }
  }
  double bytes = 0;
  size_t keep = 0;
  for (; keep < examples.size(); ++keep) {
    const double T = static_cast<double>(examples[keep].ids.size());
    if (keep > 0 && bytes + 2.0 * L * H * T * (T + 1) / 2 > kMaxPatternBytes) break;
    bytes += 2.0 * L * H * T * (T + 1) / 2;
  }
  if (keep < examples.size()) {
    std::fprintf(stderr, "headlab view: showing %zu of %zu examples (the page stays under 20 MB)\n", keep, examples.size());
    examples.resize(keep);
  }

  json ex_json = json::array();
  {
    EvalScope mode(*model);
    NoGradGuard no_grad;
    for (const Example& e : examples) {
      const int64_t T = static_cast<int64_t>(e.ids.size());
      auto [logits, cache] = model->run_with_cache(Ids(Shape{1, T}, e.ids), names_ending_with("attn.hook_pattern"));
      // uint16 of each weight of the causal lower triangle: (l, h, i, j <= i), little-endian
      std::string q;
      q.reserve(static_cast<size_t>(2 * L * H * T * (T + 1) / 2));
      for (int l = 0; l < L; ++l) {
        const Tensor& p = cache["blocks." + std::to_string(l) + ".attn.hook_pattern"];  // (1, H, T, T)
        for (int h = 0; h < H; ++h)
          for (int64_t i = 0; i < T; ++i)
            for (int64_t j = 0; j <= i; ++j) {
              const float w = p.data()[(h * T + i) * T + j];
              const auto v = static_cast<uint16_t>(std::lround(std::clamp(w, 0.f, 1.f) * 65535.f));
              q += static_cast<char>(v & 0xff);
              q += static_cast<char>(v >> 8);
            }
      }
      json tokens = json::array();
      for (int32_t id : e.ids) tokens.push_back(task ? task->token_text(id) : o.text.empty() ? std::to_string(id) : byte_token_text(id));
      ex_json.push_back({{"name", e.name}, {"T", T}, {"tokens", tokens}, {"patterns", base64(q)}});
    }
  }
  json data = {{"title", "headlab view: " + (o.run.empty() ? ckpt : o.run)},
               {"subtitle", std::to_string(L) + " layers x " + std::to_string(H) + " heads, d_model " +
                                std::to_string(cfg.d_model) + ", task " + (o.text.empty() ? tc.name : std::string("text")) +
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
  std::string page(kViewPage);
  const std::string marker = "/*HEADLAB_DATA*/";
  const size_t at = page.find(marker);
  if (at == std::string::npos) fail("headlab view: the page template has no data marker (a build problem)");
  page.replace(at, marker.size(), script_safe(data.dump()));
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
  sub->add_option("--text", o->text, "Show this text (models of --task text: one token per byte)")
      ->check(given)->excludes(tokens);
  sub->add_option("--task", o->task, "Task of the examples when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--examples", o->examples, "Held-out examples to show")->capture_default_str()->check(in_range(1, 64));
  sub->add_option("--seed", o->seed, "Seed of the held-out examples")->capture_default_str()->check(in_range(0, 1.8e19));
  sub->add_option("--threads", o->threads, "Threads")->capture_default_str()->check(in_range(1, 1024));
  sub->callback([&runner, o] { runner = [o] { return run_view(*o); }; });
}

}  // namespace hl
