// headlab compare RUN_A RUN_B: two finished runs side by side (e.g. a run and its fork): their
// held-out loss and accuracy over training, and their heads' detector scores at the end ->
// tables, compare.csv, compare_heads.csv, compare_loss.png, compare_accuracy.png in --out.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "analysis/matching.h"
#include "cli/threads_option.h"
#include "cli/commands.h"
#include "cli/plot.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/run_dir.h"
#include "train/sweep.h"

namespace hl {

namespace {

using json = nlohmann::json;

struct CompareOpts {
  std::vector<std::string> runs;
  std::string out;
  int examples = 200, threads = 2;
  double role_threshold = -1;  // < 0: each detector's random baseline (random_baseline_thresholds)
};

constexpr int kBaselineModels = 4;  // untrained models per run behind each detector's threshold

// "previous_token 0.213, duplicate_token 0.150, induction 0.094"
std::string thresholds_text(const HeadRoleScores& r, const std::vector<double>& t) {
  std::string s;
  for (size_t d = 0; d < r.detectors.size(); ++d) s += (d ? ", " : "") + r.detectors[d] + " " + fixed(t[d], 3);
  return s;
}

// "forked from FILE at step N, gate 1.0=0" from a run's stored settings, or "" for a run of its own.
std::string fork_note(const std::string& dir) {
  const json c = json::parse(read_file(dir + "/summary.json")).at("config");
  const std::string from = c.value("fork_from", "");
  if (from.empty()) return "";
  std::string s = "fork of " + from;
  for (const char* k : {"gate_heads", "freeze_heads", "reinit_heads"})
    for (const auto& v : c.value(k, json::array())) s += std::string(", ") + std::string(k).substr(0, std::string(k).find('_')) + " " + v.get<std::string>();
  return s;
}

std::string cell(const std::map<int64_t, EvalResult>& m, int64_t step, bool acc) {
  const auto it = m.find(step);
  if (it == m.end()) return "";
  return acc ? fixed(100 * it->second.token_acc, 2) : fixed(it->second.loss, 5);
}

int run_compare(const CompareOpts& o) {
  if (o.runs.size() != 2) fail("compare: give two run directories (RUN_A RUN_B), got ", o.runs.size());
  set_num_threads(command_threads(o.threads));
  std::vector<SweepRun> runs;
  std::vector<HeadRoleScores> roles;
  std::vector<std::unique_ptr<TransformerLM>> models;
  for (const std::string& dir : o.runs) {
    if (!std::filesystem::is_directory(dir)) fail(dir, ": no such run directory");
    if (!run_finished(dir)) fail(dir, ": not a finished run of headlab train (no summary.json saying it finished)");
    runs.push_back(read_finished_run(dir, 0, 0, "compare reads a run's summary.json and metrics.jsonl as headlab train wrote them"));
    models.push_back(load_model(dir + "/model.safetensors"));
  }
  MatchCost cost;  // the models' probes in turn: the passes add up, the memory of one at a time
  for (const auto& m : models) {
    const MatchCost c = detector_roles_cost(*m, o.examples);
    // the run's model and, for the thresholds, its untrained baselines
    cost.forward_passes += c.forward_passes * (o.role_threshold < 0 ? 1 + kBaselineModels : 1);
    cost.memory_bytes = std::max(cost.memory_bytes, c.memory_bytes);
  }
  announce_memory("compare", cost.memory_bytes, std::to_string(o.examples) + " probe rows per run in about " +
                  std::to_string(cost.forward_passes) + " forward passes of up to 64 rows", "--examples");
  std::vector<std::vector<double>> thresholds;  // per run, per detector
  for (const auto& m : models) {
    roles.push_back(detector_role_scores(*m, o.examples));
    thresholds.push_back(o.role_threshold >= 0 ? std::vector<double>(roles.back().detectors.size(), o.role_threshold)
                                               : random_baseline_thresholds(m->cfg, o.examples, 1234, kBaselineModels));
  }
  const std::string out = o.out.empty() ? default_out_dir("compare") : o.out;
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "compare");
  std::printf("A: %s%s\nB: %s%s\n\n", o.runs[0].c_str(), (fork_note(o.runs[0]).empty() ? "" : " (" + fork_note(o.runs[0]) + ")").c_str(),
              o.runs[1].c_str(), (fork_note(o.runs[1]).empty() ? "" : " (" + fork_note(o.runs[1]) + ")").c_str());
  // ---- trajectories, by step (the union of both runs' eval steps)
  std::map<int64_t, EvalResult> ca, cb;
  for (auto& [s, e] : runs[0].curve) ca[s] = e;
  for (auto& [s, e] : runs[1].curve) cb[s] = e;
  std::map<int64_t, int> steps;
  for (auto& [s, _] : ca) steps[s] = 1;
  for (auto& [s, _] : cb) steps[s] = 1;
  std::vector<std::vector<std::string>> table = {{"step", "A loss", "B loss", "A token acc %", "B token acc %"}};
  std::string csv = "step,loss_a,loss_b,token_acc_a,token_acc_b\n";
  for (auto& [s, _] : steps) {
    table.push_back({std::to_string(s), cell(ca, s, false), cell(cb, s, false), cell(ca, s, true), cell(cb, s, true)});
    auto raw = [&](const std::map<int64_t, EvalResult>& m, bool acc) {
      const auto it = m.find(s);
      return it == m.end() ? std::string() : fixed(acc ? it->second.token_acc : it->second.loss, 6);
    };
    csv += std::to_string(s) + "," + raw(ca, false) + "," + raw(cb, false) + "," + raw(ca, true) + "," + raw(cb, true) + "\n";
  }
  std::printf("held-out loss and token accuracy over training:\n\n");
  print_table(table);
  // ---- the heads' detector scores at the end
  std::printf("\nheads' detector scores at the end (share of attention on the pattern, probe of %d sequences);\n", o.examples);
  std::printf("a head's role is the detector it scores highest on among those it scores above the threshold of:\n");
  if (o.role_threshold >= 0) {
    std::printf("  %s (--role-threshold)\n\n", thresholds_text(roles[0], thresholds[0]).c_str());
  } else {
    const bool same = thresholds[0] == thresholds[1];
    for (int r = 0; r < (same ? 1 : 2); ++r)
      std::printf("  %s%s\n", same ? "" : (r == 0 ? "A: " : "B: "), thresholds_text(roles[r], thresholds[r]).c_str());
    std::printf("  (the largest score of any head of %d untrained models of the same shape on this probe; "
                "--role-threshold sets one for all)\n\n", kBaselineModels);
  }
  const ModelConfig &ma = models[0]->cfg, &mb = models[1]->cfg;
  const int L = std::max(ma.n_layers, mb.n_layers), H = std::max(ma.n_heads, mb.n_heads);
  std::vector<std::string> header = {"head"};
  std::string hcsv = "layer,head";
  for (const std::string& d : roles[0].detectors) header.push_back(d + " A"), header.push_back(d + " B"), hcsv += "," + d + "_a," + d + "_b";
  hcsv += ",role_a,role_b\n";
  header.push_back("role A"), header.push_back("role B");
  std::vector<std::vector<std::string>> heads = {header};
  auto score = [&](int r, size_t d, int l, int h) {
    const ModelConfig& c = r == 0 ? ma : mb;
    return l < c.n_layers && h < c.n_heads ? fixed(roles[r].scores[d][l][h], 3) : std::string();
  };
  auto role = [&](int r, int l, int h) {
    const ModelConfig& c = r == 0 ? ma : mb;
    return l < c.n_layers && h < c.n_heads ? head_role(roles[r], l, h, thresholds[r]) : std::string();
  };
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      std::vector<std::string> row = {std::to_string(l) + "." + std::to_string(h)};
      hcsv += std::to_string(l) + "," + std::to_string(h);
      for (size_t d = 0; d < roles[0].detectors.size(); ++d) {
        row.push_back(score(0, d, l, h)), row.push_back(score(1, d, l, h));
        hcsv += "," + score(0, d, l, h) + "," + score(1, d, l, h);
      }
      row.push_back(role(0, l, h)), row.push_back(role(1, l, h));
      hcsv += "," + role(0, l, h) + "," + role(1, l, h) + "\n";
      heads.push_back(row);
    }
  print_table(heads);
  write_file_atomic(staged->file("compare.csv"), csv);
  write_file_atomic(staged->file("compare_heads.csv"), hcsv);
  std::vector<Series> loss(2), acc(2);
  for (int r = 0; r < 2; ++r) {
    loss[r].name = acc[r].name = r == 0 ? "A" : "B";
    for (auto& [s, e] : runs[r].curve) {
      loss[r].x.push_back(static_cast<double>(s)), loss[r].y.push_back(e.loss);
      acc[r].x.push_back(static_cast<double>(s)), acc[r].y.push_back(100 * e.token_acc);
    }
  }
  plot_lines(staged->file("compare_loss.png"), "Held-out loss: A " + o.runs[0] + ", B " + o.runs[1], "step", "loss", loss, true);
  plot_lines(staged->file("compare_accuracy.png"), "Held-out token accuracy", "step", "token accuracy (%)", acc);
  // the two runs as the page names them (headlab view RUN --compare OUT)
  auto label = [&](int r) { return o.runs[r] + (fork_note(o.runs[r]).empty() ? "" : " (" + fork_note(o.runs[r]) + ")"); };
  json role_thresholds = json::object();
  for (int r = 0; r < 2; ++r)
    for (size_t d = 0; d < roles[r].detectors.size(); ++d) role_thresholds[r == 0 ? "a" : "b"][roles[r].detectors[d]] = thresholds[r][d];
  write_file_atomic(staged->file("compare.json"),
                    nlohmann::json{{"a", label(0)}, {"b", label(1)}, {"role_thresholds", role_thresholds},
                                   {"role_thresholds_from", o.role_threshold >= 0 ? "--role-threshold" : "random baseline"}}
                            .dump(2) + "\n");
  staged->publish();
  std::printf("\nwrote %s/{compare.csv,compare_heads.csv,compare.json,compare_loss.png,compare_accuracy.png}\n"
              "the page: headlab view %s --compare %s\n", out.c_str(), o.runs[1].c_str(), out.c_str());
  return 0;
}

}  // namespace

void add_compare_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("compare", "Two finished runs side by side (e.g. a run and its fork): loss and accuracy "
                                                "over training, the heads' detector scores at the end");
  auto o = std::make_shared<CompareOpts>();
  sub->add_option("runs", o->runs, "RUN_A RUN_B: run directories of headlab train")->required()->expected(2);
  sub->add_option("--examples", o->examples, "Probe sequences for the detectors")->capture_default_str()->check(in_range(1, 1e6));
  sub->add_option("--out", o->out, "Output directory (default: runs/compare-<date>-<time>)");
  sub->add_option("--role-threshold", o->role_threshold,
                  "One score at which a head takes a detector's role, for every detector (default: each detector's "
                  "random baseline, the largest score of any head of 4 untrained models of the same shape)")
      ->check(in_range(0, 1));
  add_threads_option(sub, o->threads);
  sub->callback([&runner, o] { runner = [o] { return run_compare(*o); }; });
}

}  // namespace hl
