// headlab qk: QK attribution of one head over a task's answers: flags -> qk_answer_sites and
// qk_attribution (analysis/qk_attribution.h) -> a table of the largest (query-side, key-side)
// component pairs and each side's totals, and in --out qk.csv (every pair), qk.json (the matrix,
// for `headlab view --qk`) and qk.png (the matrix as a heat map).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "analysis/qk_attribution.h"
#include "cli/plot.h"
#include "cli/precision_option.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

struct QkFlags {
  std::string head;  // L.H
  std::string key = "source", aggregate = "mean";
  int top = 12;
};

std::string full(double v) {
  char s[64];
  std::snprintf(s, sizeof s, "%.17g", v);
  return s;
}

// "1.6" -> (1, 6), each checked against the model
std::pair<int, int> parse_head_flag(const std::string& text, const ModelConfig& c) {
  const size_t dot = text.find('.');
  if (dot == std::string::npos) fail("--head ", text, ": expected LAYER.HEAD, e.g. 1.6");
  const auto layer = static_cast<int>(parse_int(text.substr(0, dot), 0, c.n_layers - 1, "--head " + text + " (layer)"));
  const auto head = static_cast<int>(parse_int(text.substr(dot + 1), 0, c.n_heads - 1, "--head " + text + " (head)"));
  return {layer, head};
}

// The largest pairs by |value| (at most `top`), and each side's totals, printed.
void print_qk_tables(const QkAttribution& a, int top) {
  const size_t C = a.components.size();
  std::vector<size_t> order(C * C);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return std::fabs(a.pairs[x]) > std::fabs(a.pairs[y]); });
  const double total = a.sum();
  auto share = [&](double v) { return std::fabs(total) > 1e-12 ? fixed(v / total, 3) : std::string("-"); };
  std::vector<std::vector<std::string>> t = {{"rank", "query side", "key side", "value", "share of score"}};
  for (size_t k = 0; k < order.size() && static_cast<int>(k) < top; ++k)
    t.push_back({std::to_string(k + 1), a.components[order[k] / C], a.components[order[k] % C], fixed(a.pairs[order[k]], 4),
                 share(a.pairs[order[k]])});
  print_table(t);
  const std::vector<double> qt = a.query_totals(), kt = a.key_totals();
  std::vector<size_t> qo(C), ko(C);
  for (size_t i = 0; i < C; ++i) qo[i] = ko[i] = i;
  std::stable_sort(qo.begin(), qo.end(), [&](size_t x, size_t y) { return std::fabs(qt[x]) > std::fabs(qt[y]); });
  std::stable_sort(ko.begin(), ko.end(), [&](size_t x, size_t y) { return std::fabs(kt[x]) > std::fabs(kt[y]); });
  std::printf("\neach side's totals (a component against every component of the other side):\n\n");
  std::vector<std::vector<std::string>> s = {{"query side", "total", "key side", "total"}};
  for (size_t k = 0; k < C && static_cast<int>(k) < std::min(top, 6); ++k)
    s.push_back({a.components[qo[k]], fixed(qt[qo[k]], 4), a.components[ko[k]], fixed(kt[ko[k]], 4)});
  print_table(s);
}

int run_qk(const RoleOpts& o, const QkFlags& f) {
  const QkKeyRule rule = parse_qk_key_rule(f.key);
  const QkReduce reduce = parse_qk_reduce(f.aggregate);
  const std::string out = o.out.empty() ? default_out_dir("qk") : o.out;
  RoleModel m = load_role_model(o);
  const ModelConfig& c = m.model->cfg;
  check_qk_attribution_model(c);  // before the data is made
  const auto [layer, head] = parse_head_flag(f.head, c);
  check_output_dir(out, "qk");
  const bool probe = o.data == "probe";
  const PatchingInputs in = role_patching_inputs(m, o, qk_attribution_memory_bytes, "qk", probe);
  const QkAttribution a = qk_attribution(*m.model, in.clean, layer, head, qk_answer_sites(in, rule), reduce);
  const std::string head_name = "L" + std::to_string(layer) + "H" + std::to_string(head);
  const std::string data = probe ? std::string("the repeat probe") : "task " + m.config.name;
  const char* keys = rule == QkKeyRule::Source     ? "the answer's earlier occurrence (what an induction or copying head attends to)"
                     : rule == QkKeyRule::Previous ? "the previous position"
                                                   : "the key the head attends to most";
  std::printf("QK attribution of %s's score, %s over %zu (query, key) sites of %s: query = each answer's position, key = %s\n"
              "score %.4f (the model's, scaled, before any soft-cap) = the sum of the pairs %.4f; each pair = the query-side "
              "component's part of q . the key-side component's part of k x scale, through ln1 with its scale frozen\n\n",
              head_name.c_str(), to_string(reduce).c_str(), a.sites.size(), data.c_str(), keys, a.score, a.sum());
  print_qk_tables(a, f.top);
  // the files appear together, or none
  const std::unique_ptr<StagedDir> dir = claim_staged_output_dir(out, "qk");
  const size_t C = a.components.size();
  std::string csv = "query_side,key_side,value\n";
  nlohmann::json matrix = nlohmann::json::array();
  for (size_t i = 0; i < C; ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (size_t j = 0; j < C; ++j) {
      csv += a.components[i] + "," + a.components[j] + "," + full(a.pair(i, j)) + "\n";
      row.push_back(a.pair(i, j));
    }
    matrix.push_back(row);
  }
  nlohmann::json sites = nlohmann::json::array(), ids = nlohmann::json::array();
  for (const QkSite& s : a.sites) sites.push_back({s.row, s.query, s.key});
  const int64_t T = in.clean.shape[1];
  for (int64_t r = 0; r < in.clean.shape[0]; ++r)  // the rows the sites index, so the matrix can be recomputed
    ids.push_back(std::vector<int32_t>(in.clean.data.begin() + r * T, in.clean.data.begin() + (r + 1) * T));
  const nlohmann::json j = {{"layer", layer},          {"head", head},         {"data", probe ? std::string("probe") : m.config.name},
                            {"key_rule", f.key},       {"aggregate", f.aggregate}, {"seed", o.seed},
                            {"score", a.score},        {"components", a.components}, {"pairs", matrix},
                            {"query_totals", a.query_totals()}, {"key_totals", a.key_totals()}, {"sites", sites},
                            {"ids", ids}};
  write_file_atomic(dir->file("qk.json"), j.dump(2) + "\n");
  write_file_atomic(dir->file("qk.csv"), csv);
  Heatmap h;
  h.title = head_name;
  h.rows = h.cols = static_cast<int>(C);
  double largest = 1e-12;
  for (double v : a.pairs) {
    h.values.push_back(static_cast<float>(v));
    largest = std::max(largest, std::fabs(v));
  }
  h.xlabels = h.ylabels = a.components;
  plot_heatmap_grid(dir->file("qk.png"), "QK attribution of " + head_name + " (" + to_string(reduce) + " over " +
                    std::to_string(a.sites.size()) + " sites; key: " + f.key + ")", 1, 1, {h}, "key side", "query side",
                    static_cast<float>(-largest), static_cast<float>(largest));
  dir->publish();
  std::printf("\nwrote %s/qk.csv, qk.json, qk.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_qk_command(CLI::App& app, CommandRunner& runner) {
  RoleOpts defaults;
  defaults.examples = 100;
  defaults.data = "task";
  auto flags = std::make_shared<QkFlags>();
  auto [sub, o] = add_role_command(app, runner, "qk",
                                   "QK attribution: one head's attention score at a task's answers split into pairs of "
                                   "(query-side, key-side) components (embeddings, earlier heads, MLPs, biases)",
                                   nullptr, defaults);
  sub->add_option("--head", flags->head, "The head, LAYER.HEAD (e.g. 1.6)")->required();
  sub->add_option("--key", flags->key,
                  "Which key each answer's query is scored against: source (the answer's earlier occurrence: for induction "
                  "the token after the repeated token's first occurrence), previous (the query's previous position), max "
                  "(the key the head attends to most)")
      ->capture_default_str()
      ->check(CLI::IsMember({"source", "previous", "max"}));
  sub->add_option("--aggregate", flags->aggregate, "mean or sum of the pair matrices over the (query, key) sites")
      ->capture_default_str()
      ->check(CLI::IsMember({"mean", "sum"}));
  sub->add_option("--top", flags->top, "Pairs in the printed table (largest |value| first)")->capture_default_str()->check(in_range(1, 1e6));
  sub->add_option("--data", o->data,
                  "task: the task's held-out rows; probe: random tokens with a block of --length/2..--length tokens "
                  "repeated (any model, e.g. GPT-2's), the answer a token of the second copy")
      ->capture_default_str()
      ->check(CLI::IsMember({"task", "probe"}));
  sub->add_option("--length", o->length, "probe: the longest block repeated (sequences of 2 x --length tokens); 0 = min(16, max_seq_len / 2)")
      ->capture_default_str()
      ->check(in_range(0, 1 << 19));
  sub->callback([&runner, o = o, flags] {
    runner = [o, flags] {
      const PrecisionScope precision(precision_from_flag(o->precision));  // add_role_command's --precision
      return run_qk(*o, *flags);
    };
  });
}

}  // namespace hl
