// headlab edges: exact edge patching and edge attribution of every edge of a checkpoint's model
// on its task's rows or the repeat probe, one token corrupted (the inputs of headlab patch): flags ->
// edge_patching -> a table of the top edges, edges.json, edges.csv and inputs.safetensors in --out.
// With --path-from (and --to), path patching of one sender: printed, no files. With --method, a
// circuit-discovery method's scores beside the exact effects (--method all: every method, and
// methods.csv / faithfulness.csv / comparison.json / faithfulness.png comparing them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "analysis/circuit_discovery.h"
#include "analysis/chunks.h"
#include "analysis/edges.h"
#include "cli/plot.h"
#include "cli/edge_graph.h"
#include "cli/precision_option.h"
#include "cli/progress.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "lib/stop.h"
#include "train/run_dir.h"

namespace hl {

namespace {

std::string full(double v) {
  char s[64];
  std::snprintf(s, sizeof s, "%.17g", v);
  return s;
}

struct EdgeFlags {
  int top = 20;
  std::string path_from, to;
  std::string method = "attribution", ig_interpolate = "inputs", acdc_score = "metric";
  int ig_steps = 5;
  double acdc_threshold = 0.1;
  int target_edges = 0;  // edge-pruning's circuit size; not given: --top
  bool target_given = false;
  int prune_steps = 200;
  double prune_lr = 0.1;
  double max_minutes = 60;  // the exact runs' time up front above which the command refuses
};

EdgeMethodOptions method_options(const EdgeFlags& f) {
  EdgeMethodOptions o;
  o.method = f.method;
  o.ig.steps = f.ig_steps;
  o.ig.interpolate = parse_interpolation(f.ig_interpolate);
  o.acdc.threshold = f.acdc_threshold;
  o.acdc.score = parse_acdc_score(f.acdc_score);
  o.pruning.target_edges = f.target_edges;
  o.pruning.steps = f.prune_steps;
  o.pruning.lr = f.prune_lr;
  return o;
}

// --method all: the comparison's files in dir, its table printed
void write_comparison(const EdgeComparison& c, StagedDir& dir) {
  std::vector<std::vector<std::string>> table = {
      {"method", "seconds", "rank correlation with exact", "top-" + std::to_string(c.top_k) + " overlap", "metric of its top-" + std::to_string(c.top_k)}};
  auto metric_at = [&](const std::vector<FaithfulnessPoint>& curve) {
    for (const FaithfulnessPoint& p : curve)
      if (p.edges == c.top_k) return fixed(p.metric, 4);
    return std::string("-");
  };
  table.push_back({"exact", fixed(c.exact_seconds, 3), "1", "1", metric_at(c.exact_curve)});
  std::string methods_csv = "method,seconds,rank_correlation,top_k,top_k_overlap,circuit_edges\n";
  std::string curve_csv = "method,edges,metric\n";
  nlohmann::json jm = nlohmann::json::array();
  auto curve_json = [](const std::vector<FaithfulnessPoint>& curve) {
    nlohmann::json a = nlohmann::json::array();
    for (const FaithfulnessPoint& p : curve) a.push_back({{"edges", p.edges}, {"metric", p.metric}});
    return a;
  };
  std::vector<Series> series;
  auto add_curve = [&](const std::string& name, const std::vector<FaithfulnessPoint>& curve) {
    Series se;
    se.name = name;
    for (const FaithfulnessPoint& p : curve) {
      curve_csv += name + "," + std::to_string(p.edges) + "," + full(p.metric) + "\n";
      if (p.edges == 0) continue;  // log x: the empty circuit (the corrupted run) is in the CSV only
      se.x.push_back(static_cast<double>(p.edges));
      se.y.push_back(p.metric);
    }
    series.push_back(se);
  };
  add_curve("exact", c.exact_curve);
  methods_csv += "exact," + full(c.exact_seconds) + ",1," + std::to_string(c.top_k) + ",1,\n";
  for (const MethodComparison& m : c.methods) {
    size_t circuit = 0;  // its model edges and MLP-sender edges
    for (bool k : m.scores.circuit) circuit += k;
    for (bool k : m.scores.mlp_circuit) circuit += k;
    const std::string circuit_s = m.scores.circuit.empty() ? "" : std::to_string(circuit);
    table.push_back({m.scores.method + (circuit_s.empty() ? "" : " (its circuit: " + circuit_s + " edges)"), fixed(m.scores.seconds, 3),
                     fixed(m.rank_correlation, 3), fixed(m.top_k_overlap, 3), metric_at(m.curve)});
    methods_csv += m.scores.method + "," + full(m.scores.seconds) + "," + full(m.rank_correlation) + "," + std::to_string(c.top_k) +
                   "," + full(m.top_k_overlap) + "," + circuit_s + "\n";
    add_curve(m.scores.method, m.curve);
    nlohmann::json o = {{"method", m.scores.method}, {"seconds", m.scores.seconds}, {"rank_correlation", m.rank_correlation},
                        {"top_k_overlap", m.top_k_overlap}, {"faithfulness", curve_json(m.curve)}, {"scores", m.scores.scores}};
    if (!m.scores.circuit.empty()) o["circuit_edges"] = circuit;
    jm.push_back(o);
  }
  std::printf("\nmethods against exact patching (rank correlation of |score| with |exact|; faithfulness: the metric of the "
              "model with only the top edges, the rest patched from the corrupted run; clean %.4f, corrupted %.4f)\n\n",
              c.exact.clean_metric, c.exact.corrupted_metric);
  print_table(table);
  const nlohmann::json j = {{"top_k", c.top_k}, {"clean_metric", c.exact.clean_metric}, {"corrupted_metric", c.exact.corrupted_metric},
                            {"exact", {{"seconds", c.exact_seconds}, {"faithfulness", curve_json(c.exact_curve)}}},
                            {"methods", jm}};
  write_file_atomic(dir.file("comparison.json"), j.dump(2) + "\n");
  write_file_atomic(dir.file("methods.csv"), methods_csv);
  write_file_atomic(dir.file("faithfulness.csv"), curve_csv);
  plot_lines(dir.file("faithfulness.png"), "faithfulness of each method's top-k circuit", "edges kept (log)", "metric (logit difference)",
             series, false, true);
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
  std::printf("path patching of %s, %zu answers of %s (one %s token corrupted per row); logit difference clean %.4f, "
              "corrupted %.4f\nreceivers: %s\n\n",
              s.name().c_str(), in.answers.size(), patching_data_name(o, m).c_str(), o.corrupt.c_str(), p.clean_metric, p.corrupted_metric,
              f.to.empty() ? ("all " + std::to_string(receivers.size()) + " readers").c_str() : names.c_str());
  warn_if_corruption_changes_little(p.clean_metric, p.corrupted_metric);
  print_table({{"patched", "metric - clean"},
               {"path: " + s.name() + " -> the receivers", fixed(p.path, 4)},
               {"activation patching of " + s.name(), fixed(p.activation, 4)}});
  return 0;
}

// The exact runs' time up front: their operations (edge_patching_work) at the rate of one forward
// of (at most 64 of) the rows timed now (this machine under its present load), printed; over
// max_minutes refused. 64 rows: a forward of every row would hold their memory at once and answer
// no signal while it runs.
void check_exact_time(TransformerLM& model, const PatchingInputs& in, double max_minutes) {
  const ModelConfig& c = model.cfg;
  const EdgeWork w = edge_patching_work(c, in, c.has_mlp());
  const int64_t rows = std::min<int64_t>(in.clean.shape[0], 64);
  double seconds = 0;
  {
    EvalScope mode(model);
    NoGradGuard ng;
    const Ids timed = slice_rows(in.clean, 0, rows);
    const auto t0 = std::chrono::steady_clock::now();
    (void)model.forward(timed);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  throw_if_stopped();
  const double rate = forward_flops(c, rows, in.clean.shape[1]) / std::max(seconds, 1e-6);  // operations a second
  const double eta = w.flops / rate;
  char what[256];
  std::snprintf(what, sizeof what, "exact patching of %.0f edges (%.3g patched token-blocks, %.3g TFLOP) takes about %s at this "
                "machine's rate now (%.1f GFLOP/s in a forward of the rows)", w.edges, w.token_blocks, w.flops / 1e12,
                format_duration(eta).c_str(), rate / 1e9);
  if (eta > 60.0 * max_minutes)
    fail("edges: ", what, ", more than --max-minutes ", max_minutes, "; lower --rows or --length, or raise --max-minutes "
         "(headlab patch gives every head's and residual position's exact effect at this size in minutes)");
  std::fprintf(stderr, "headlab edges: %s\n", what);
}

int run_edges(const RoleOpts& o, const EdgeFlags& f) {
  if (!f.to.empty() && f.path_from.empty()) fail("--to needs --path-from (the sender whose paths to patch)");
  {
    EdgeMethodOptions mo = method_options(f);
    if (f.method == "all") mo.method = "attribution";  // all: every method, with these options
    check_edge_method_options(mo);
  }
  const std::string out = o.out.empty() ? default_out_dir("edges") : o.out;
  RoleModel m = load_role_model(o);
  check_edge_model(m.model->cfg);  // before the data is made
  const std::vector<AttachedSae> saes = m.model->saes;  // --sae: their features become senders
  for (const AttachedSae& a : saes) check_feature_sender_sae(m.model->cfg, *a.sae);
  if (!saes.empty() && !f.path_from.empty()) fail("--sae goes with the edge scores, not --path-from");
  const size_t n_edges = model_edges(m.model->cfg).size();
  EdgeFlags fl = f;
  if (f.method == "edge-pruning" || f.method == "all") {
    if (!f.target_given) fl.target_edges = static_cast<int>(std::min<size_t>(static_cast<size_t>(f.top), n_edges));
    check_edge_pruning_options(method_options(fl).pruning, circuit_edge_count(m.model->cfg));
  }
  if (!f.path_from.empty()) (void)parse_sender(m.model->cfg, f.path_from);
  if (!f.to.empty())
    for (const std::string& r : split_commas(f.to)) (void)parse_receiver(m.model->cfg, r);
  // a directory of another command's results is refused now, not after the work (claiming it
  // then fails the same way, having made nothing)
  if (f.path_from.empty()) check_output_dir(out, "edges");
  const PatchingInputs in = role_patching_inputs(m, o, edge_patching_memory_bytes, "edges", o.data == "probe");
  // a grouped-query model runs as its ungrouped equivalent: each head's .k/.v is its own copy
  if (EdgeModel em = edge_model(*m.model); em.ungrouped) m.model = std::move(em.ungrouped);
  if (!f.path_from.empty()) return run_path(o, f, m, in);
  check_exact_time(*m.model, in, f.max_minutes);
  EdgeResult r;
  {
    ProgressBar bar("edges", static_cast<int64_t>(edge_receivers(m.model->cfg).size()), stderr_is_terminal());
    r = edge_patching(*m.model, in, [&](size_t done, size_t) { bar.update(static_cast<int64_t>(done), "receivers"); });
    bar.finish();
  }
  // a method other than the attribution (which edge_patching gives): its scores beside
  const bool compare = f.method == "all";
  const EdgeMethodOptions mopt = method_options(fl);
  EdgeComparison comparison;
  MethodScores extra;
  if (compare) {
    const size_t n = r.edges.size();
    comparison = compare_edge_methods(*m.model, in, edge_method_names(), mopt, std::min<size_t>(static_cast<size_t>(f.top), n),
                                      faithfulness_sizes(n));
    r = comparison.exact;
  } else if (f.method != "attribution") {
    extra = run_edge_method(*m.model, in, r, mopt);
  }
  const bool with_extra = !extra.scores.empty();
  // MIB's MLP-sender edges: their exact effects and attributions (every other method scores them too)
  std::vector<double> mlp_exact, mlp_attribution;
  for (const MlpSenderEdge& e : mlp_sender_edges(*m.model, in)) mlp_exact.push_back(e.exact), mlp_attribution.push_back(e.attribution);
  // --sae: each SAE's features that differ between the runs, and its error, as senders (exact and attribution)
  std::string feature_csv = "sae,sender,receiver,exact,attribution\n";
  std::vector<std::pair<double, std::string>> feature_rows;  // (|exact|, printed line)
  for (const AttachedSae& a : saes) {
    const int layer = hook_layer(a.sae->cfg.hook_name);
    char line[256];
    for (const FeatureSenderEdge& e : feature_sender_edges(*m.model, in, *a.sae)) {
      std::snprintf(line, sizeof line, "%s,%s,%s,%.17g,%.17g\n", a.sae->cfg.hook_name.c_str(), e.sender_name(layer).c_str(),
                    e.receiver.name().c_str(), e.exact, e.attribution);
      feature_csv += line;
      std::snprintf(line, sizeof line, "  %-12s -> %-10s exact %9.4f  attribution %9.4f", e.sender_name(layer).c_str(),
                    e.receiver.name().c_str(), e.exact, e.attribution);
      feature_rows.push_back({std::fabs(e.exact), line});
    }
  }
  // once the work is done: a stopped or failed run leaves no directory; the files appear together
  const std::unique_ptr<StagedDir> dir = claim_staged_output_dir(out, "edges");
  const ModelConfig& c = m.model->cfg;
  // files: every edge in edge order, full precision
  nlohmann::json edges = nlohmann::json::array();
  std::string csv = "sender,receiver,exact,attribution,linearisation_error" + (with_extra ? "," + extra.method : std::string()) + "\n";
  HeadGrid exact(1), attribution(1);
  for (size_t i = 0; i < r.edges.size(); ++i) {
    const Edge& e = r.edges[i];
    edges.push_back({{"sender", e.sender.name()},
                     {"receiver", e.receiver.name()},
                     {"exact", e.exact},
                     {"attribution", e.attribution},
                     {"linearisation_error", e.linearisation_error()}});
    if (with_extra) edges.back()[extra.method] = extra.scores[i];
    csv += e.sender.name() + "," + e.receiver.name() + "," + full(e.exact) + "," + full(e.attribution) + "," +
           full(e.linearisation_error()) + (with_extra ? "," + full(extra.scores[i]) : std::string()) + "\n";
    exact[0].push_back(e.exact);
    attribution[0].push_back(e.attribution);
  }
  nlohmann::json j = {{"metric", "logit_difference"}, {"corruption", o.corrupt},
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
  if (with_extra) table[0].push_back(extra.method);
  for (size_t k = 0; k < order.size() && static_cast<int>(k) < f.top; ++k) {
    const Edge& e = r.edges[order[k]];
    table.push_back({std::to_string(k + 1), e.sender.name(), e.receiver.name(), fixed(e.exact, 4), fixed(e.attribution, 4),
                     fixed(e.linearisation_error(), 4)});
    if (with_extra) table.back().push_back(fixed(extra.scores[order[k]], 4));
  }
  std::printf("edge patching, %zu edges, %zu answers of %s (one %s token corrupted per row); logit difference clean %.4f, "
              "corrupted %.4f\nexact = the metric with the receiver alone reading the sender's corrupted output, minus the "
              "clean run's (negative: the edge carries what the clean answer needs); attribution = its first-order estimate\n\n",
              r.edges.size(), in.answers.size(), patching_data_name(o, m).c_str(), o.corrupt.c_str(), r.clean_metric, r.corrupted_metric);
  print_table(table);
  warn_if_corruption_changes_little(r.clean_metric, r.corrupted_metric);
  std::printf("\ncorrelation of attribution with exact over all edges: %.3f\n", pearson(exact, attribution));
  if (with_extra) {
    std::vector<double> ex;
    for (const Edge& e : r.edges) ex.push_back(e.exact);
    const size_t k = std::min<size_t>(static_cast<size_t>(f.top), ex.size());
    j["method"] = extra.method;
    j["method_seconds"] = extra.seconds;
    std::printf("%s: rank correlation of |score| with |exact| %.3f, top-%zu overlap %.3f, %.3f s\n", extra.method.c_str(),
                rank_correlation(extra.scores, ex), k, top_k_overlap(extra.scores, ex, k), extra.seconds);
    if (!extra.circuit.empty()) {
      const std::vector<std::string> names = circuit_edge_names(c, extra.circuit, extra.mlp_circuit);
      j["circuit"] = names;
      std::printf("%s's circuit: %zu edges\n", extra.method.c_str(), names.size());
    }
  }
  if (compare) write_comparison(comparison, *dir);
  // MIB's graph JSON: the method's scores, in the graph its circuit (acdc, edge pruning) or its top
  // --top edges, the MLP-sender edges ranked with the others when the method scores them
  auto write_mib = [&](const std::string& file, const std::vector<double>& scores, const std::vector<bool>& circuit,
                       const std::vector<double>& mlp_scores, const std::vector<bool>& mlp_circuit) {
    std::pair<std::vector<bool>, std::vector<bool>> kept{circuit, mlp_circuit};
    if (circuit.empty()) {
      const size_t k = std::min<size_t>(static_cast<size_t>(f.top), scores.size() + mlp_scores.size());
      kept = mlp_scores.empty() ? std::make_pair(top_edges(scores, k), std::vector<bool>{}) : top_edges(scores, mlp_scores, k);
    }
    write_file_atomic(dir->file(file), mib_graph_json(c, scores, kept.first, mlp_scores, kept.second) + "\n");
  };
  std::vector<std::string> mib_files;
  if (compare) {
    std::vector<double> ex;
    for (const Edge& e : r.edges) ex.push_back(e.exact);
    write_mib("mib_exact.json", ex, {}, mlp_exact, {});
    mib_files.push_back("mib_exact.json");
    for (const MethodComparison& mc : comparison.methods) {
      write_mib("mib_" + mc.scores.method + ".json", mc.scores.scores, mc.scores.circuit,
                mc.scores.method == "attribution" ? mlp_attribution : mc.scores.mlp_scores, mc.scores.mlp_circuit);
      mib_files.push_back("mib_" + mc.scores.method + ".json");
    }
  } else {
    std::vector<double> att;
    for (const Edge& e : r.edges) att.push_back(e.attribution);
    write_mib("mib_graph.json", with_extra ? extra.scores : att, extra.circuit, with_extra ? extra.mlp_scores : mlp_attribution,
              extra.mlp_circuit);
    mib_files.push_back("mib_graph.json");
  }
  if (!saes.empty()) write_file_atomic(dir->file("feature_edges.csv"), feature_csv);
  write_file_atomic(dir->file("edges.json"), j.dump(2) + "\n");
  write_file_atomic(dir->file("edges.csv"), csv);
  st.write(dir->file("inputs.safetensors"));
  write_edge_graph_png(j, f.top, dir->file("edges.png"));  // the --top edges, drawn by layer
  dir->publish();
  if (!saes.empty()) {
    std::stable_sort(feature_rows.begin(), feature_rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::printf("\nSAE features as senders (largest |exact| first; L{l}z.f{i}: feature i of layer l's hook_z SAE, .err its error):\n");
    for (size_t i = 0; i < feature_rows.size() && i < static_cast<size_t>(f.top); ++i) std::printf("%s\n", feature_rows[i].second.c_str());
    mib_files.push_back("feature_edges.csv");
  }
  std::string mib_list;
  for (const std::string& m : mib_files) mib_list += ", " + m;
  std::printf("wrote %s/edges.json, edges.csv, inputs.safetensors, edges.png%s%s\n", out.c_str(),
              compare ? ", comparison.json, methods.csv, faithfulness.csv, faithfulness.png" : "", mib_list.c_str());
  return 0;
}

}  // namespace

void add_edges_command(CLI::App& app, CommandRunner& runner) {
  RoleOpts defaults;
  defaults.examples = 100;
  defaults.data = "task";
  auto flags = std::make_shared<EdgeFlags>();
  // the role commands' flags (as headlab patch), and a run that also reads the flags below
  auto [sub, o] = add_role_command(app, runner, "edges",
                                   "Exact edge patching and edge attribution of every edge (heads' q/k/v, MLPs, logits); with "
                                   "--path-from, path patching of one sender. A grouped-query model (n_kv_heads < n_heads) runs "
                                   "ungrouped: L{l}H{h}.k/.v is query head h's own copy of its group's key/value input",
                                   nullptr, defaults);
  sub->add_option("--rows", o->examples, "Rows, one token corrupted in each (--corrupt; the same as --examples)")
      ->check(in_range(1, 1e6));
  add_patching_data_options(sub, *o);
  add_corrupt_option(sub, *o);
  add_sae_option(sub, *o);  // hook_z SAEs: their features and error as senders, feature_edges.csv (exact and attribution)
  sub->add_option("--top", flags->top, "Edges in the printed table (largest |exact| first)")->capture_default_str()->check(in_range(1, 1e9));
  sub->add_option("--max-minutes", flags->max_minutes,
                  "Refuse when the exact patching of every edge is estimated to take longer (printed up front: its operations "
                  "at the rate of one forward of the rows)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--path-from", flags->path_from,
                  "Path patching instead: this sender (embed or L{layer}H{head}) to the --to receivers; prints the result beside "
                  "activation patching of the sender, writes nothing");
  sub->add_option("--to", flags->to,
                  "--path-from: receivers, comma-separated (L{layer}H{head}.q/.k/.v, mlp{layer}, logits; default: every reader "
                  "of the sender)");
  sub->add_option("--method", flags->method,
                  "Circuit-discovery method scored beside the exact effects: attribution, eap-ig, atp-star, acdc, edge-pruning, "
                  "or all (every method compared: rank correlation, top-k overlap with k = --top, faithfulness curves, time)")
      ->capture_default_str();
  // the options' ranges and choices are checked by the library (check_edge_method_options), in its words
  sub->add_option("--ig-steps", flags->ig_steps, "eap-ig: interpolation steps from the corrupted to the clean run (1..1000)")
      ->capture_default_str();
  sub->add_option("--ig-interpolate", flags->ig_interpolate, "eap-ig: what is interpolated: inputs (the token embedding) or "
                  "activations (each layer's outputs in turn)")
      ->capture_default_str();
  sub->add_option("--acdc-threshold", flags->acdc_threshold, "acdc: an edge is removed when the circuit's score changes by less (>= 0)")
      ->capture_default_str();
  sub->add_option("--acdc-score", flags->acdc_score, "acdc: metric (|change of the logit difference|) or kl (increase of "
                  "KL(clean || circuit) at the answers)")
      ->capture_default_str();
  CLI::Option* target = sub->add_option("--target-edges", flags->target_edges,
                                        "edge-pruning: the circuit's edge count the masks are pushed towards and the circuit kept, "
                                        "MLP-sender edges included (default: --top)");
  sub->add_option("--prune-steps", flags->prune_steps, "edge-pruning: Adam steps on the masks (1..100000)")->capture_default_str();
  sub->add_option("--prune-lr", flags->prune_lr, "edge-pruning: Adam's learning rate on the masks' log alpha (0, 10]")->capture_default_str();
  sub->callback([&runner, o = o, flags, target] {
    flags->target_given = target->count() > 0;
    runner = [o, flags] {
      const PrecisionScope precision(precision_from_flag(o->precision));  // add_role_command's --precision
      return run_edges(*o, *flags);
    };
  });
}

}  // namespace hl
