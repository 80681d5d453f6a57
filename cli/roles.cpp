#include "cli/roles.h"

#include "analysis/detectors.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/table.h"
#include "cli/precision_option.h"
#include "cli/threads_option.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "models/sae.h"
#include "train/checkpoint_task.h"
#include "train/over_training.h"
#include "train/run_dir.h"

namespace hl {

std::pair<CLI::App*, std::shared_ptr<RoleOpts>> add_role_command(CLI::App& app, CommandRunner& runner, const std::string& name,
                                                                 const std::string& help, RoleRun run,
                                                                 const RoleOpts& defaults) {
  CLI::App* sub = app.add_subcommand(name, help);
  auto o = std::make_shared<RoleOpts>(defaults);
  RoleOpts& opts = *o;
  const std::string& command = name;
  sub->add_option("--checkpoint", opts.checkpoint, "Model checkpoint (safetensors, a run directory, or a Hugging Face model directory)")->required();
  sub->add_option("--out", opts.out, "Output directory (default: runs/" + command + "-<date>-<time>)");
  sub->add_option("--task", opts.task, "Task of the data when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--examples", opts.examples, "Sequences to average over")->capture_default_str()->check(in_range(1, 1e6));
  sub->add_option("--seed", opts.seed, "Seed of the sequences")->capture_default_str()->check(in_range(0, 1.8e19));
  add_threads_option(sub, opts.threads);
  // once per command, whichever run a command installs (edges its own)
  sub->parse_complete_callback([o] { o->threads = command_threads(o->threads); });
  add_precision_option(sub, opts.precision);
  sub->callback([&runner, o, run] {
    runner = [o, run] {
      const PrecisionScope precision(precision_from_flag(o->precision));
      return run(*o);
    };
  });
  return {sub, o};
}

void add_run_option(CLI::App* sub, RoleOpts& opts) {
  sub->get_option("--checkpoint")->required(false);
  sub->add_option("--run", opts.run,
                  "Each head's scores at every snapshot of this run (train --snapshot-every) and its final checkpoint, "
                  "instead of one --checkpoint: CSV, a PNG per score, and a panel of headlab view RUN");
}

bool over_training_requested(const RoleOpts& o) {
  if (!o.run.empty() && !o.checkpoint.empty())
    fail("give --checkpoint (one model) or --run (every snapshot of a run), not both");
  if (o.run.empty() && o.checkpoint.empty()) fail("give --checkpoint CK (one model) or --run RUN (every snapshot of a run)");
  return !o.run.empty();
}

HeadScoreOptions head_score_options(const RoleOpts& o) {
  HeadScoreOptions h;
  h.examples = o.examples;
  h.seed = o.seed;
  h.data = o.data;
  h.length = o.length;
  h.bos = o.bos;
  h.exclude_bos = o.detect.exclude_bos;
  h.exclude_current = o.detect.exclude_current;
  h.fallback_task = TaskConfig::preset(o.task);
  h.threads = o.threads;
  h.corruption = parse_corruption(o.corrupt);
  return h;
}

int write_scores_over_training(const std::string& run, const std::string& out_flag, const std::string& analysis,
                               const HeadScoreOptions& ho) {
  const std::string kind = head_analysis(analysis).command;  // the command that marks OUT
  const std::string out = out_flag.empty() ? over_training_dir(run, analysis) : out_flag;
  const ScoresOverTraining s = scores_over_training(run, analysis, ho, [&](size_t done, size_t total, int64_t step) {
    std::fprintf(stderr, "%s --run: step %lld (%zu of %zu)\n", kind.c_str(), static_cast<long long>(step), done, total);
  });
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, kind);
  const std::string stem = staged->staging() + "/" + analysis + "_over_training";
  write_scores_over_training_files(staged->staging(), s, ho);
  std::vector<std::vector<std::string>> table = {{"score", "head", "at the first step", "at the last step", "largest at step"}};
  for (size_t k = 0; k < s.score_names.size(); ++k) {
    std::vector<Series> lines;
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.heads; ++h) {
        Series line;
        line.name = "L" + std::to_string(l) + "H" + std::to_string(h);
        size_t best = 0;
        for (size_t i = 0; i < s.steps.size(); ++i) {
          const double v = s.at(k, i, l, h);
          if (std::isnan(v)) continue;
          line.x.push_back(static_cast<double>(s.steps[i]));
          line.y.push_back(v);
          if (v > s.at(k, best, l, h) || std::isnan(s.at(k, best, l, h))) best = i;
        }
        if (line.y.empty()) continue;  // (compose: layer 0 has no layer before it)
        table.push_back({s.score_names[k], line.name, fixed(line.y.front(), 3), fixed(line.y.back(), 3),
                         std::to_string(s.steps[best])});
        lines.push_back(std::move(line));
      }
    plot_lines(stem + "_" + s.score_names[k] + ".png", analysis + ": " + s.score_names[k] + " per head over training", "step",
               s.score_names[k], lines);
  }
  std::printf("%s per head over training: %zu checkpoints of %s (steps %lld..%lld), the same %d inputs at each\n\n",
              analysis.c_str(), s.steps.size(), run.c_str(), static_cast<long long>(s.steps.front()),
              static_cast<long long>(s.steps.back()), ho.examples);
  print_table(table);
  staged->publish();
  const std::string shown = out + "/" + analysis + "_over_training";
  std::printf("\nwrote %s.csv, %s.json, %s_<score>.png\n", shown.c_str(), shown.c_str(), shown.c_str());
  return 0;
}

std::vector<int64_t> parse_positions_flag(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    out.push_back(parse_int(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at), 0, int64_t{1} << 40, flag));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

RoleModel load_role_model(const RoleOpts& o) {
  set_num_threads(o.threads);
  SafetensorsFile f = read_checkpoint(o.checkpoint);
  // the task is read from the metadata, which the load keeps
  RoleModel r{load_model_releasing(f), nullptr, checkpoint_task(f, TaskConfig::preset(o.task))};
  for (const std::string& dir : o.saes) r.model->add_sae(std::make_shared<const Sae>(load_saelens(dir)));
  return r;
}

const Task& role_task(RoleModel& m, const std::string& checkpoint, const std::string& instead) {
  if (!m.task) m.task = task_for_model(m.model->cfg, m.config, checkpoint, instead);
  return *m.task;
}

PatchingInputs role_patching_inputs(RoleModel& m, const RoleOpts& o, double (*bytes)(const ModelConfig&, int64_t, int64_t),
                                    const std::string& command, bool probe) {
  const ModelConfig& cfg = m.model->cfg;
  HeadScoreOptions ho = head_score_options(o);
  ho.data = probe ? "probe" : "task";
  ho.bos = -1;
  auto task = [&]() -> const Task& { return role_task(m, o.checkpoint, "--data probe"); };
  const int64_t T = patching_sequence_length(cfg, ho, task);
  // `bytes` says whether the examples are one batch or chunks of rows
  announce_memory(command, bytes(cfg, o.examples, T) - 4.0 * static_cast<double>(parameter_count(cfg)),
                  std::to_string(o.examples) + " sequences of " + std::to_string(T) + " tokens",
                  probe ? "--examples or --length" : "--examples");
  return patching_inputs(cfg, ho, task);
}

void warn_if_corruption_changes_little(double clean_metric, double corrupted_metric) {
  const double gap = std::fabs(clean_metric - corrupted_metric);
  if (gap < kLeastPatchingGap)
    std::fprintf(stderr,
                 "headlab: warning: the corruption moves the logit difference by only %.4g (clean %.4f, corrupted %.4f, "
                 "less than %.2g): restored fractions divide by it and are noise, and every effect is small (has the model "
                 "learnt the task? --corrupt previous or another --task may fit it better)\n",
                 gap, clean_metric, corrupted_metric, kLeastPatchingGap);
}

void add_patching_data_options(CLI::App* sub, RoleOpts& opts) {
  sub->add_option("--data", opts.data,
                  "task: the task's held-out rows; probe: random tokens with a block of --length/2..--length tokens "
                  "repeated (any model, e.g. GPT-2's), the answer a token of the second copy, its first copy corrupted")
      ->capture_default_str()->check(CLI::IsMember({"task", "probe"}));
  sub->add_option("--length", opts.length, "probe: the longest block repeated (sequences of 2 x --length tokens); 0 = min(16, max_seq_len / 2)")
      ->capture_default_str()->check(in_range(0, 1 << 19));
}

std::string patching_data_name(const RoleOpts& o, const RoleModel& m) {
  return o.data == "probe" ? "the repeat probe" : "task " + m.config.name;
}

void add_corrupt_option(CLI::App* sub, RoleOpts& opts) {
  sub->add_option("--corrupt", opts.corrupt,
                  "Token each row's corrupted copy changes: source (the answer's earlier occurrence: what is copied) or "
                  "previous (the token before it, which the answer follows: what an induction head's key matches)")
      ->capture_default_str()->check(CLI::IsMember({"source", "previous"}));
}

void add_sae_option(CLI::App* sub, RoleOpts& opts) {
  sub->add_option("--sae", opts.saes,
                  "Attach this SAE (a directory from headlab sae, or SAELens's cfg.json + sae_weights.safetensors) at its "
                  "hook point, with its error term: the model's outputs are unchanged and its features become hook points "
                  "(HOOK.hook_sae_acts_post, HOOK.hook_sae_error, ...); repeat for several")
      ->check(CLI::ExistingDirectory);
}

Heatmap head_heatmap(const std::string& title, const HeadGrid& g, const std::string& row_prefix, const std::string& col_prefix) {
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
void write_head_table(const std::string& path, const std::vector<std::string>& names, const std::vector<HeadGrid>& grids,
                      bool quiet) {
  Table t(3);  // 6 digits in the CSV, 3 on screen
  for (size_t l = 0; l < grids[0].size(); ++l)
    for (size_t h = 0; h < grids[0][l].size(); ++h) {
      Table::Row row = t.row();
      row.integer("layer", static_cast<int64_t>(l)).integer("head", static_cast<int64_t>(h));
      for (size_t k = 0; k < grids.size(); ++k) row.number(names[k], grids[k][l][h], 6);
    }
  write_file_atomic(path, t.csv());
  if (!quiet) t.print();
}

void add_detector_columns(std::vector<std::string>& names, std::vector<HeadGrid>& grids, const std::string& name,
                          const HeadGrid& score, const HeadGrid& lo, const HeadGrid& hi) {
  names.insert(names.end(), {name, name + "_ci95_lo", name + "_ci95_hi"});
  grids.insert(grids.end(), {score, lo, hi});
}

void write_detect_files(const std::string& out, const std::vector<std::string>& names, const std::vector<HeadGrid>& grids,
                        bool quiet) {
  write_head_table(out + "/detect.csv", names, grids, quiet);
  std::vector<Heatmap> maps;
  for (size_t i = 0; i < names.size(); i += 3) maps.push_back(head_heatmap(names[i], grids[i], "L", "H"));
  plot_heatmap_grid(out + "/detect.png", "Head detector scores", 1, static_cast<int>(maps.size()), maps, "head", "layer", 0.f, 1.f);
}

void write_patch_files(const std::string& out, const PatchingResult& r, bool quiet) {
  write_head_table(out + "/patch_heads.csv", {"exact", "exact_ci95_lo", "exact_ci95_hi", "attribution"},
                   {r.z_exact, r.z_exact_ci95_lo, r.z_exact_ci95_hi, r.z_attribution}, quiet);
  std::string csv = "layer,position,exact,attribution\n";
  for (size_t l = 0; l < r.resid_exact.size(); ++l)
    for (size_t t = 0; t < r.resid_exact[l].size(); ++t)
      csv += std::to_string(l) + "," + std::to_string(t) + "," + fixed(r.resid_exact[l][t], 6) + "," +
             fixed(r.resid_attribution[l][t], 6) + "\n";
  write_file_atomic(out + "/patch_resid.csv", csv);
  plot_heatmap_grid(out + "/patch_heads.png", "Patching per head (hook_z)", 1, 2,
                    {head_heatmap("exact", r.z_exact, "L", "H"), head_heatmap("attribution", r.z_attribution, "L", "H")}, "head", "layer");
  plot_heatmap_grid(out + "/patch_resid.png", "Patching the residual stream per position (hook_resid_pre)", 2, 1,
                    {head_heatmap("exact", r.resid_exact, "L", ""), head_heatmap("attribution", r.resid_attribution, "L", "")},
                    "position", "layer");
}

void write_compose_files(const std::string& out, const std::vector<CompositionScores>& layers, const CompositionBaseline& base,
                         bool quiet) {
  std::string csv = "layer_a,head_a,layer_b,head_b,q,k,v\n";
  std::vector<std::vector<std::string>> table = {{"from", "to", "Q-comp", "K-comp", "V-comp"}};
  std::vector<Heatmap> maps;
  std::vector<std::string> random_row = {"random", "weights"};
  std::string base_csv = "kind,mean,p2_5,p97_5\n";
  for (int k = 0; k < 3; ++k) {  // beside the scores: what random weights of the same shapes score
    random_row.push_back(fixed(base.mean[k], 3) + " [" + fixed(base.lo[k], 3) + "-" + fixed(base.hi[k], 3) + "]");
    base_csv += std::string(1, "qkv"[k]) + "," + fixed(base.mean[k], 6) + "," + fixed(base.lo[k], 6) + "," + fixed(base.hi[k], 6) + "\n";
  }
  table.push_back(random_row);
  for (size_t l = 0; l < layers.size(); ++l) {
    const CompositionScores& c = layers[l];
    const size_t H = c.q.size();
    for (size_t a = 0; a < H; ++a)
      for (size_t b = 0; b < H; ++b) {
        csv += std::to_string(l) + "," + std::to_string(a) + "," + std::to_string(l + 1) + "," + std::to_string(b) + "," +
               fixed(c.q[a][b], 6) + "," + fixed(c.k[a][b], 6) + "," + fixed(c.v[a][b], 6) + "\n";
        table.push_back({"L" + std::to_string(l) + "H" + std::to_string(a), "L" + std::to_string(l + 1) + "H" + std::to_string(b),
                         fixed(c.q[a][b], 3), fixed(c.k[a][b], 3), fixed(c.v[a][b], 3)});
      }
    const std::string pre = "L" + std::to_string(l) + "->L" + std::to_string(l + 1) + " ";
    maps.push_back(head_heatmap(pre + "Q", c.q, "H", "H"));
    maps.push_back(head_heatmap(pre + "K", c.k, "H", "H"));
    maps.push_back(head_heatmap(pre + "V", c.v, "H", "H"));
  }
  if (!quiet) {
    std::printf("composition scores ||W_B W_A||_F / (||W_B||_F ||W_A||_F) between heads of consecutive layers; first row:\n"
                "the same scores of random weights of the same shapes (mean [95%% of them], 20 models), the level of no\n"
                "composition:\n\n");
    print_table(table);
  }
  write_file_atomic(out + "/compose.csv", csv);
  write_file_atomic(out + "/compose_baseline.csv", base_csv);
  plot_heatmap_grid(out + "/compose.png", "Composition (rows: earlier head, columns: later head)", static_cast<int>(layers.size()), 3,
                    maps, "head of the later layer", "head of the earlier layer");
}

}  // namespace hl
