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

PlantedCircuit planted_two_hop() {
  // the residual stream: TOK, POS, F (the copied token), G (the MLP's transform of it), JUNK, OUT
  const int64_t V = 8, T = 5;
  auto tok = [](int64_t v) { return v; };
  auto pos = [&](int64_t p) { return V + p; };
  auto feat = [&](int64_t v) { return V + T + v; };
  auto transformed = [&](int64_t v) { return 2 * V + T + v; };
  auto junk = [&](int64_t v) { return 3 * V + T + v; };
  auto out = [&](int64_t v) { return 4 * V + T + v; };
  auto map = [&](int64_t v) { return (v + 3) % V; };  // what the MLP computes: token v -> token v + 3
  ModelConfig c;
  c.vocab_size = V;
  c.max_seq_len = T;
  c.d_model = 5 * V + T;  // 45
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_head = 16;
  c.d_ff = V;
  c.activation = Activation::Relu;
  c.normalization = NormKind::RMSNorm;
  c.layer_norm_eps = 1e8f;
  PlantedCircuit pc;
  pc.name = "two-hop";
  pc.description = "L0H0 copies the previous token into F, mlp0 maps F to G (v -> v + 3), L1H0 copies G from position 2 "
                   "to the last; distractors L0H1, L1H1 write JUNK";
  pc.model = std::make_unique<TransformerLM>(c, 1);
  TransformerLM& m = *pc.model;
  clear(m);
  const int64_t dh = c.d_head;
  const float s = 10.f;  // 25 on the chosen key: e^-25 elsewhere
  for (int64_t v = 0; v < V; ++v) set(m, "tok_emb.weight", v, tok(v), 1.f);
  for (int64_t p = 0; p < T; ++p) set(m, "pos_emb.weight", p, pos(p), 1.f);
  const std::string a0 = "blocks.0.attn.", a1 = "blocks.1.attn.", f0 = "blocks.0.ffn.";
  // L0H0, previous token: TOK -> F
  for (int64_t p = 0; p < T; ++p) {
    if (p > 0) set(m, a0 + "W_Q.weight", p - 1, pos(p), s);
    set(m, a0 + "W_K.weight", p, pos(p), s);
  }
  for (int64_t v = 0; v < V; ++v) {
    set(m, a0 + "W_V.weight", v, tok(v), 1.f);
    set(m, a0 + "W_O.weight", feat(v), v, 1.f);
  }
  // L0H1, distractor: attends to itself, TOK -> JUNK (three times the circuit's size)
  for (int64_t p = 0; p < T; ++p) {
    set(m, a0 + "W_Q.weight", dh + p, pos(p), s);
    set(m, a0 + "W_K.weight", dh + p, pos(p), s);
  }
  for (int64_t v = 0; v < V; ++v) {
    set(m, a0 + "W_V.weight", dh + v, tok(v), 3.f);
    set(m, a0 + "W_O.weight", junk(v), dh + v, 1.f);
  }
  // mlp0: hidden unit v = relu(F_v - 0.5), written to G at map(v): a one-hot F becomes a one-hot G
  for (int64_t v = 0; v < V; ++v) {
    set(m, f0 + "fc1.weight", v, feat(v), 1.f);
    param(m, f0 + "fc1.bias").data()[v] = -0.5f;
    set(m, f0 + "fc2.weight", transformed(map(v)), v, 2.f);
  }
  // L1H0: the last position attends to position 2 (where F holds the source token); G -> OUT
  set(m, a1 + "W_Q.weight", 0, pos(T - 1), s);
  set(m, a1 + "W_K.weight", 0, pos(2), s);
  for (int64_t v = 0; v < V; ++v) {
    set(m, a1 + "W_V.weight", v, transformed(v), 1.f);
    set(m, a1 + "W_O.weight", out(v), v, 1.f);
  }
  // L1H1: JUNK -> JUNK (read by no one)
  for (int64_t v = 0; v < V; ++v) {
    set(m, a1 + "W_Q.weight", dh + v, junk(v), 1.f);
    set(m, a1 + "W_K.weight", dh + v, junk(v), 1.f);
    set(m, a1 + "W_V.weight", dh + v, junk(v), 1.f);
    set(m, a1 + "W_O.weight", junk(v), dh + v, 1.f);
  }
  for (int64_t v = 0; v < V; ++v) set(m, "head.weight", v, out(v), 10.f);
  // rows [BOS a x y z], a -> a' (absent from the row): the answer at the last position is map(a)
  struct Row { int32_t a, x, y, z, a2; };
  const std::vector<Row> rows = {{1, 2, 4, 5, 6}, {3, 6, 7, 1, 2}, {5, 1, 2, 7, 4}, {2, 4, 1, 6, 7}};
  const int64_t B = static_cast<int64_t>(rows.size());
  pc.task.clean = Ids(Shape{B, T});
  for (int64_t r = 0; r < B; ++r) {
    const int32_t ids[5] = {0, rows[r].a, rows[r].x, rows[r].y, rows[r].z};
    for (int64_t t = 0; t < T; ++t) pc.task.clean.at(r, t) = ids[t];
  }
  pc.task.corrupted = pc.task.clean;
  for (int64_t r = 0; r < B; ++r) {
    pc.task.corrupted.at(r, 1) = rows[r].a2;
    pc.task.answers.push_back({r, T - 1, static_cast<int32_t>(map(rows[r].a)), static_cast<int32_t>(map(rows[r].a2))});
    pc.task.source_pos.push_back(1);
  }
  pc.true_edges = {{EdgeSender{}, EdgeReceiver{EdgeReceiver::V, 0, 0}},
                   {EdgeSender{0, 0}, EdgeReceiver{EdgeReceiver::Mlp, 0, -1}},
                   {EdgeSender{1, 0}, EdgeReceiver{}}};
  pc.true_mlp_edges = {{0, EdgeReceiver{EdgeReceiver::V, 1, 0}}};
  return pc;
}

std::vector<std::string> planted_circuit_names() { return {"induction", "two-hop"}; }

PlantedCircuit planted_circuit(const std::string& name) {
  if (name == "induction") return planted_induction();
  if (name == "two-hop") return planted_two_hop();
  fail("planted circuit: unknown name '", name, "' (expected induction or two-hop)");
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
