// headlab match: the heads of two models matched one to one (analysis/matching.h) by attention
// pattern on shared prompts or by QK/OV circuit weights, beside each head's detector role:
// flags -> match_heads, detector_role_scores -> table, match.csv, match.json, match.png in --out.
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
#include "train/over_training.h"
#include "train/run_dir.h"
#include "train/snapshots.h"

namespace hl {

namespace {

using json = nlohmann::json;

struct MatchOpts {
  std::vector<std::string> checkpoints;
  std::string run;  // --run: every step against the last
  std::string out, by = "pattern";
  bool across_layers = false;
  int examples = 200, threads = 2;
  uint64_t seed = 1234;
  double threshold = 0.4;
};

// A checkpoint file, a model directory, a run directory of headlab train (its
// checkpoint.safetensors), or a directory of a model's revisions (step0, step1000, ... as
// downloaded: its last; DIR/stepN names another).
std::string checkpoint_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  if (file_exists(path + "/checkpoint.safetensors")) return path + "/checkpoint.safetensors";
  if (!file_exists(path + "/config.json"))
    if (const std::vector<int64_t> steps = revision_steps(path); !steps.empty()) return revision_path(path, steps.back());
  return path;
}

std::string head_name(int l, int h) { return std::to_string(l) + "." + std::to_string(h); }

json roles_json(const HeadRoleScores& r, int layers, int heads, double threshold) {
  json out = json::array();
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) {
      json scores;
      for (size_t d = 0; d < r.detectors.size(); ++d) scores[r.detectors[d]] = r.scores[d][l][h];
      out.push_back({{"layer", l}, {"head", h}, {"role", head_role(r, l, h, threshold)}, {"scores", scores}});
    }
  return out;
}

// A matched against B: the matching and A's roles; the pairs' roles once the caller has B's role
// scores (--run matches every step against one last model, whose scores it computes once).
struct MatchReport {
  HeadMatch m;
  HeadRoleScores ra;
  PairRoles pr;
};
MatchReport match_models(TransformerLM& a, TransformerLM& b, const MatchOpts& o, MatchBy by) {
  const MatchCost cost = match_cost(a, b, o.examples, by == MatchBy::Pattern);
  announce_memory("match", cost.memory_bytes, std::to_string(o.examples) + " probe rows in about " +
                  std::to_string(cost.forward_passes) + " forward passes of up to 64 rows", "--examples");
  const std::vector<Batch> probe = by == MatchBy::Pattern ? match_probe(a, b, o.examples, o.seed) : std::vector<Batch>{};
  MatchReport r;
  r.m = match_heads(a, b, probe, {by, o.across_layers});
  r.ra = detector_role_scores(a, o.examples, o.seed);
  return r;
}

// match.csv's rows (layer_a,head_a,role_a,layer_b,head_b,role_b,similarity: the pairs, then A's and
// B's unmatched heads), each after `prefix`, and the same as a table.
std::string match_rows(const MatchReport& r, const HeadRoleScores& rb, double threshold, const std::string& prefix,
                       std::vector<std::vector<std::string>>* table = nullptr) {
  const HeadMatch& m = r.m;
  std::string csv;
  for (size_t i = 0; i < m.pairs.size(); ++i) {
    const HeadPair& p = m.pairs[i];
    if (table) table->push_back({head_name(p.layer_a, p.head_a), r.pr.role_a[i], head_name(p.layer_b, p.head_b), r.pr.role_b[i], fixed(p.similarity, 4)});
    csv += prefix + std::to_string(p.layer_a) + "," + std::to_string(p.head_a) + "," + r.pr.role_a[i] + "," + std::to_string(p.layer_b) +
           "," + std::to_string(p.head_b) + "," + r.pr.role_b[i] + "," + fixed(p.similarity, 6) + "\n";
  }
  for (auto [l, h] : m.unmatched_a) {
    if (table) table->push_back({head_name(l, h), head_role(r.ra, l, h, threshold), "-", "", ""});
    csv += prefix + std::to_string(l) + "," + std::to_string(h) + "," + head_role(r.ra, l, h, threshold) + ",,,,\n";
  }
  for (auto [l, h] : m.unmatched_b) {
    if (table) table->push_back({"-", "", head_name(l, h), head_role(rb, l, h, threshold), ""});
    csv += prefix + ",,," + std::to_string(l) + "," + std::to_string(h) + "," + head_role(rb, l, h, threshold) + ",\n";
  }
  return csv;
}

constexpr const char* kMatchColumns = "layer_a,head_a,role_a,layer_b,head_b,role_b,similarity";

// --run DIR: every step's model matched against the last step's (which heads of the end were
// there, and in which role, at each step), one line per step; match_over_training.csv holds
// match.csv's rows of each step after a step column.
int run_match_over_training(const MatchOpts& o, MatchBy by) {
  const RunCheckpoints rs = run_checkpoints(o.run);
  if (rs.steps.size() < 2) fail("--run ", o.run, ": has one step (", rs.steps[0], "); matching over training needs two or more");
  const std::string last = rs.files.back();
  std::unique_ptr<TransformerLM> b = load_model(read_run_checkpoint(rs, rs.steps.size() - 1));
  HeadRoleScores rb;
  std::vector<std::vector<std::string>> table = {{"step", "mean similarity", "pairs sharing a role"}};
  std::string csv = std::string("step,") + kMatchColumns + "\n";
  json steps = json::array();
  for (size_t i = 0; i + 1 < rs.steps.size(); ++i) {
    std::unique_ptr<TransformerLM> a = load_model(read_run_checkpoint(rs, i));
    MatchReport r = match_models(*a, *b, o, by);
    if (i == 0) rb = detector_role_scores(*b, o.examples, o.seed);
    r.pr = pair_roles(r.m, r.ra, rb, o.threshold);
    csv += match_rows(r, rb, o.threshold, std::to_string(rs.steps[i]) + ",");
    table.push_back({std::to_string(rs.steps[i]), fixed(r.m.mean_similarity, 4),
                     std::to_string(r.pr.same_role) + " of " + std::to_string(r.m.pairs.size())});
    steps.push_back({{"step", rs.steps[i]}, {"checkpoint", rs.files[i]}, {"mean_similarity", r.m.mean_similarity},
                     {"same_role_pairs", r.pr.same_role}, {"pairs", r.m.pairs.size()}});
  }
  const std::string out = o.out.empty() ? default_out_dir("match") : o.out;
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "match");
  std::printf("the heads of every step of %s matched to the heads of its last step %lld (%s) by %s%s; role = detector scoring "
              ">= %.2f on the probe\n\n",
              o.run.c_str(), static_cast<long long>(rs.steps.back()), last.c_str(), to_string(by).c_str(),
              o.across_layers ? ", across layers" : ", within layers", o.threshold);
  print_table(table);
  write_file_atomic(staged->file("match_over_training.csv"), csv);
  write_file_atomic(staged->file("match_over_training.json"),
                    json({{"run", o.run}, {"against_step", rs.steps.back()}, {"against", last}, {"by", to_string(by)},
                          {"across_layers", o.across_layers}, {"role_threshold", o.threshold}, {"probe_examples", o.examples},
                          {"seed", o.seed}, {"steps", steps}})
                            .dump(2) + "\n");
  staged->publish();
  std::printf("\nwrote %s/{match_over_training.csv,match_over_training.json}\n", out.c_str());
  return 0;
}

int run_match(const MatchOpts& o) {
  set_num_threads(command_threads(o.threads));
  const MatchBy by = parse_match_by(o.by);
  if (!o.run.empty()) {
    if (!o.checkpoints.empty()) fail("--run matches every step of a run against its last: give it without --checkpoint");
    return run_match_over_training(o, by);
  }
  if (o.checkpoints.size() != 2)
    fail("--checkpoint: give exactly two (A and B), got ", o.checkpoints.size(), " (or --run DIR: every step against the last)");
  const std::string path_a = checkpoint_file(o.checkpoints[0]), path_b = checkpoint_file(o.checkpoints[1]);
  std::unique_ptr<TransformerLM> a = load_model(path_a), b = load_model(path_b);
  MatchReport r = match_models(*a, *b, o, by);
  const HeadRoleScores rb = detector_role_scores(*b, o.examples, o.seed);
  r.pr = pair_roles(r.m, r.ra, rb, o.threshold);
  const HeadMatch& m = r.m;
  const HeadRoleScores& ra = r.ra;
  const PairRoles& pr = r.pr;

  const std::string out = o.out.empty() ? default_out_dir("match") : o.out;
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "match");
  std::printf("heads of A (%s) matched to heads of B (%s) by %s%s; role = detector scoring >= %.2f on the probe\n\n",
              path_a.c_str(), path_b.c_str(),
              by == MatchBy::Pattern ? "attention pattern (1 - Jensen-Shannon divergence, mean over the probe's queries)"
                                     : "QK and OV circuit weights (mean of the two cosines)",
              o.across_layers ? ", across layers" : ", within layers", o.threshold);
  std::vector<std::vector<std::string>> table = {{"A head", "A role", "B head", "B role", "similarity"}};
  std::string csv = std::string(kMatchColumns) + "\n" + match_rows(r, rb, o.threshold, "", &table);
  json pairs = json::array();
  for (size_t i = 0; i < m.pairs.size(); ++i) {
    const HeadPair& p = m.pairs[i];
    pairs.push_back({{"a", {p.layer_a, p.head_a}}, {"b", {p.layer_b, p.head_b}}, {"role_a", pr.role_a[i]}, {"role_b", pr.role_b[i]},
                     {"similarity", p.similarity}});
  }
  print_table(table);
  // which roles each model has, and how many of them the matching pairs with the same role
  std::map<std::string, int> count_a, count_b;
  for (int l = 0; l < m.layers_a; ++l)
    for (int h = 0; h < m.heads_a; ++h) ++count_a[head_role(ra, l, h, o.threshold)];
  for (int l = 0; l < m.layers_b; ++l)
    for (int h = 0; h < m.heads_b; ++h) ++count_b[head_role(rb, l, h, o.threshold)];
  std::printf("\nmean similarity of the pairs %.4f; %d of %zu pairs share a role\n", m.mean_similarity, pr.same_role, m.pairs.size());
  json recur;
  for (const std::string& role : ra.detectors) {
    int same = 0;
    for (size_t i = 0; i < m.pairs.size(); ++i) same += pr.role_a[i] == role && pr.role_b[i] == role;
    std::printf("  %-16s A %d head(s), B %d head(s), matched to each other %d\n", role.c_str(), count_a[role], count_b[role], same);
    recur[role] = {{"a", count_a[role]}, {"b", count_b[role]}, {"matched", same}};
  }
  Heatmap hm;
  hm.title = "similarity, rows = heads of A, columns = heads of B";
  hm.rows = m.layers_a * m.heads_a;
  hm.cols = m.layers_b * m.heads_b;
  for (const auto& row : m.similarity)
    for (double v : row) hm.values.push_back(static_cast<float>(v));
  for (int i = 0; i < hm.rows; ++i) hm.ylabels.push_back(head_name(i / m.heads_a, i % m.heads_a));
  for (int j = 0; j < hm.cols; ++j) hm.xlabels.push_back(head_name(j / m.heads_b, j % m.heads_b));
  write_file_atomic(staged->file("match.csv"), csv);
  write_file_atomic(staged->file("match.json"),
                    json({{"a", path_a}, {"b", path_b}, {"by", to_string(by)}, {"across_layers", o.across_layers},
                          {"role_threshold", o.threshold}, {"probe_examples", o.examples}, {"seed", o.seed},
                          {"mean_similarity", m.mean_similarity}, {"same_role_pairs", pr.same_role}, {"pairs", pairs},
                          {"roles", recur}, {"heads_a", roles_json(ra, m.layers_a, m.heads_a, o.threshold)},
                          {"heads_b", roles_json(rb, m.layers_b, m.heads_b, o.threshold)}, {"similarity", m.similarity}})
                            .dump(2) + "\n");
  plot_heatmap_grid(staged->file("match.png"), "Head similarity (" + to_string(by) + ")", 1, 1, {hm}, "head of B (layer.head)",
                    "head of A (layer.head)");
  staged->publish();
  std::printf("\nwrote %s/{match.csv,match.json,match.png}\n", out.c_str());
  return 0;
}

}  // namespace

void add_match_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("match", "Match the heads of two models one to one (by attention pattern or circuit weights), "
                                              "with each head's detector role");
  auto o = std::make_shared<MatchOpts>();
  sub->add_option("--checkpoint", o->checkpoints, "Model A, then model B (give it twice): checkpoint files, model or run directories, "
                                               "or a directory of revisions (its last; DIR/stepN for another)")
      ->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--run", o->run, "Instead: every step of a run (its snapshots and final checkpoint, or a directory of revisions "
                                   "step0, step1000, ...) matched against its last step; one line per step, "
                                   "match_over_training.csv");
  sub->add_option("--by", o->by, "pattern: attention patterns on a shared probe (any two models); weights: QK and OV circuits "
                                 "(models sharing a residual basis, e.g. forks of one run)")
      ->capture_default_str()->check(CLI::IsMember({"pattern", "weights"}));
  sub->add_flag("--across-layers", o->across_layers, "One assignment over all heads (default: layer l of A with layer l of B)");
  sub->add_option("--examples", o->examples, "Probe sequences (pattern similarity and the detectors)")->capture_default_str()
      ->check(in_range(1, 1e6));
  sub->add_option("--seed", o->seed, "Seed of the probe")->capture_default_str()->check(in_range(0, 1.8e19));
  sub->add_option("--role-threshold", o->threshold, "A head's role is the detector scoring at least this (else none)")
      ->capture_default_str()->check(in_range(0, 1));
  sub->add_option("--out", o->out, "Output directory (default: runs/match-<date>-<time>)");
  add_threads_option(sub, o->threads);
  sub->callback([&runner, o] { runner = [o] { return run_match(*o); }; });
}

}  // namespace hl
