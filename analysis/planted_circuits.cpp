#include "analysis/planted_circuits.h"

#include <algorithm>

namespace hl {

namespace {

// The residual stream's blocks for a vocabulary of V and T positions.
struct Layout {
  int64_t V, T;
  int64_t tok(int64_t v) const { return v; }
  int64_t pos(int64_t p) const { return V + p; }
  int64_t prev(int64_t v) const { return V + T + v; }
  int64_t junk(int64_t v) const { return 2 * V + T + v; }
  int64_t out(int64_t v) const { return 3 * V + T + v; }
  int64_t d_model() const { return 4 * V + T; }
};

// a parameter's tensor (sharing the model's storage)
Tensor param(TransformerLM& m, const std::string& name) {
  for (auto& [n, p] : m.named_parameters())
    if (n == name) return p;
  fail("planted circuit: no parameter ", name);
}

// w (out, in): w[row, col] = v
void set(TransformerLM& m, const std::string& name, int64_t row, int64_t col, float v) {
  Tensor w = param(m, name);
  w.data()[row * w.size(1) + col] = v;
}

// Every weight 0, the norms the identity (see the header).
void clear(TransformerLM& m) {
  for (auto& [name, p] : m.named_parameters()) {
    const bool norm_gain = name.ends_with("ln1.weight") || name.ends_with("ln2.weight") || name == "ln_f.weight";
    p.fill_(norm_gain ? 1e4f : 0.f);
  }
}

}  // namespace

PlantedCircuit planted_induction() {
  const Layout lay{8, 6};
  ModelConfig c;
  c.vocab_size = lay.V;
  c.max_seq_len = lay.T;
  c.d_model = lay.d_model();  // 38
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_head = 16;
  c.d_ff = 0;
  c.normalization = NormKind::RMSNorm;
  c.layer_norm_eps = 1e8f;
  PlantedCircuit pc;
  pc.name = "induction";
  pc.description = "previous-token head L0H0 -> induction head L1H0's key; distractors L0H1, L1H1 write JUNK";
  pc.model = std::make_unique<TransformerLM>(c, 1);
  TransformerLM& m = *pc.model;
  clear(m);
  const int64_t dh = c.d_head;
  // q . k / sqrt(16) = s^2 / 4 = 25 on the chosen key, 0 elsewhere: softmax weight e^-25 off it
  const float s = 10.f;
  for (int64_t v = 0; v < lay.V; ++v) set(m, "tok_emb.weight", v, lay.tok(v), 1.f);
  for (int64_t p = 0; p < lay.T; ++p) set(m, "pos_emb.weight", p, lay.pos(p), 1.f);
  const std::string a0 = "blocks.0.attn.", a1 = "blocks.1.attn.";
  // L0H0, previous token: query at p is key p - 1's direction; value TOK -> PREV
  for (int64_t p = 0; p < lay.T; ++p) {
    if (p > 0) set(m, a0 + "W_Q.weight", p - 1, lay.pos(p), s);
    set(m, a0 + "W_K.weight", p, lay.pos(p), s);
  }
  for (int64_t v = 0; v < lay.V; ++v) {
    set(m, a0 + "W_V.weight", v, lay.tok(v), 1.f);
    set(m, a0 + "W_O.weight", lay.prev(v), v, 1.f);
  }
  // L0H1, distractor: attends to itself, value TOK -> JUNK (three times larger than the circuit's)
  for (int64_t p = 0; p < lay.T; ++p) {
    set(m, a0 + "W_Q.weight", dh + p, lay.pos(p), s);
    set(m, a0 + "W_K.weight", dh + p, lay.pos(p), s);
  }
  for (int64_t v = 0; v < lay.V; ++v) {
    set(m, a0 + "W_V.weight", dh + v, lay.tok(v), 3.f);
    set(m, a0 + "W_O.weight", lay.junk(v), dh + v, 1.f);
  }
  // L1H0, induction: query TOK, key PREV; value TOK -> OUT
  for (int64_t v = 0; v < lay.V; ++v) {
    set(m, a1 + "W_Q.weight", v, lay.tok(v), s);
    set(m, a1 + "W_K.weight", v, lay.prev(v), s);
    set(m, a1 + "W_V.weight", v, lay.tok(v), 1.f);
    set(m, a1 + "W_O.weight", lay.out(v), v, 1.f);
  }
  // L1H1: attends by JUNK to JUNK and writes JUNK (read by no one)
  for (int64_t v = 0; v < lay.V; ++v) {
    set(m, a1 + "W_Q.weight", dh + v, lay.junk(v), 1.f);
    set(m, a1 + "W_K.weight", dh + v, lay.junk(v), 1.f);
    set(m, a1 + "W_V.weight", dh + v, lay.junk(v), 1.f);
    set(m, a1 + "W_O.weight", lay.junk(v), dh + v, 1.f);
  }
  for (int64_t v = 0; v < lay.V; ++v) set(m, "head.weight", v, lay.out(v), 10.f);
  // rows [BOS a b x a y] (BOS = 0); the first a -> a', which appears nowhere else
  struct Row { int32_t a, b, x, y, a2; };
  const std::vector<Row> rows = {{1, 2, 3, 4, 5}, {3, 6, 7, 2, 4}, {5, 7, 2, 1, 6}, {2, 4, 1, 6, 7}};
  const int64_t B = static_cast<int64_t>(rows.size());
  pc.task.clean = Ids(Shape{B, lay.T});
  for (int64_t r = 0; r < B; ++r) {
    const Row& w = rows[r];
    const int32_t ids[6] = {0, w.a, w.b, w.x, w.a, w.y};
    for (int64_t t = 0; t < lay.T; ++t) pc.task.clean.at(r, t) = ids[t];
  }
  pc.task.corrupted = pc.task.clean;
  for (int64_t r = 0; r < B; ++r) {
    pc.task.corrupted.at(r, 1) = rows[r].a2;
    pc.task.answers.push_back({r, 4, rows[r].b, rows[r].a2});
    pc.task.source_pos.push_back(1);
  }
  pc.true_edges = {{EdgeSender{}, EdgeReceiver{EdgeReceiver::V, 0, 0}},
                   {EdgeSender{0, 0}, EdgeReceiver{EdgeReceiver::K, 1, 0}},
                   {EdgeSender{1, 0}, EdgeReceiver{}}};
  return pc;
}

std::vector<std::string> planted_circuit_names() { return {"induction"}; }

PlantedCircuit planted_circuit(const std::string& name) {
  if (name == "induction") return planted_induction();
  fail("planted circuit: unknown name '", name, "' (expected induction)");
}

std::vector<bool> edge_mask(const ModelConfig& cfg, const std::vector<std::pair<EdgeSender, EdgeReceiver>>& edges) {
  const auto all = model_edges(cfg);
  std::vector<bool> mask(all.size(), false);
  for (const auto& e : edges) {
    const auto it = std::find(all.begin(), all.end(), e);
    if (it == all.end()) fail("planted circuit: ", e.first.name(), " -> ", e.second.name(), " is not an edge of the model");
    mask[static_cast<size_t>(it - all.begin())] = true;
  }
  return mask;
}

CircuitRecovery circuit_recovery(const ModelConfig& cfg, const std::vector<bool>& kept,
                                 const std::vector<std::pair<EdgeSender, EdgeReceiver>>& true_edges) {
  const std::vector<bool> truth = edge_mask(cfg, true_edges);
  if (kept.size() != truth.size()) fail("circuit: ", kept.size(), " kept flags for the model's ", truth.size(), " edges");
  CircuitRecovery r;
  for (size_t e = 0; e < kept.size(); ++e) {
    r.kept += kept[e];
    r.true_edges += truth[e];
    r.found += kept[e] && truth[e];
  }
  return r;
}

}  // namespace hl
