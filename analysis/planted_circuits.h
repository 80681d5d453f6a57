// Models built by hand whose circuit is known (docs/circuits.md, "planted circuits"): each comes
// with a task (clean and corrupted ids, answers) and its true edge set, the edges whose exact
// effect is not 0 by construction. Discovery methods are scored by precision and recall against it.
//
// The norms are RMSNorm with eps 1e8 and gain 1e4: x / sqrt(mean(x^2) + 1e8) * 1e4 is x to float
// round-off (mean(x^2) is below 1e8's ulp), so subspaces stay apart and a component no reader
// reads has no effect at all. The residual stream is laid out in one-hot blocks: TOK (the token),
// POS (the position), PREV (the previous token), JUNK (written, never read), OUT (read by the
// unembedding).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "analysis/edges.h"

namespace hl {

struct PlantedCircuit {
  std::string name, description;
  std::unique_ptr<TransformerLM> model;
  PatchingInputs task;
  std::vector<std::pair<EdgeSender, EdgeReceiver>> true_edges;
  std::vector<std::pair<int, EdgeReceiver>> true_mlp_edges;  // its MLP-sender edges (the MLP's layer, the receiver)
};

// "induction": a previous-token head L0H0 (attends from p to p - 1 by positions, copies the token
// into PREV), an induction head L1H0 (query: the token, key: PREV; copies the attended token into
// OUT), a distractor L0H1 that attends to itself and copies the token into JUNK (active, changed
// by the corruption, read by no one) and L1H1 reading JUNK into JUNK. Rows [BOS a b x a y], the
// first a corrupted: the answer at the second a is b. True edges: embed -> L0H0.v,
// L0H0 -> L1H0.k, L1H0 -> logits.
PlantedCircuit planted_induction();
// "two-hop": a composition through an MLP. L0H0 copies the previous token into F; mlp0 maps F to
// G (token v -> v + 3; ReLU units with hand-set weights); L1H0, at the last position, attends to
// position 2 and copies G into OUT; distractors L0H1 (TOK -> JUNK, three times larger) and L1H1
// (JUNK -> JUNK) are active and read by no one. Rows [BOS a x y z], a corrupted: the answer at the
// last position is a + 3. True edges embed -> L0H0.v, L0H0 -> mlp0, L1H0 -> logits and the
// MLP-sender edge mlp0 -> L1H0.v; L0H0 -> L1H0.v (the direct route, which L1H0 does not read) is
// not one.
PlantedCircuit planted_two_hop();
std::vector<std::string> planted_circuit_names();
PlantedCircuit planted_circuit(const std::string& name);  // fails naming the choices

// Precision and recall of a circuit (kept, model_edges order) against a true edge set.
struct CircuitRecovery {
  size_t kept = 0, true_edges = 0, found = 0;  // found: kept edges that are true
  double precision() const { return kept ? static_cast<double>(found) / static_cast<double>(kept) : 1.0; }
  double recall() const { return true_edges ? static_cast<double>(found) / static_cast<double>(true_edges) : 1.0; }
};
CircuitRecovery circuit_recovery(const ModelConfig& cfg, const std::vector<bool>& kept,
                                 const std::vector<std::pair<EdgeSender, EdgeReceiver>>& true_edges);
// The true edge set as a kept mask (model_edges order).
std::vector<bool> edge_mask(const ModelConfig& cfg, const std::vector<std::pair<EdgeSender, EdgeReceiver>>& edges);

}  // namespace hl
