// What heads do: headlab detect (previous-token, duplicate-token and induction scores),
// headlab patch (activation and attribution patching per head and per position) and
// headlab compose (Q/K/V composition between layers). Each: flags -> one analysis call ->
// table, CSV and heatmap PNG in --out.
#include <cstdio>
#include <memory>

#include "train/run_dir.h"
#include "analysis/circuits.h"
#include "analysis/detectors.h"
#include "analysis/patching.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/commands.h"
#include "train/plot.h"

namespace hl {

namespace {

struct RoleOpts {
  std::string checkpoint, out, data = "probe", pattern_file, task = "copy";
  int examples = 200, length = 0, threads = 2;
  uint64_t seed = 1234;
  bool exclude_bos = false, exclude_current = false;
};

void add_common(CLI::App* sub, RoleOpts& o, const std::string& command) {
  sub->add_option("--checkpoint", o.checkpoint, "Model checkpoint (safetensors)")->required();
  sub->add_option("--out", o.out, "Output directory (default: runs/" + command + "-<date>-<time>)");
  sub->add_option("--task", o.task, "Task of the data when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--examples", o.examples, "Sequences to average over")->capture_default_str()->check(in_range(1, 1e6));
  sub->add_option("--seed", o.seed, "Seed of the sequences")->capture_default_str()->check(in_range(0, 1.8e19));
  sub->add_option("--threads", o.threads, "Threads")->capture_default_str()->check(in_range(1, 1024));
}

struct Loaded {
  std::unique_ptr<TransformerLM> model;
  std::unique_ptr<Task> task;
  TaskConfig config;
};
Loaded load(const RoleOpts& o) {
  set_num_threads(o.threads);
  const SafetensorsFile f = read_safetensors(o.checkpoint);
  Loaded r{load_model(f), nullptr, task_for(f, TaskConfig::preset(o.task))};
  return r;
}
const Task& task_of(Loaded& m, const std::string& checkpoint) {
  if (!m.task) {
    m.task = make_task(m.config);
    if (m.task->vocab_size() != m.model->cfg.vocab_size)
      fail(checkpoint, ": the model's vocabulary (", m.model->cfg.vocab_size, ") does not fit task ", m.config.name, " (",
           m.task->vocab_size(), "); give --task");
  }
  return *m.task;
}

Heatmap heat(const std::string& title, const HeadGrid& g, const std::string& row_prefix, const std::string& col_prefix) {
  Heatmap m;
  m.title = title;
  m.rows = static_cast<int>(g.size());
  m.cols = m.rows ? static_cast<int>(g[0].size()) : 0;
  for (auto& row : g)
    for (double v : row) m.values.push_back(static_cast<float>(v));
  for (int c = 0; c < m.cols; ++c) m.xlabels.push_back(col_prefix + std::to_string(c));
  for (int r = 0; r < m.rows; ++r) m.ylabels.push_back(row_prefix + std::to_string(r));
  return m;
}

// One table and CSV with a row per (layer, head) and a column per grid.
void write_head_table(const std::string& path, const std::vector<std::string>& names, const std::vector<HeadGrid>& grids) {
  std::string csv = "layer,head";
  std::vector<std::string> header = {"layer", "head"};
  for (auto& n : names) csv += "," + n, header.push_back(n);
  csv += "\n";
  std::vector<std::vector<std::string>> table = {header};
  for (size_t l = 0; l < grids[0].size(); ++l)
    for (size_t h = 0; h < grids[0][l].size(); ++h) {
      std::vector<std::string> row = {std::to_string(l), std::to_string(h)};
      csv += std::to_string(l) + "," + std::to_string(h);
      for (const HeadGrid& g : grids) csv += "," + fixed(g[l][h], 6), row.push_back(fixed(g[l][h], 3));
      csv += "\n";
      table.push_back(row);
    }
  write_file_atomic(path, csv);
  print_table(table);
}

int run_detect(const RoleOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("detect") : o.out;
  Loaded m = load(o);
  const ModelConfig& cfg = m.model->cfg;
  std::vector<Batch> data;
  if (o.data == "probe") {
    const int k = o.length > 0 ? o.length : static_cast<int>(std::min<int64_t>(16, cfg.max_seq_len / 2));
    if (2 * k > cfg.max_seq_len) fail("--length ", k, ": the probe's ", 2 * k, " tokens exceed the model's max_seq_len ", cfg.max_seq_len);
    data = repeated_random_tokens(o.examples, k, static_cast<int>(cfg.vocab_size), o.seed);
  } else {
    data = task_of(m, o.checkpoint).held_out(o.examples, o.seed, 64);
  }
  DetectorOptions opt{o.exclude_bos, o.exclude_current};
  std::vector<std::string> names;
  std::vector<HeadGrid> grids;
  if (!o.pattern_file.empty()) {
    const SafetensorsFile pf = read_safetensors(o.pattern_file);
    if (!pf.has("pattern")) fail(o.pattern_file, ": no 'pattern' tensor (expected pattern (T, T), float32)");
    const Tensor p = pf.f32("pattern");
    if (p.ndim() != 2 || p.size(0) != p.size(1) || p.size(0) < 1)
      fail(o.pattern_file, ": pattern must be (T, T) with T of 1 or more, got ", p.shape().str());
    check_finite(p, "pattern", o.pattern_file);
    names.push_back("custom");
    grids.push_back(detect_heads(*m.model, data, Detector::PreviousToken, opt, p.to_vector(), p.size(0)));
  } else {
    for (Detector d : {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction}) {
      names.push_back(to_string(d));
      grids.push_back(detect_heads(*m.model, data, d, opt));
    }
  }
  claim_output_dir(out, "detect");
  std::printf("head detector scores (share of attention on the pattern; %d sequences of %s%s%s):\n\n", o.examples,
              o.data == "probe" ? "repeated random tokens" : ("task " + m.config.name).c_str(),
              o.exclude_bos ? ", BOS excluded" : "", o.exclude_current ? ", current token excluded" : "");
  write_head_table(out + "/detect.csv", names, grids);
  std::vector<Heatmap> maps;
  for (size_t i = 0; i < names.size(); ++i) maps.push_back(heat(names[i], grids[i], "L", "H"));
  plot_heatmap_grid(out + "/detect.png", "Head detector scores", 1, static_cast<int>(maps.size()), maps, "head", "layer", 0.f, 1.f);
  std::printf("\nwrote %s/detect.csv, detect.png\n", out.c_str());
  return 0;
}

int run_patch(const RoleOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("patch") : o.out;
  Loaded m = load(o);
  const Task& task = task_of(m, o.checkpoint);
  // every example is in one batch, cached twice, with gradients once
  check_fits_in_memory(patching_memory_bytes(m.model->cfg, o.examples, task.seq_len()),
                       "--examples " + std::to_string(o.examples) + " of " + std::to_string(task.seq_len()) + " tokens");
  const std::vector<Batch> held = task.held_out(o.examples, o.seed, o.examples);
  const PatchingInputs in = corrupt_one_symbol(held[0], task.symbols(), o.seed);
  const PatchingResult r = activation_patching(*m.model, in);
  claim_output_dir(out, "patch");
  std::printf("activation patching, %zu rows of task %s (one source symbol corrupted); logit difference clean %.4f, "
              "corrupted %.4f; 1 = the clean run's, 0 = the corrupted run's\n\nper head (hook_z):\n\n",
              in.answers.size(), m.config.name.c_str(), r.clean_metric, r.corrupted_metric);
  write_head_table(out + "/patch_heads.csv", {"exact", "attribution"}, {r.z_exact, r.z_attribution});
  std::string csv = "layer,position,exact,attribution\n";
  for (size_t l = 0; l < r.resid_exact.size(); ++l)
    for (size_t t = 0; t < r.resid_exact[l].size(); ++t)
      csv += std::to_string(l) + "," + std::to_string(t) + "," + fixed(r.resid_exact[l][t], 6) + "," +
             fixed(r.resid_attribution[l][t], 6) + "\n";
  write_file_atomic(out + "/patch_resid.csv", csv);
  std::printf("\ncorrelation of attribution with exact patching: heads %.3f, residual positions %.3f\n", r.z_correlation,
              r.resid_correlation);
  plot_heatmap_grid(out + "/patch_heads.png", "Patching per head (hook_z)", 1, 2,
                    {heat("exact", r.z_exact, "L", "H"), heat("attribution", r.z_attribution, "L", "H")}, "head", "layer");
  plot_heatmap_grid(out + "/patch_resid.png", "Patching the residual stream per position (hook_resid_pre)", 2, 1,
                    {heat("exact", r.resid_exact, "L", ""), heat("attribution", r.resid_attribution, "L", "")},
                    "position", "layer");
  std::printf("wrote %s/patch_heads.csv, patch_resid.csv, patch_heads.png, patch_resid.png\n", out.c_str());
  return 0;
}

int run_compose(const RoleOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("compose") : o.out;
  Loaded m = load(o);
  const int L = m.model->cfg.n_layers, H = m.model->cfg.n_heads;
  if (L < 2) fail(o.checkpoint, ": composition needs at least 2 layers, the model has ", L);
  claim_output_dir(out, "compose");
  std::string csv = "layer_a,head_a,layer_b,head_b,q,k,v\n";
  std::vector<std::vector<std::string>> table = {{"from", "to", "Q-comp", "K-comp", "V-comp"}};
  std::vector<Heatmap> maps;
  for (int l = 0; l + 1 < L; ++l) {
    const CompositionScores c = composition_scores(*m.model, l, l + 1);
    for (int a = 0; a < H; ++a)
      for (int b = 0; b < H; ++b) {
        csv += std::to_string(l) + "," + std::to_string(a) + "," + std::to_string(l + 1) + "," + std::to_string(b) + "," +
               fixed(c.q[a][b], 6) + "," + fixed(c.k[a][b], 6) + "," + fixed(c.v[a][b], 6) + "\n";
        table.push_back({"L" + std::to_string(l) + "H" + std::to_string(a), "L" + std::to_string(l + 1) + "H" + std::to_string(b),
                         fixed(c.q[a][b], 3), fixed(c.k[a][b], 3), fixed(c.v[a][b], 3)});
      }
    const std::string pre = "L" + std::to_string(l) + "->L" + std::to_string(l + 1) + " ";
    maps.push_back(heat(pre + "Q", c.q, "H", "H"));
    maps.push_back(heat(pre + "K", c.k, "H", "H"));
    maps.push_back(heat(pre + "V", c.v, "H", "H"));
  }
  std::printf("composition scores ||W_B W_A||_F / (||W_B||_F ||W_A||_F) between heads of consecutive layers:\n\n");
  print_table(table);
  write_file_atomic(out + "/compose.csv", csv);
  plot_heatmap_grid(out + "/compose.png", "Composition (rows: earlier head, columns: later head)", L - 1, 3, maps,
                    "head of the later layer", "head of the earlier layer");
  std::printf("\nwrote %s/compose.csv, compose.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_role_commands(CLI::App& app, CommandRunner& runner) {
  {
    CLI::App* sub = app.add_subcommand("detect", "Head detectors: previous-token, duplicate-token and induction scores per head");
    auto o = std::make_shared<RoleOpts>();
    add_common(sub, *o, "detect");
    sub->add_option("--data", o->data, "probe: repeated random tokens [r r]; task: the task's held-out sequences")
        ->capture_default_str()->check(CLI::IsMember({"probe", "task"}));
    sub->add_option("--length", o->length, "Tokens repeated in the probe; 0 = min(16, max_seq_len / 2)")
        ->capture_default_str()->check(in_range(0, 1 << 19));
    sub->add_flag("--exclude-bos", o->exclude_bos, "Ignore attention to position 0");
    sub->add_flag("--exclude-current-token", o->exclude_current, "Ignore attention of a token to itself");
    sub->add_option("--pattern", o->pattern_file, "Score against your own pattern instead: a safetensors file with pattern (T, T)");
    sub->callback([&runner, o] { runner = [o] { return run_detect(*o); }; });
  }
  {
    CLI::App* sub = app.add_subcommand("patch", "Activation and attribution patching per head (hook_z) and per residual position");
    auto o = std::make_shared<RoleOpts>();
    o->examples = 64;
    add_common(sub, *o, "patch");
    sub->callback([&runner, o] { runner = [o] { return run_patch(*o); }; });
  }
  {
    CLI::App* sub = app.add_subcommand("compose", "Q-, K- and V-composition scores between heads of consecutive layers");
    auto o = std::make_shared<RoleOpts>();
    add_common(sub, *o, "compose");
    sub->callback([&runner, o] { runner = [o] { return run_compose(*o); }; });
  }
}

}  // namespace hl
