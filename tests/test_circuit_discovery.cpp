// Circuit discovery (analysis/circuit_discovery.h) held to exact edge patching: EAP-IG's identities
// (one step is attribution; along a straight path many steps are exact patching), the circuit
// run's identities (all edges kept: the clean run; one edge removed: that edge's exact effect; no
// edge kept in an attention-only model: the corrupted run), and the messages of bad input.
#define BOOST_TEST_MODULE circuit_discovery
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "analysis/circuit_discovery.h"
#include "analysis/planted_circuits.h"
#include "tests/fixtures.h"

using namespace hl;
using hl::test::error_of;
using hl::test::randomise;
using hl::test::test_model;

namespace {

constexpr auto inputs = hl::test::three_rows_one_token_changed;

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(eap_ig_with_one_step_is_edge_attribution) {
  TransformerLM m(test_model({.layers = 3}), 3);
  randomise(m, 5);
  const PatchingInputs in = inputs();
  const EdgeResult exact = edge_patching(m, in);
  std::vector<double> attribution;
  for (const Edge& e : exact.edges) attribution.push_back(e.attribution);
  // inputs: alpha 1 is the clean run itself, bit for bit
  const std::vector<double> ig = eap_ig_scores(m, in, {EapIgOptions::Inputs, 1});
  BOOST_TEST(ig.size() == exact.edges.size());
  BOOST_TEST(ig == attribution);
  // activations: the results are replaced by x + (clean - x), the clean values to round-off
  const std::vector<double> act = eap_ig_scores(m, in, {EapIgOptions::Activations, 1});
  BOOST_TEST(max_abs_diff(act, attribution) < 1e-5);
}

BOOST_AUTO_TEST_CASE(eap_ig_along_a_straight_path_converges_to_exact_patching) {
  // Heads whose W_O is 0 write nothing: the input path moves the logits' input exactly along
  // delta_embed, so the integral of the gradient along it is exact(embed -> logits) (and every other
  // edge's effect is 0). ln_final keeps the path curved: one step is far off, many steps are not.
  {
    TransformerLM m(test_model({.d_ff = 0}), 3);
    randomise(m, 6);
    for (auto& [name, p] : m.named_parameters())
      if (name.find("W_O.weight") != std::string::npos) p.fill_(0.f);
    PatchingInputs in = inputs();
    in.answers = {{0, 1, 3, 0}, {1, 3, 2, 5}, {2, 0, 6, 1}};  // at the changed tokens: nothing moves them elsewhere
    std::vector<double> exact;
    for (const Edge& e : edge_patching(m, in).edges) exact.push_back(e.exact);
    const double one = max_abs_diff(eap_ig_scores(m, in, {EapIgOptions::Inputs, 1}), exact);
    const double many = max_abs_diff(eap_ig_scores(m, in, {EapIgOptions::Inputs, 300}), exact);
    BOOST_TEST_MESSAGE("inputs: |ig - exact| 1 step " << one << ", 300 steps " << many);
    BOOST_TEST(one > 1e-2);
    BOOST_TEST(many < one / 100);
  }
  // One head per layer and no MLP: the activations variant moves the last head's output alone
  // along its delta, so for its edge into the logits the integral is that edge's exact effect.
  {
    TransformerLM m(test_model({.layers = 2, .heads = 1, .d_ff = 0}), 3);
    randomise(m, 7);
    const PatchingInputs in = inputs();
    const EdgeResult exact = edge_patching(m, in);
    const std::vector<double> one = eap_ig_scores(m, in, {EapIgOptions::Activations, 1});
    const std::vector<double> many = eap_ig_scores(m, in, {EapIgOptions::Activations, 300});
    const size_t e = exact.edges.size() - 1;  // L1H0 -> logits
    BOOST_TEST(exact.edges[e].sender.name() == "L1H0");
    BOOST_TEST_MESSAGE("activations L1H0>logits: exact " << exact.edges[e].exact << " 1 step " << one[e] << " 300 steps " << many[e]);
    BOOST_TEST(std::abs(one[e] - exact.edges[e].exact) > 1e-3);
    BOOST_TEST(std::abs(many[e] - exact.edges[e].exact) < std::abs(one[e] - exact.edges[e].exact) / 100);
  }
}

BOOST_AUTO_TEST_CASE(the_circuit_run_removes_edges_as_exact_patching_does) {
  TransformerLM m(test_model({.layers = 2}), 3);
  randomise(m, 8);
  const PatchingInputs in = inputs();
  const EdgeResult exact = edge_patching(m, in);
  const size_t n = exact.edges.size();
  const CircuitRun all = circuit_run(m, in, std::vector<bool>(n, true));
  BOOST_TEST(all.metric == exact.clean_metric);
  BOOST_TEST(std::abs(all.kl) < 1e-12);
  for (size_t e = 0; e < n; ++e) {
    std::vector<bool> kept(n, true);
    kept[e] = false;
    BOOST_TEST_CONTEXT(exact.edges[e].sender.name() << ">" << exact.edges[e].receiver.name()) {
      BOOST_TEST(std::abs(circuit_run(m, in, kept).metric - exact.clean_metric - exact.edges[e].exact) < 2e-5);
    }
  }
  // attention-only, no edge kept: every reader sees the corrupted run's senders: the corrupted run
  TransformerLM a(test_model({.layers = 2, .d_ff = 0}), 3);
  randomise(a, 9);
  const EdgeResult ea = edge_patching(a, in);
  BOOST_TEST(std::abs(circuit_run(a, in, std::vector<bool>(ea.edges.size(), false)).metric - ea.corrupted_metric) < 2e-5);
}

// The same identity through today's blocks: rotary (no hook_pos_embed: the embedding sender is
// the token embedding), RMSNorm, gated MLPs and, in the neox preset, parallel blocks (the MLP reads
// the block's input). Sandwich norms (gemma2) are refused naming the option.
BOOST_AUTO_TEST_CASE(the_circuit_run_removes_edges_through_the_presets) {
  const PatchingInputs in = inputs();
  for (const std::string arch : {"llama", "neox"}) {
    TransformerLM m(hl::test::preset_model(arch, test_model({.d_model = 16, .layers = 2})), 3);  // d_head 8: neox turns 2 dims
    randomise(m, 10);
    const EdgeResult exact = edge_patching(m, in);
    const size_t n = exact.edges.size();
    BOOST_TEST_CONTEXT(arch) {
      BOOST_TEST(circuit_run(m, in, std::vector<bool>(n, true)).metric == exact.clean_metric);
      for (size_t e = 0; e < n; ++e) {
        std::vector<bool> kept(n, true);
        kept[e] = false;
        BOOST_TEST_CONTEXT(exact.edges[e].sender.name() << ">" << exact.edges[e].receiver.name()) {
          BOOST_TEST(std::abs(circuit_run(m, in, kept).metric - exact.clean_metric - exact.edges[e].exact) < 2e-5);
        }
      }
    }
  }
  TransformerLM g(hl::test::preset_model("gemma2", test_model({.layers = 2})), 3);
  BOOST_TEST(error_of([&] { circuit_run(g, in, {}); }).find("sandwich_norm") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_options_get_one_line) {
  TransformerLM m(test_model(), 3);
  const PatchingInputs in = inputs();
  BOOST_TEST(error_of([&] { eap_ig_scores(m, in, {EapIgOptions::Inputs, 0}); }) == "eap-ig: steps 0 is outside 1..1000");
  BOOST_TEST(error_of([&] { parse_interpolation("both"); }) == "eap-ig: unknown interpolation 'both' (expected inputs or activations)");
  BOOST_TEST(error_of([&] { acdc(m, in, {AcdcOptions::Metric, -1}); }) == "acdc: threshold -1 must be a number >= 0");
  const size_t n = model_edges(m.cfg).size();
  BOOST_TEST(error_of([&] { top_edges(std::vector<double>(n), n + 1); }) ==
             "circuit: size " + std::to_string(n + 1) + " is above the model's " + std::to_string(n) + " edges");
  PatchingInputs none = in;
  none.answers.clear();
  BOOST_TEST(error_of([&] { eap_ig_scores(m, none, {}); }).starts_with("edges: no answers"));
}

// ---- planted circuits ---------------------------------------------------------------------------

namespace {
std::string edge_names(const ModelConfig& c, const std::vector<bool>& kept) {
  std::string s;
  const auto e = model_edges(c);
  for (size_t i = 0; i < e.size(); ++i)
    if (kept[i]) s += (s.empty() ? "" : " ") + e[i].first.name() + ">" + e[i].second.name();
  return s;
}
}  // namespace

BOOST_AUTO_TEST_CASE(exact_patching_finds_the_planted_induction_circuit) {
  PlantedCircuit pc = planted_induction();
  TransformerLM& m = *pc.model;
  const EdgeResult r = edge_patching(m, pc.task);
  BOOST_TEST_MESSAGE("planted induction: clean " << r.clean_metric << " corrupted " << r.corrupted_metric);
  BOOST_TEST(std::abs(r.clean_metric - 10) < 1e-3);  // the answer's logit 10, the corrupted one's 0
  BOOST_TEST(std::abs(r.corrupted_metric) < 1e-3);   // no match: uniform over the tokens, both answers 2
  std::vector<double> exact;
  for (const Edge& e : r.edges) exact.push_back(e.exact);
  const std::vector<bool> truth = edge_mask(m.cfg, pc.true_edges);
  BOOST_TEST(edge_names(m.cfg, top_edges(exact, 3)) == edge_names(m.cfg, truth));
  for (size_t e = 0; e < exact.size(); ++e)
    BOOST_TEST_CONTEXT(r.edges[e].sender.name() << ">" << r.edges[e].receiver.name()) {
      if (truth[e])  // each true edge alone breaks the circuit: the logits read the corrupted
        // head (0), or the induction head finds no match and averages the 5 clean tokens (b: 2, a': 0)
        BOOST_TEST(std::abs(exact[e] - (r.edges[e].receiver.name() == "logits" ? -10 : -8)) < 1e-3);
      else
        BOOST_TEST(std::abs(exact[e]) < 1e-4);
    }
}

BOOST_AUTO_TEST_CASE(acdc_returns_the_planted_circuit) {
  PlantedCircuit pc = planted_induction();
  TransformerLM& m = *pc.model;
  const std::string truth = edge_names(m.cfg, edge_mask(m.cfg, pc.true_edges));
  // the metric threshold 1 (a tenth of the clean-corrupted gap 10), the KL threshold 0.1
  const AcdcResult by_metric = acdc(m, pc.task, {AcdcOptions::Metric, 1.0});
  BOOST_TEST(edge_names(m.cfg, by_metric.kept) == truth);
  const CircuitRecovery rec = circuit_recovery(m.cfg, by_metric.kept, pc.true_edges);
  BOOST_TEST(rec.precision() == 1.0);
  BOOST_TEST(rec.recall() == 1.0);
  BOOST_TEST(std::abs(by_metric.final_run.metric - 10) < 1e-3);  // the circuit alone does the task
  const AcdcResult by_kl = acdc(m, pc.task, {AcdcOptions::Kl, 0.1});
  BOOST_TEST(edge_names(m.cfg, by_kl.kept) == truth);
  BOOST_TEST_MESSAGE("acdc: " << by_metric.runs << " circuit runs (metric), " << by_kl.runs << " (kl)");
  // a threshold above the whole effect removes everything: the corrupted run
  const AcdcResult all_gone = acdc(m, pc.task, {AcdcOptions::Metric, 11.0});
  BOOST_TEST(edge_names(m.cfg, all_gone.kept) == "");
}

BOOST_AUTO_TEST_CASE(attribution_misses_the_planted_circuit_and_eap_ig_recovers_it) {
  PlantedCircuit pc = planted_induction();
  TransformerLM& m = *pc.model;
  const EdgeResult r = edge_patching(m, pc.task);
  std::vector<double> attribution;
  for (const Edge& e : r.edges) attribution.push_back(e.attribution);
  for (const auto& [name, scores] : std::vector<std::pair<std::string, std::vector<double>>>{
           {"attribution", attribution},
           {"eap-ig inputs 5", eap_ig_scores(m, pc.task, {EapIgOptions::Inputs, 5})},
           {"eap-ig inputs 50", eap_ig_scores(m, pc.task, {EapIgOptions::Inputs, 50})},
           {"eap-ig activations 5", eap_ig_scores(m, pc.task, {EapIgOptions::Activations, 5})}}) {
    const std::vector<bool> top = top_edges(scores, 3);
    const CircuitRecovery rec = circuit_recovery(m.cfg, top, pc.true_edges);
    BOOST_TEST_MESSAGE(name << ": top 3 " << edge_names(m.cfg, top) << " precision " << rec.precision() << " recall " << rec.recall());
    // the induction head's softmax is saturated (e^-25 off its key): its gradient misses both
    // edges behind it, and the path from the corrupted run crosses the unsaturated middle
    if (name == "attribution")
      BOOST_TEST(rec.found == 1u);
    else
      BOOST_TEST(rec.found == 3u);
  }
}

BOOST_AUTO_TEST_CASE(mib_export_has_mibs_edges_and_our_scores) {
  const ModelConfig c = test_model({.layers = 2, .heads = 2});  // with MLPs
  const auto edges = model_edges(c);
  std::vector<double> scores(edges.size());
  std::vector<bool> kept(edges.size(), false);
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = 0.5 + static_cast<double>(i);
  kept[7] = true;  // L0H0 -> mlp0
  const nlohmann::json j = nlohmann::json::parse(mib_graph_json(c, scores, kept));
  // MIB's graph of L layers of H heads with MLPs: per layer l, 3H (1 + lH + l) q/k/v edges and
  // 1 + (l + 1)H + l MLP edges; 1 + LH + L into the logits
  const size_t L = 2, H = 2;
  size_t mib = 1 + L * H + L;
  for (size_t l = 0; l < L; ++l) mib += 3 * H * (1 + l * H + l) + 1 + (l + 1) * H + l;
  BOOST_TEST(j["edges"].size() == mib);
  BOOST_TEST(j["nodes"].size() == 1 + L * H + L + 1);
  BOOST_TEST(j["cfg"]["n_layers"] == 2);
  BOOST_TEST(edges[7].first.name() + ">" + edges[7].second.name() == "L0H0>mlp0");
  BOOST_TEST(j["edges"]["a0.h0->m0"]["score"] == 7.5);
  BOOST_TEST(j["edges"]["a0.h0->m0"]["in_graph"] == true);
  BOOST_TEST(j["edges"]["input->a0.h0<q>"]["score"] == 0.5);
  BOOST_TEST(j["edges"]["input->a0.h0<q>"]["in_graph"] == false);
  BOOST_TEST(j["edges"]["a1.h1->logits"]["score"] == scores.back());
  BOOST_TEST(j["edges"]["m0->a1.h0<k>"]["in_graph"] == true);  // MLP senders: never patched here
  BOOST_TEST(j["nodes"]["a0.h0"]["in_graph"] == true);
  BOOST_TEST(j["nodes"]["a1.h0"]["in_graph"] == false);
  size_t ours = 0;
  for (const auto& [name, e] : j["edges"].items()) ours += !name.starts_with("m");
  BOOST_TEST(ours == edges.size());
}
