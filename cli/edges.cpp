// headlab edges: exact edge patching and edge attribution of every edge of a checkpoint's model
// on its task's rows with one token corrupted (the inputs of headlab patch): flags ->
// edge_patching -> a table of the top edges, edges.json, edges.csv and inputs.safetensors in --out.
// With --path-from (and --to), path patching of one sender: printed, no files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "analysis/edges.h"
#include "cli/edge_graph.h"
#include "cli/precision_option.h"
#include "cli/progress.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "train/run_dir.h"

namespace hl {

namespace {

struct EdgeFlags {
  int top = 20;
  std::string path_from, to;
};

std::string full(double v) {
  char s[64];
  std::snprintf(s, sizeof s, "%.17g", v);
  return s;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    out.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

int run_path(const RoleOpts& o, const EdgeFlags& f, RoleModel& m, const PatchingInputs& in) {
  const ModelConfig& c = m.model->cfg;
  const EdgeSender s = parse_sender(c, f.path_from);
  std::vector<EdgeReceiver> receivers;
  if (f.to.empty()) receivers = readers_of(c, s);
  else
    for (const std::string& r : split_commas(f.to)) receivers.push_back(parse_receiver(c, r));
  const PathPatchingResult p = path_patching(*m.model, in, s, receivers);
  std::string names;
  for (const EdgeReceiver& r : receivers) names += (names.empty() ? "" : ", ") + r.name();
  std::printf("path patching of %s, %zu answers of task %s (one %s token corrupted per row); logit difference clean %.4f, "
              "corrupted %.4f\nreceivers: %s\n\n",
              s.name().c_str(), in.answers.size(), m.config.name.c_str(), o.corrupt.c_str(), p.clean_metric, p.corrupted_metric,
              f.to.empty() ? ("all " + std::to_string(receivers.size()) + " readers").c_str() : names.c_str());
  warn_if_corruption_changes_little(p.clean_metric, p.corrupted_metric);
  print_table({{"patched", "metric - clean"},
               {"path: " + s.name() + " -> the receivers", fixed(p.path, 4)},
               {"activation patching of " + s.name(), fixed(p.activation, 4)}});
  return 0;
}

int run_edges(const RoleOpts& o, const EdgeFlags& f) {
  if (!f.to.empty() && f.path_from.empty()) fail("--to needs --path-from (the sender whose paths to patch)");
  const std::string out = o.out.empty() ? default_out_dir("edges") : o.out;
  RoleModel m = load_role_model(o);
  check_edge_model(m.model->cfg);  // before the data is made
  if (!f.path_from.empty()) (void)parse_sender(m.model->cfg, f.path_from);
  if (!f.to.empty())
    for (const std::string& r : split_commas(f.to)) (void)parse_receiver(m.model->cfg, r);
  // a directory of another command's results is refused now, not after the work (claiming it
  // then fails the same way, having made nothing)
  if (f.path_from.empty()) check_output_dir(out, "edges");
  const PatchingInputs in = role_patching_inputs(m, o, edge_patching_memory_bytes, "edges");
  if (!f.path_from.empty()) return run_path(o, f, m, in);
  EdgeResult r;
  {
    ProgressBar bar("edges", static_cast<int64_t>(edge_receivers(m.model->cfg).size()), stderr_is_terminal());
    r = edge_patching(*m.model, in, [&](size_t done, size_t) { bar.update(static_cast<int64_t>(done), "receivers"); });
    bar.finish();
  }
  // once the work is done: a stopped or failed run leaves no directory; the files appear together
  const std::unique_ptr<StagedDir> dir = claim_staged_output_dir(out, "edges");
  const ModelConfig& c = m.model->cfg;
  // files: every edge in edge order, full precision
  nlohmann::json edges = nlohmann::json::array();
  std::string csv = "sender,receiver,exact,attribution,linearisation_error\n";
  HeadGrid exact(1), attribution(1);
  for (const Edge& e : r.edges) {
    edges.push_back({{"sender", e.sender.name()},
                     {"receiver", e.receiver.name()},
                     {"exact", e.exact},
                     {"attribution", e.attribution},
                     {"linearisation_error", e.linearisation_error()}});
    csv += e.sender.name() + "," + e.receiver.name() + "," + full(e.exact) + "," + full(e.attribution) + "," +
           full(e.linearisation_error()) + "\n";
    exact[0].push_back(e.exact);
    attribution[0].push_back(e.attribution);
  }
  const nlohmann::json j = {{"metric", "logit_difference"}, {"corruption", o.corrupt},
                            {"clean_metric", r.clean_metric}, {"corrupted_metric", r.corrupted_metric},
                            {"n_layers", c.n_layers},       {"n_heads", c.n_heads},           {"has_mlp", c.has_mlp()},
                            {"edges", edges}};
  SafetensorsWriter st;
  st.add_ids("clean", in.clean, DType::I32);
  st.add_ids("corrupted", in.corrupted, DType::I32);
  Ids answers(Shape{static_cast<int64_t>(in.answers.size()), 4});
  for (size_t i = 0; i < in.answers.size(); ++i) {
    const PatchAnswer& a = in.answers[i];
    answers.at(static_cast<int64_t>(i), 0) = static_cast<int32_t>(a.row), answers.at(static_cast<int64_t>(i), 1) = static_cast<int32_t>(a.pos);
    answers.at(static_cast<int64_t>(i), 2) = a.clean, answers.at(static_cast<int64_t>(i), 3) = a.corrupted;
  }
  st.add_ids("answers", answers, DType::I32);
  // the table: the top edges by |exact|
  std::vector<size_t> order(r.edges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::fabs(r.edges[a].exact) > std::fabs(r.edges[b].exact); });
  std::vector<std::vector<std::string>> table = {{"rank", "sender", "receiver", "exact", "attribution", "linearisation error"}};
  for (size_t k = 0; k < order.size() && static_cast<int>(k) < f.top; ++k) {
    const Edge& e = r.edges[order[k]];
    table.push_back({std::to_string(k + 1), e.sender.name(), e.receiver.name(), fixed(e.exact, 4), fixed(e.attribution, 4),
                     fixed(e.linearisation_error(), 4)});
  }
  std::printf("edge patching, %zu edges, %zu answers of task %s (one %s token corrupted per row); logit difference clean %.4f, "
              "corrupted %.4f\nexact = the metric with the receiver alone reading the sender's corrupted output, minus the "
              "clean run's (negative: the edge carries what the clean answer needs); attribution = its first-order estimate\n\n",
              r.edges.size(), in.answers.size(), m.config.name.c_str(), o.corrupt.c_str(), r.clean_metric, r.corrupted_metric);
  print_table(table);
  warn_if_corruption_changes_little(r.clean_metric, r.corrupted_metric);
  std::printf("\ncorrelation of attribution with exact over all edges: %.3f\n", pearson(exact, attribution));
  write_file_atomic(dir->file("edges.json"), j.dump(2) + "\n");
  write_file_atomic(dir->file("edges.csv"), csv);
  st.write(dir->file("inputs.safetensors"));
  write_edge_graph_png(j, f.top, dir->file("edges.png"));  // the --top edges, drawn by layer
  dir->publish();
  std::printf("wrote %s/edges.json, edges.csv, inputs.safetensors, edges.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_edges_command(CLI::App& app, CommandRunner& runner) {
  RoleOpts defaults;
  defaults.examples = 100;
  auto flags = std::make_shared<EdgeFlags>();
  // the role commands' flags (as headlab patch), and a run that also reads the flags below
  auto [sub, o] = add_role_command(app, runner, "edges",
                                   "Exact edge patching and edge attribution of every edge (heads' q/k/v, MLPs, logits); with "
                                   "--path-from, path patching of one sender",
                                   nullptr, defaults);
  sub->add_option("--rows", o->examples, "Held-out rows, one token corrupted in each (--corrupt; the same as --examples)")
      ->check(in_range(1, 1e6));
  add_corrupt_option(sub, *o);
  sub->add_option("--top", flags->top, "Edges in the printed table (largest |exact| first)")->capture_default_str()->check(in_range(1, 1e9));
  sub->add_option("--path-from", flags->path_from,
                  "Path patching instead: this sender (embed or L{layer}H{head}) to the --to receivers; prints the result beside "
                  "activation patching of the sender, writes nothing");
  sub->add_option("--to", flags->to,
                  "--path-from: receivers, comma-separated (L{layer}H{head}.q/.k/.v, mlp{layer}, logits; default: every reader "
                  "of the sender)");
  sub->callback([&runner, o = o, flags] {
    runner = [o, flags] {
      const PrecisionScope precision(precision_from_flag(o->precision));  // add_role_command's --precision
      return run_edges(*o, *flags);
    };
  });
}

}  // namespace hl
