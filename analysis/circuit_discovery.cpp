#include "analysis/circuit_discovery.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "lib/parallel.h"
#include "lib/rng.h"
#include "lib/stop.h"

namespace hl {

const char* interpolation_name(EapIgOptions::Interpolate i) { return i == EapIgOptions::Inputs ? "inputs" : "activations"; }

EapIgOptions::Interpolate parse_interpolation(const std::string& name) {
  if (name == "inputs") return EapIgOptions::Inputs;
  if (name == "activations") return EapIgOptions::Activations;
  fail("eap-ig: unknown interpolation '", name, "' (expected inputs or activations)");
}

namespace {

// head h of a per-head activation (B, T, H, D) -> (B, T, D)
Tensor head_of(const Tensor& x, int h) { return reshape(slice(x, 2, h, h + 1), {x.size(0), x.size(1), x.size(3)}); }

}  // namespace

// ---- EAP-IG -----------------------------------------------------------------------------------

namespace {

// EAP-IG on one batch of rows, every row computed at all of in's positions.
std::vector<double> eap_ig_batch(TransformerLM& model, const PatchingInputs& in, const EapIgOptions& opt, std::vector<double>* mlp_scores) {
  const ModelConfig& c = model.cfg;
  const auto edges = model_edges(c);
  // the MLPs as senders (mlp_sender_edge_list): with the input interpolated their edges take the
  // same gradients; with activations, each MLP's output is a point of its own
  const bool with_mlps = mlp_scores && c.has_mlp();
  const auto mlp_edges = with_mlps ? mlp_sender_edge_list(c) : std::vector<std::pair<int, EdgeReceiver>>{};
  if (mlp_scores) mlp_scores->assign(mlp_edges.size(), 0.0);
  // the interpolated points: the token embedding, and (activations) each attention layer's results
  // and each MLP's output; per point, the layer of the heads (or MLP) whose edges it scores
  std::vector<std::string> points = {"hook_embed"};
  constexpr int kNone = -2;  // a point that scores no edges of that kind (the embedding's layer is -1)
  std::vector<int> head_layer = {-1}, mlp_layer = {kNone};
  if (opt.interpolate == EapIgOptions::Activations) {
    for (int l = 0; l < c.n_layers; ++l) points.push_back(hook_name(l, "attn.hook_result")), head_layer.push_back(l), mlp_layer.push_back(kNone);
    if (with_mlps)
      for (int l = 0; l < c.n_layers; ++l) points.push_back(hook_name(l, "hook_mlp_out")), head_layer.push_back(kNone), mlp_layer.push_back(l);
  }
  auto wanted = [&](const std::string& n) {
    return is_sender_point(n) || std::find(points.begin(), points.end(), n) != points.end() || (with_mlps && n.ends_with("hook_mlp_out"));
  };
  // The clean run (alpha 1) is every point's last step: one forward and backward gives its
  // gradients, added to each point's sum, and the clean cache (the senders' outputs and the points).
  ActivationCache clean, corrupt;
  Tensor clean_grads;  // (receivers, B, T, D)
  add_receiver_gradients(model, in, clean_grads, [&](Hooks& hooks) { hooks.cache(clean, wanted); });
  {
    EvalScope mode(model);
    NoGradGuard ng;
    corrupt = model.run_with_cache(in.corrupted, wanted).second;
  }
  const Tensor deltas = edge_sender_delta_stack(model, clean, corrupt);                          // (senders, B, T, D)
  const Tensor mlp_deltas = with_mlps ? mlp_sender_delta_stack(c, clean, corrupt) : Tensor();  // (layers, B, T, D)
  std::vector<double> scores(edges.size(), 0.0);
  for (size_t g = 0; g < points.size(); ++g) {
    const std::string& point = points[g];
    const Tensor from_clean = sub(corrupt[point], clean[point]);  // corrupted - clean at this point
    // the receivers' gradients summed over the steps: delta_s . (sum of gradients) is the sum of
    // the steps' attributions, one product for all of them
    Tensor grad_sum = g + 1 == points.size() ? clean_grads : clean_grads.clone();  // the clean step's
    for (int k = 1; k < opt.steps; ++k) {
      throw_if_stopped();  // each step is a forward and backward over every row
      const float back = 1.f - static_cast<float>(k) / static_cast<float>(opt.steps);  // 1 - alpha
      const Tensor target = add(clean[point], mul_scalar(from_clean, back));
      const bool is_embed = g == 0;
      add_receiver_gradients(model, in, grad_sum, [&](Hooks& hooks) {
        hooks.add_forward(point, [target, is_embed](const Tensor& x, const std::string&) {
          // the embedding is the leaf: replaced outright. A layer's results keep their graph (the
          // value is target's, the gradient flows to x) so the receivers before them still get one.
          return is_embed ? target : add(x, sub(target, x.detach()));
        });
      });
    }
    // which edges take their gradients from this point's runs: all (inputs), or its senders'
    const bool all = opt.interpolate == EapIgOptions::Inputs;
    if (all || head_layer[g] != kNone) {
      const std::vector<double> products = edge_products(c, deltas, grad_sum);
      for (size_t e = 0; e < edges.size(); ++e)
        if (all || edges[e].first.layer == head_layer[g]) scores[e] = products[e] / static_cast<double>(opt.steps);
    }
    if (with_mlps && (all || mlp_layer[g] != kNone)) {
      const std::vector<double> products = mlp_edge_products(c, mlp_deltas, grad_sum);
      for (size_t e = 0; e < mlp_edges.size(); ++e)
        if (all || mlp_edges[e].first == mlp_layer[g]) (*mlp_scores)[e] = products[e] / static_cast<double>(opt.steps);
    }
  }
  return scores;
}

// The rows of `in` in `groups` groups of consecutive live lengths (a row's positions up to its last
// answer), each truncated to its longest row: a causal model's positions before the cut are
// computed as in the whole batch, and those after a row's last answer do not reach the metric.
// Per group its inputs and its share of the answers (its metric's weight in the batch's).
std::vector<std::pair<PatchingInputs, double>> rows_by_live_length(const PatchingInputs& in, int64_t groups) {
  const int64_t B = in.clean.shape[0];
  std::vector<int64_t> live(static_cast<size_t>(B), 0), order(static_cast<size_t>(B));
  for (const PatchAnswer& a : in.answers) live[a.row] = std::max(live[a.row], a.pos + 1);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return live[a] < live[b]; });
  std::vector<std::pair<PatchingInputs, double>> out;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t lo = g * B / groups, hi = (g + 1) * B / groups;
    if (hi == lo) continue;
    int64_t Tg = 1;
    for (int64_t i = lo; i < hi; ++i) Tg = std::max(Tg, live[order[i]]);
    PatchingInputs p;
    p.clean = Ids(Shape{hi - lo, Tg});
    p.corrupted = Ids(Shape{hi - lo, Tg});
    std::vector<int64_t> row_of(static_cast<size_t>(B), -1);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = order[i];
      row_of[r] = i - lo;
      for (int64_t t = 0; t < Tg; ++t) p.clean.at(i - lo, t) = in.clean.at(r, t), p.corrupted.at(i - lo, t) = in.corrupted.at(r, t);
      if (!in.source_pos.empty()) p.source_pos.push_back(in.source_pos[r]);
    }
    for (PatchAnswer a : in.answers)
      if (row_of[a.row] >= 0) a.row = row_of[a.row], p.answers.push_back(a);
    if (p.answers.empty()) continue;  // rows without answers add nothing to the metric
    const double share = static_cast<double>(p.answers.size()) / static_cast<double>(in.answers.size());
    out.push_back({std::move(p), share});
  }
  return out;
}

}  // namespace

std::vector<double> eap_ig_scores(TransformerLM& model, const PatchingInputs& in, const EapIgOptions& opt, std::vector<double>* mlp_scores) {
  if (opt.steps < 1 || opt.steps > 1000) fail("eap-ig: steps ", opt.steps, " is outside 1..1000");
  if (opt.row_groups < 0 || opt.row_groups > 64) fail("eap-ig: row groups ", opt.row_groups, " is outside 0..64");
  check_edge_inputs(model.cfg, in);
  // Rows whose answers end early need not run to the end: in groups of like live lengths, fewer
  // positions per step. The metric is the answers' mean, so the scores are the groups' weighted by
  // their share of the answers. Padded batches run whole (their padding is the caller's), and by
  // default one step does too: it is then the attribution bit for bit, and no slower.
  const int64_t B = in.clean.shape[0];
  const int64_t groups = in.key_padding.defined() ? 1
                         : opt.row_groups > 0     ? opt.row_groups
                         : B >= 32 && opt.steps > 1 ? 4
                                                    : 1;
  if (groups <= 1 || B < 2) return eap_ig_batch(model, in, opt, mlp_scores);
  std::vector<double> scores;
  if (mlp_scores) mlp_scores->clear();
  for (const auto& [part, share] : rows_by_live_length(in, std::min(groups, B))) {
    std::vector<double> part_mlp;
    const std::vector<double> s = eap_ig_batch(model, part, opt, mlp_scores ? &part_mlp : nullptr);
    if (scores.empty()) scores.assign(s.size(), 0.0);
    for (size_t e = 0; e < s.size(); ++e) scores[e] += share * s[e];
    if (mlp_scores) {
      if (mlp_scores->empty()) mlp_scores->assign(part_mlp.size(), 0.0);
      for (size_t e = 0; e < part_mlp.size(); ++e) (*mlp_scores)[e] += share * part_mlp[e];
    }
  }
  return scores;
}

// ---- AtP* ---------------------------------------------------------------------------------------

std::vector<double> atp_star_scores(TransformerLM& model, const PatchingInputs& in, const AtpStarOptions& opt, std::vector<double>* mlp_scores) {
  check_edge_inputs(model.cfg, in);
  const ModelConfig& c = model.cfg;
  if (c.sandwich_norm)
    fail("atp-star: the model has sandwich norms (sandwich_norm); AtP*'s QK fix takes a head's output as what the residual "
         "stream adds, which a norm after attention does not allow");
  const int L = c.n_layers;
  const std::vector<EdgeReceiver> receivers = edge_receivers(c);
  // every edge's receiver: model_edges, then (with mlp_scores) the MLP-sender edges
  const bool with_mlps = mlp_scores && c.has_mlp();
  std::vector<EdgeReceiver> reads;
  for (const auto& [s, r] : model_edges(c)) reads.push_back(r);
  const size_t E = reads.size();
  if (with_mlps)
    for (const auto& [l, r] : mlp_sender_edge_list(c)) reads.push_back(r);
  const size_t W = reads.size();
  auto query_or_key = [&](size_t e) { return opt.qk_fix && (reads[e].kind == EdgeReceiver::Q || reads[e].kind == EdgeReceiver::K); };
  Tensor deltas, mlp_deltas;  // (senders, B, T, D), (layers, B, T, D)
  {
    EvalScope mode(model);
    NoGradGuard ng;
    auto wanted = [&](const std::string& n) { return is_sender_point(n) || (with_mlps && n.ends_with("hook_mlp_out")); };
    const ActivationCache clean = model.run_with_cache(in.clean, wanted).second, corrupt = model.run_with_cache(in.corrupted, wanted).second;
    deltas = edge_sender_delta_stack(model, clean, corrupt);
    if (with_mlps) mlp_deltas = mlp_sender_delta_stack(c, clean, corrupt);
  }
  // The scores (model_edges' then the MLP-sender edges') with the gradient through layer
  // `dropped`'s residual contributions set to 0 (-1: none), summed over the batch or (by_row) per
  // row: (B, W). The QK fix needs a head's output gradient only where the drop changes it: heads
  // before `dropped`.
  // the QK fix's runs and clean head results, recorded once for every drop
  const std::unique_ptr<QueryKeyOutputDots> qk_dots = opt.qk_fix ? std::make_unique<QueryKeyOutputDots>(model, in, with_mlps) : nullptr;
  auto scores_with = [&](int dropped, bool by_row) {
    const bool mlp = c.has_mlp();
    const Tensor grad_stack = receiver_gradient_stack(model, in, [dropped, mlp](Hooks& hooks) {
      if (dropped < 0) return;
      // the value unchanged, its gradient 0 (defined, so every receiver still gets one)
      auto drop = [](const Tensor& x, const std::string&) { return add(x.detach(), mul_scalar(x, 0.f)); };
      hooks.add_forward(hook_name(dropped, "hook_attn_out"), drop);
      if (mlp) hooks.add_forward(hook_name(dropped, "hook_mlp_out"), drop);
    });
    const std::vector<Tensor> grads = unstack(grad_stack);
    const std::vector<double> heads = by_row ? edge_products_by_row(c, deltas, grad_stack) : edge_products(c, deltas, grad_stack);
    std::vector<double> mlps;
    if (with_mlps) mlps = by_row ? mlp_edge_products_by_row(c, mlp_deltas, grad_stack) : mlp_edge_products(c, mlp_deltas, grad_stack);
    std::vector<double> out;  // (B, W)
    const size_t rows = heads.size() / E;
    for (size_t b = 0; b < rows; ++b) {
      out.insert(out.end(), heads.begin() + static_cast<std::ptrdiff_t>(b * E), heads.begin() + static_cast<std::ptrdiff_t>((b + 1) * E));
      if (with_mlps)
        out.insert(out.end(), mlps.begin() + static_cast<std::ptrdiff_t>(b * (W - E)), mlps.begin() + static_cast<std::ptrdiff_t>((b + 1) * (W - E)));
    }
    if (opt.qk_fix) {
      std::vector<Tensor> head_grads(static_cast<size_t>(L) * c.n_heads);  // (B, T, D) each: the sum of its readers'
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < c.n_heads; ++h) {
          if (dropped >= 0 && l >= dropped) continue;
          Tensor g;
          for (const EdgeReceiver& r : readers_of(c, {l, h})) {
            const Tensor& gr = grads[static_cast<size_t>(std::find(receivers.begin(), receivers.end(), r) - receivers.begin())];
            g = g.defined() ? add(g, gr) : gr;
          }
          head_grads[static_cast<size_t>(l) * c.n_heads + h] = g;
        }
      const std::vector<double> fixed = (*qk_dots)(head_grads, by_row);
      for (size_t i = 0; i < out.size(); ++i)
        if (query_or_key(i % W)) out[i] = fixed[i];
    }
    return out;
  };
  auto split = [&](std::vector<double> all) {  // (W) -> the edges', the MLP-sender edges' into mlp_scores
    if (mlp_scores) mlp_scores->assign(all.begin() + static_cast<std::ptrdiff_t>(E), all.end());
    all.resize(E);
    return all;
  };
  if (!opt.grad_drop) return split(scores_with(-1, false));
  // GradDrop (Kramar et al. 2024, arXiv 2403.00745, section 3.1.2, its equation 11): L estimates
  // per prompt pair, estimate l with the backward's gradient through layer l's additions to the
  // residual stream (its attention and MLP outputs) set to 0; the score is the mean over the prompt
  // pairs of (1 / (L - 1)) sum over l of |estimate l|: the absolute value is taken per prompt,
  // before the mean over prompts (a node's own layer gives 0, so 1 / (L - 1) makes it the mean over
  // the other layers). Here a prompt is a row of the batch, its estimate its part of the edge's
  // score (rows weighted by their share of the answers); for an edge the receiver takes the node's
  // place (the logits, after every layer: all L).
  const int64_t B = in.clean.shape[0];
  const std::vector<double> base = scores_with(-1, true);  // (B, W)
  std::vector<double> sum_abs(W, 0.0), total(W, 0.0);
  std::vector<int> layers(W, 0);
  for (int64_t b = 0; b < B; ++b)
    for (size_t e = 0; e < W; ++e) total[e] += base[b * W + e];
  for (int l = 0; l < L; ++l) {
    throw_if_stopped();
    const std::vector<double> d = scores_with(l, true);
    for (size_t e = 0; e < W; ++e) {
      const EdgeReceiver& r = reads[e];
      if (r.kind != EdgeReceiver::Logits && r.layer == l) continue;  // its own layer: always 0
      // a layer before the receiver changes no gradient it takes: the undropped estimate
      const std::vector<double>& from = r.kind != EdgeReceiver::Logits && l < r.layer ? base : d;
      for (int64_t b = 0; b < B; ++b) sum_abs[e] += std::abs(from[b * W + e]);
      ++layers[e];
    }
  }
  // the sign of the undropped score, for reading beside the other methods
  std::vector<double> out(W);
  for (size_t e = 0; e < W; ++e) out[e] = layers[e] ? std::copysign(sum_abs[e] / layers[e], total[e]) : total[e];
  return split(out);
}

// ---- the circuit run --------------------------------------------------------------------------

namespace {

// What the circuit run and the masked run both start from: the inputs checked, the clean and the
// corrupted run's sender outputs (hook_result of every head, the embeddings) and the embedding
// sender's corrupted-minus-clean delta. `what` leads the refusal of sandwich norms: both runs add
// a removed sender's delta where the residual stream reads it, which a norm after attention
// does not allow.
struct SenderRuns {
  Tensor clean_logits;  // (B, T, V)
  ActivationCache clean, corrupt;
  Tensor embed_delta;  // (B, T, d_model); rotary and NoPE models: the token embedding's alone
};

SenderRuns sender_runs(TransformerLM& model, const PatchingInputs& in, const std::string& what) {
  check_edge_inputs(model.cfg, in);
  if (model.cfg.sandwich_norm)
    fail(what, ": the model has sandwich norms (sandwich_norm); it patches heads' outputs where the residual stream reads "
               "them, which a norm after attention does not allow");
  EvalScope mode(model);
  NoGradGuard ng;
  auto filter = [](const std::string& n) {
    return n == "hook_embed" || n == "hook_pos_embed" || n.ends_with("attn.hook_result") || n.ends_with("hook_mlp_out");
  };
  SenderRuns r;
  std::tie(r.clean_logits, r.clean) = model.run_with_cache(in.clean, filter);
  r.corrupt = model.run_with_cache(in.corrupted, filter).second;
  r.embed_delta = sub(embed_output(r.corrupt), embed_output(r.clean));
  return r;
}

// Runs circuits of one model and task: the corrupted run's sender outputs and the clean run's
// logits are cached once.
class CircuitRunner {
 public:
  CircuitRunner(TransformerLM& model, const PatchingInputs& in)
      : m_(model), c_(model.cfg), in_(in), edges_(model_edges(c_)), mlp_edges_(mlp_sender_edge_list(c_)) {
    SenderRuns runs = sender_runs(model, in, "circuit (ACDC, faithfulness)");
    corrupt_ = std::move(runs.corrupt);
    embed_delta_ = runs.embed_delta;
    clean_log_probs_ = answer_log_probs(runs.clean_logits);
  }

  // mlp_kept: the MLP-sender edges' flags (mlp_sender_edge_list order); empty: all kept.
  CircuitRun run(const std::vector<bool>& kept, const std::vector<bool>& mlp_kept = {}) {
    if (kept.size() != edges_.size()) fail("circuit: ", kept.size(), " kept flags for the model's ", edges_.size(), " edges");
    if (!mlp_kept.empty() && mlp_kept.size() != mlp_edges_.size())
      fail("circuit: ", mlp_kept.size(), " MLP-sender kept flags for the model's ", mlp_edges_.size(), " MLP-sender edges");
    const int L = c_.n_layers;
    // the removed senders of each receiver: heads and the embedding, and MLPs (their layers)
    std::map<std::string, Removed> removed;
    std::map<std::string, EdgeReceiver> receiver;
    for (size_t e = 0; e < edges_.size(); ++e)
      if (!kept[e]) {
        removed[edges_[e].second.name()].senders.push_back(edges_[e].first);
        receiver[edges_[e].second.name()] = edges_[e].second;
      }
    for (size_t e = 0; e < mlp_kept.size(); ++e)
      if (!mlp_kept[e]) {
        removed[mlp_edges_[e].second.name()].mlps.push_back(mlp_edges_[e].first);
        receiver[mlp_edges_[e].second.name()] = mlp_edges_[e].second;
      }
    EvalScope mode(m_);
    NoGradGuard ng;
    Hooks hooks;
    auto results = std::make_shared<std::vector<Tensor>>(L);  // this run's hook_result per layer (B, T, H, D)
    auto mlp_outs = std::make_shared<std::vector<Tensor>>(L);  // this run's hook_mlp_out per layer (B, T, D)
    auto resid = std::make_shared<std::map<std::string, Tensor>>();
    for (int l = 0; l < L; ++l) {
      hooks.add_forward(hook_name(l, "attn.hook_result"), [results, l](const Tensor& t, const std::string&) {
        (*results)[l] = t;
        return Tensor();
      });
      if (c_.has_mlp())
        hooks.add_forward(hook_name(l, "hook_mlp_out"), [mlp_outs, l](const Tensor& t, const std::string&) {
          (*mlp_outs)[l] = t;
          return Tensor();
        });
    }
    auto observe = [&](const std::string& point) {
      hooks.add_forward(point, [resid, point](const Tensor& t, const std::string&) {
        (*resid)[point] = t;
        return Tensor();
      });
    };
    // sum over the removed senders of (corrupted - this run) at the time of the read
    const Tensor embed_delta = embed_delta_;
    const ActivationCache corrupt = corrupt_;
    auto correction = [results, mlp_outs, embed_delta, corrupt](const Removed& rm) {
      Tensor d;
      for (const EdgeSender& s : rm.senders) {
        const Tensor ds = s.layer < 0 ? embed_delta
                                      : sub(head_of(corrupt[hook_name(s.layer, "attn.hook_result")], s.head),
                                            head_of((*results)[s.layer], s.head));
        d = d.defined() ? add(d, ds) : ds;
      }
      for (int l : rm.mlps) {
        const Tensor ds = sub(corrupt[hook_name(l, "hook_mlp_out")], (*mlp_outs)[l]);
        d = d.defined() ? add(d, ds) : ds;
      }
      return d;
    };
    std::map<int, std::vector<std::pair<EdgeReceiver, Removed>>> by_layer;
    for (const auto& [name, senders] : removed) {
      const EdgeReceiver& r = receiver[name];
      by_layer[r.kind == EdgeReceiver::Logits ? L : r.layer].push_back({r, senders});
    }
    for (const auto& [l, rs] : by_layer) {
      if (l == L) {
        const std::string point = hook_name(L - 1, "hook_resid_post");
        observe(point);
        const Removed senders = rs[0].second;
        LayerNorm* ln = m_.ln_f.get();
        hooks.add_forward("ln_final.hook_normalized", [resid, point, senders, ln, correction](const Tensor&, const std::string&) {
          return ln->forward(add(resid->at(point), correction(senders)));
        });
        continue;
      }
      const std::string pre = hook_name(l, "hook_resid_pre");
      observe(pre);
      TransformerBlock& block = *m_.blocks[l];
      for (EdgeReceiver::Kind kind : {EdgeReceiver::Q, EdgeReceiver::K, EdgeReceiver::V}) {
        std::vector<std::pair<int, Removed>> heads;
        for (const auto& [r, senders] : rs)
          if (r.kind == kind) heads.push_back({r.head, senders});
        if (heads.empty()) continue;
        const char* point = kind == EdgeReceiver::Q ? "attn.hook_q_input" : kind == EdgeReceiver::K ? "attn.hook_k_input" : "attn.hook_v_input";
        LayerNorm* ln = &block.ln1;
        // head h's copy of ln1's output (B, T, H, D) replaced by ln1(input + correction)
        hooks.add_forward(hook_name(l, point), [resid, pre, heads, ln, correction](const Tensor& copies, const std::string&) {
          Tensor y = copies.clone();
          const int64_t rows = copies.size(0) * copies.size(1), H = copies.size(2), D = copies.size(3);
          for (const auto& [h, senders] : heads) {
            const Tensor v = ln->forward(add(resid->at(pre), correction(senders)));  // (B, T, D)
            for (int64_t r = 0; r < rows; ++r) std::copy(v.data() + r * D, v.data() + (r + 1) * D, y.data() + (r * H + h) * D);
          }
          return y;
        });
      }
      for (const auto& [r, senders] : rs)
        if (r.kind == EdgeReceiver::Mlp) {
          // ln2 reads hook_resid_mid, or in a parallel block the block's input
          const std::string mid = c_.parallel_block ? pre : hook_name(l, "hook_resid_mid");
          observe(mid);
          LayerNorm* ln = block.ln2.get();
          const Removed ss = senders;
          hooks.add_forward(hook_name(l, "ln2.hook_normalized"), [resid, mid, ss, ln, correction](const Tensor&, const std::string&) {
            return ln->forward(add(resid->at(mid), correction(ss)));
          });
        }
    }
    ForwardOptions opt;
    opt.hooks = &hooks;
    const Tensor logits = m_.forward(in_.clean, opt);
    CircuitRun out;
    out.metric = edge_metric(logits, in_.answers);
    const std::vector<std::vector<double>> lp = answer_log_probs(logits);
    for (size_t a = 0; a < lp.size(); ++a)
      for (size_t v = 0; v < lp[a].size(); ++v) out.kl += std::exp(clean_log_probs_[a][v]) * (clean_log_probs_[a][v] - lp[a][v]);
    out.kl /= static_cast<double>(lp.size());
    return out;
  }

  const std::vector<std::pair<EdgeSender, EdgeReceiver>>& edges() const { return edges_; }
  const std::vector<std::pair<int, EdgeReceiver>>& mlp_edges() const { return mlp_edges_; }

 private:
  struct Removed {
    std::vector<EdgeSender> senders;  // the embedding and heads
    std::vector<int> mlps;            // the MLPs' layers
  };

  // log-softmax of the logits at each answer's position, in double
  std::vector<std::vector<double>> answer_log_probs(const Tensor& logits) const {
    const int64_t T = logits.size(1), V = logits.size(2);
    std::vector<std::vector<double>> out;
    for (const PatchAnswer& a : in_.answers) {
      const float* row = logits.data() + (a.row * T + a.pos) * V;
      const double mx = *std::max_element(row, row + V);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      std::vector<double> lp(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) lp[v] = row[v] - mx - std::log(z);
      out.push_back(std::move(lp));
    }
    return out;
  }

  TransformerLM& m_;
  const ModelConfig& c_;
  const PatchingInputs& in_;
  std::vector<std::pair<EdgeSender, EdgeReceiver>> edges_;
  std::vector<std::pair<int, EdgeReceiver>> mlp_edges_;  // mlp_sender_edge_list
  ActivationCache corrupt_;
  Tensor embed_delta_;
  std::vector<std::vector<double>> clean_log_probs_;
};

}  // namespace

CircuitRun circuit_run(TransformerLM& model, const PatchingInputs& in, const std::vector<bool>& kept, const std::vector<bool>& mlp_kept) {
  CircuitRunner runner(model, in);
  return runner.run(kept, mlp_kept);
}

// ---- ACDC -------------------------------------------------------------------------------------

AcdcResult acdc(TransformerLM& model, const PatchingInputs& in, const AcdcOptions& opt) {
  if (!(opt.threshold >= 0) || !std::isfinite(opt.threshold)) fail("acdc: threshold ", opt.threshold, " must be a number >= 0");
  CircuitRunner runner(model, in);
  const auto& edges = runner.edges();
  const auto& mlp_edges = runner.mlp_edges();
  const int H = model.cfg.n_heads;
  AcdcResult res;
  res.kept.assign(edges.size(), true);
  res.scores.assign(edges.size(), 0.0);
  res.mlp_kept.assign(mlp_edges.size(), true);
  res.mlp_scores.assign(mlp_edges.size(), 0.0);
  CircuitRun cur = runner.run(res.kept, res.mlp_kept);
  res.runs = 1;
  // Every edge of the circuit, receivers in forward order, each one's senders in forward order
  // (embed, L0's heads, mlp0, L1's heads, ...): (receiver, sender's place, MLP edge?, index).
  struct Step {
    size_t receiver;
    int place;
    bool mlp;
    size_t index;
  };
  const std::vector<EdgeReceiver> receivers = edge_receivers(model.cfg);
  auto receiver_index = [&](const EdgeReceiver& r) { return static_cast<size_t>(std::find(receivers.begin(), receivers.end(), r) - receivers.begin()); };
  std::vector<Step> order;
  for (size_t e = 0; e < edges.size(); ++e) {
    const EdgeSender& s = edges[e].first;
    order.push_back({receiver_index(edges[e].second), s.layer < 0 ? -1 : s.layer * (H + 1) + s.head, false, e});
  }
  for (size_t e = 0; e < mlp_edges.size(); ++e)
    order.push_back({receiver_index(mlp_edges[e].second), mlp_edges[e].first * (H + 1) + H, true, e});
  std::stable_sort(order.begin(), order.end(), [](const Step& a, const Step& b) { return std::tie(a.receiver, a.place) < std::tie(b.receiver, b.place); });
  auto kept = [&](const Step& s) -> std::vector<bool>::reference { return s.mlp ? res.mlp_kept[s.index] : res.kept[s.index]; };
  // whether a kept edge reads r's head or MLP (its output matters)
  auto read = [&](const EdgeReceiver& r) {
    if (r.kind == EdgeReceiver::Logits) return true;
    if (r.kind == EdgeReceiver::Mlp) {
      for (size_t e = 0; e < mlp_edges.size(); ++e)
        if (res.mlp_kept[e] && mlp_edges[e].first == r.layer) return true;
      return false;
    }
    for (size_t e = 0; e < edges.size(); ++e)
      if (res.kept[e] && edges[e].first == EdgeSender{r.layer, r.head}) return true;
    return false;
  };
  // walk the receivers from the logits back, each one's senders in reverse order
  size_t end = order.size();
  while (end > 0) {
    size_t begin = end;
    while (begin > 0 && order[begin - 1].receiver == order[end - 1].receiver) --begin;
    // an MLP without MLP-sender edges (an attention-only model has none) is read by the residual stream
    const EdgeReceiver& r = receivers[order[end - 1].receiver];
    const bool is_read = (r.kind == EdgeReceiver::Mlp && mlp_edges.empty()) || read(r);
    for (size_t i = end; i-- > begin;) {
      throw_if_stopped();
      kept(order[i]) = false;
      if (!is_read) continue;
      const CircuitRun next = runner.run(res.kept, res.mlp_kept);
      ++res.runs;
      const double change = opt.score == AcdcOptions::Metric ? std::abs(next.metric - cur.metric) : next.kl - cur.kl;
      (order[i].mlp ? res.mlp_scores : res.scores)[order[i].index] = change;
      if (change < opt.threshold)
        cur = next;
      else
        kept(order[i]) = true;
    }
    end = begin;
  }
  res.final_run = cur;
  return res;
}

// ---- the masked circuit run and edge pruning ---------------------------------------------------

namespace {

// The masked circuit run as a differentiable forward: the corrupted run's sender outputs and the
// clean run's answer distributions cached once; each run takes the masks as a tensor.
class MaskedRunner {
 public:
  // The masks: model_edges, then the MLP-sender edges (mlp_sender_edge_list). The senders in
  // forward order: embed, L0's heads, mlp0 (a model with MLPs), L1's heads, ...: stride_ per layer.
  MaskedRunner(TransformerLM& model, const PatchingInputs& in)
      : m_(model), c_(model.cfg), in_(in), edges_(model_edges(c_)), mlp_edges_(mlp_sender_edge_list(c_)) {
    const SenderRuns runs = sender_runs(model, in, "edge pruning");
    stride_ = c_.n_heads + (c_.has_mlp() ? 1 : 0);
    const size_t S = 1 + static_cast<size_t>(c_.n_layers * stride_);
    const std::vector<EdgeReceiver> receivers = edge_receivers(c_);
    const size_t E = edges();
    // per receiver, its senders' edge indices (E: no edge, mask 1, weight 0)
    for (const EdgeReceiver& r : receivers) index_[r.name()] = std::vector<int32_t>(S, static_cast<int32_t>(E));
    for (size_t e = 0; e < edges_.size(); ++e) {
      const EdgeSender& s = edges_[e].first;
      index_[edges_[e].second.name()][s.layer < 0 ? 0 : 1 + s.layer * stride_ + s.head] = static_cast<int32_t>(e);
    }
    for (size_t e = 0; e < mlp_edges_.size(); ++e)
      index_[mlp_edges_[e].second.name()][1 + mlp_edges_[e].first * stride_ + c_.n_heads] = static_cast<int32_t>(edges_.size() + e);
    embed_delta_ = runs.embed_delta;
    for (int l = 0; l < c_.n_layers; ++l) {
      corrupt_results_.push_back(runs.corrupt[hook_name(l, "attn.hook_result")]);
      if (c_.has_mlp()) corrupt_mlp_outs_.push_back(runs.corrupt[hook_name(l, "hook_mlp_out")]);
    }
    // the answers' rows of the flattened logits, and the clean run's probabilities there
    const int64_t T = in.clean.shape[1], V = c_.vocab_size;
    answer_rows_ = Ids(Shape{static_cast<int64_t>(in.answers.size())});
    for (size_t a = 0; a < in.answers.size(); ++a) answer_rows_.data[a] = static_cast<int32_t>(in.answers[a].row * T + in.answers[a].pos);
    const Tensor lp = log_softmax(gather_rows(reshape(runs.clean_logits, {-1, V}), answer_rows_));  // (A, V)
    clean_probs_ = exp(lp);
    clean_entropy_term_ = 0;  // sum p log p / A: KL = this - sum p log q / A
    for (int64_t i = 0; i < lp.numel(); ++i) clean_entropy_term_ += static_cast<double>(clean_probs_.data()[i]) * lp.data()[i];
    clean_entropy_term_ /= static_cast<double>(in.answers.size());
  }

  size_t edges() const { return edges_.size() + mlp_edges_.size(); }
  size_t model_edge_count() const { return edges_.size(); }

  struct Out {
    Tensor metric, kl;  // scalars with the graph to the masks
  };
  // z: (E) masks, E = edges() (a leaf that may require grad).
  Out run(const Tensor& z) {
    const int L = c_.n_layers, H = c_.n_heads, stride = stride_;
    const int64_t E = static_cast<int64_t>(edges());
    // the masks and a 1 for "no edge": weight 1 - z per (receiver, sender)
    const Tensor z_full = concat({reshape(z, {E, 1}), Tensor::ones(Shape{1, 1})}, 0);  // (E + 1, 1)
    struct State {
      std::vector<Tensor> pre, mid, results, mlp_outs;  // this run's, per layer
      Tensor final_resid;
    };
    auto st = std::make_shared<State>();
    st->pre.resize(L), st->mid.resize(L), st->results.resize(L), st->mlp_outs.resize(L);
    const Shape bt_d = embed_delta_.shape();  // (B, T, D)
    const int64_t btd = embed_delta_.numel();
    // the corrections of a list of receivers: (R, B T D) = (1 - z) (R, senders) x diffs (senders, B T D),
    // the senders the first n in forward order (what is written before the receivers read)
    auto corrections = [this, st, z_full, btd, H, stride](const std::vector<std::string>& receivers, size_t n_senders) {
      std::vector<Tensor> diffs = {reshape(embed_delta_, {1, btd})};
      for (size_t s = 1; s < n_senders; ++s) {
        const int l = static_cast<int>((s - 1) / static_cast<size_t>(stride)), h = static_cast<int>((s - 1) % static_cast<size_t>(stride));
        diffs.push_back(reshape(h == H ? sub(corrupt_mlp_outs_[l], st->mlp_outs[l])
                                       : sub(head_of(corrupt_results_[l], h), head_of(st->results[l], h)),
                                {1, btd}));
      }
      Ids idx(Shape{static_cast<int64_t>(receivers.size() * n_senders)});
      for (size_t r = 0; r < receivers.size(); ++r)
        for (size_t s = 0; s < n_senders; ++s) idx.data[r * n_senders + s] = index_.at(receivers[r])[s];
      const Tensor w = add_scalar(neg(reshape(gather_rows(z_full, idx), {static_cast<int64_t>(receivers.size()), static_cast<int64_t>(n_senders)})), 1.f);
      return matmul(w, concat(diffs, 0));  // (R, B T D)
    };
    auto row = [bt_d](const Tensor& x, int64_t i) { return reshape(slice(x, 0, i, i + 1), bt_d); };
    Hooks hooks;
    for (int l = 0; l < L; ++l) {
      hooks.add_forward(hook_name(l, "hook_resid_pre"), [st, l](const Tensor& t, const std::string&) {
        st->pre[l] = t;
        return Tensor();
      });
      hooks.add_forward(hook_name(l, "attn.hook_result"), [st, l](const Tensor& t, const std::string&) {
        st->results[l] = t;
        return Tensor();
      });
      LayerNorm* ln1 = &m_.blocks[l]->ln1;
      const size_t before = 1 + static_cast<size_t>(l * stride);  // senders written before layer l
      for (EdgeReceiver::Kind kind : {EdgeReceiver::Q, EdgeReceiver::K, EdgeReceiver::V}) {
        const char* point = kind == EdgeReceiver::Q ? "attn.hook_q_input" : kind == EdgeReceiver::K ? "attn.hook_k_input" : "attn.hook_v_input";
        std::vector<std::string> names;
        for (int h = 0; h < H; ++h) names.push_back(EdgeReceiver{kind, l, h}.name());
        // every head's copy of ln1's output (B, T, H, D) rebuilt: ln1(input + its correction)
        hooks.add_forward(hook_name(l, point), [st, l, ln1, names, before, corrections, row, H](const Tensor& copies, const std::string&) {
          const Tensor corr = corrections(names, before);
          std::vector<Tensor> heads;
          const Shape one{copies.size(0), copies.size(1), 1, copies.size(3)};
          for (int h = 0; h < H; ++h) heads.push_back(reshape(ln1->forward(add(st->pre[l], row(corr, h))), one));
          return concat(heads, 2);
        });
      }
      if (c_.has_mlp()) {
        if (!c_.parallel_block)
          hooks.add_forward(hook_name(l, "hook_resid_mid"), [st, l](const Tensor& t, const std::string&) {
            st->mid[l] = t;
            return Tensor();
          });
        hooks.add_forward(hook_name(l, "hook_mlp_out"), [st, l](const Tensor& t, const std::string&) {
          st->mlp_outs[l] = t;
          return Tensor();
        });
        LayerNorm* ln2 = m_.blocks[l]->ln2.get();
        const bool parallel = c_.parallel_block;
        const size_t n = parallel ? before : before + H;
        const std::vector<std::string> names = {EdgeReceiver{EdgeReceiver::Mlp, l, -1}.name()};
        hooks.add_forward(hook_name(l, "ln2.hook_normalized"), [st, l, ln2, names, n, parallel, corrections, row](const Tensor&, const std::string&) {
          return ln2->forward(add(parallel ? st->pre[l] : st->mid[l], row(corrections(names, n), 0)));
        });
      }
    }
    hooks.add_forward(hook_name(L - 1, "hook_resid_post"), [st](const Tensor& t, const std::string&) {
      st->final_resid = t;
      return Tensor();
    });
    LayerNorm* lnf = m_.ln_f.get();
    const size_t all = 1 + static_cast<size_t>(L * stride);
    hooks.add_forward("ln_final.hook_normalized", [st, lnf, all, corrections, row](const Tensor&, const std::string&) {
      return lnf->forward(add(st->final_resid, row(corrections({"logits"}, all), 0)));
    });
    EvalScope mode(m_);
    ForwardOptions opt;
    opt.hooks = &hooks;
    const Tensor logits = m_.forward(in_.clean, opt);
    Out out;
    out.metric = logit_difference(logits, in_.answers);
    const Tensor lq = log_softmax(gather_rows(reshape(logits, {-1, c_.vocab_size}), answer_rows_));  // (A, V)
    const float a = static_cast<float>(in_.answers.size());
    out.kl = add_scalar(mul_scalar(sum(mul(clean_probs_, lq)), -1.f / a), static_cast<float>(clean_entropy_term_));
    return out;
  }

 private:
  TransformerLM& m_;
  const ModelConfig& c_;
  const PatchingInputs& in_;
  std::vector<std::pair<EdgeSender, EdgeReceiver>> edges_;
  std::vector<std::pair<int, EdgeReceiver>> mlp_edges_;
  int stride_ = 0;                                     // senders per layer: its heads and its MLP
  std::map<std::string, std::vector<int32_t>> index_;  // receiver name -> per sender, its edge (E: none)
  Tensor embed_delta_;
  std::vector<Tensor> corrupt_results_, corrupt_mlp_outs_;
  Ids answer_rows_;
  Tensor clean_probs_;
  double clean_entropy_term_ = 0;
};

Tensor mask_tensor(const std::vector<double>& mask) {
  std::vector<float> v(mask.begin(), mask.end());
  return Tensor::from(Shape{static_cast<int64_t>(v.size())}, v);
}

}  // namespace

MaskedRun masked_circuit_run(TransformerLM& model, const PatchingInputs& in, const std::vector<double>& mask, bool gradients) {
  MaskedRunner runner(model, in);
  if (mask.size() != runner.edges() && mask.size() != runner.model_edge_count())
    fail("circuit: ", mask.size(), " mask values for the model's ", runner.model_edge_count(), " edges (", runner.edges(),
         " with the MLP-sender edges)");
  std::vector<double> full = mask;
  full.resize(runner.edges(), 1.0);  // the MLP-sender edges kept unless given
  MaskedRun out;
  if (!gradients) {
    NoGradGuard ng;
    const MaskedRunner::Out r = runner.run(mask_tensor(full));
    out.metric = r.metric.item(), out.kl = r.kl.item();
    return out;
  }
  if (!grad_enabled()) fail("circuit: the masked run's gradients need a backward; run it outside no_grad");
  for (int which = 0; which < 2; ++which) {  // the metric's gradient, then the KL's
    Tensor z = mask_tensor(full);
    z.requires_grad_();
    const MaskedRunner::Out r = runner.run(z);
    out.metric = r.metric.item(), out.kl = r.kl.item();
    (which == 0 ? r.metric : r.kl).backward();
    model.zero_grad();
    std::vector<double>& g = which == 0 ? out.metric_grad : out.kl_grad;
    const Tensor gz = z.grad();
    for (size_t i = 0; i < mask.size(); ++i) g.push_back(gz.data()[i]);
  }
  return out;
}

size_t circuit_edge_count(const ModelConfig& cfg) { return model_edges(cfg).size() + mlp_sender_edge_list(cfg).size(); }

std::vector<std::string> circuit_edge_names(const ModelConfig& cfg, const std::vector<bool>& kept, const std::vector<bool>& mlp_kept) {
  const auto edges = model_edges(cfg);
  const auto mlp_edges = mlp_sender_edge_list(cfg);
  std::vector<std::string> out;
  for (size_t e = 0; e < kept.size() && e < edges.size(); ++e)
    if (kept[e]) out.push_back(edges[e].first.name() + "->" + edges[e].second.name());
  for (size_t e = 0; e < mlp_kept.size() && e < mlp_edges.size(); ++e)
    if (mlp_kept[e]) out.push_back("mlp" + std::to_string(mlp_edges[e].first) + "->" + mlp_edges[e].second.name());
  return out;
}

void check_edge_pruning_options(const EdgePruningOptions& opt, size_t edges) {
  if (edges > 0 && (opt.target_edges < 1 || static_cast<size_t>(opt.target_edges) > edges))
    fail("edge pruning: target edges ", opt.target_edges, " is outside 1..", edges, " (the model's edges, MLP senders included)");
  if (opt.steps < 1 || opt.steps > 100000) fail("edge pruning: steps ", opt.steps, " is outside 1..100000");
  if (!(opt.lr > 0 && opt.lr <= 10)) fail("edge pruning: lr ", opt.lr, " is outside (0, 10]");
}

EdgePruningResult edge_pruning(TransformerLM& model, const PatchingInputs& in, const EdgePruningOptions& opt) {
  MaskedRunner runner(model, in);
  const size_t E = runner.edges();
  check_edge_pruning_options(opt, E);
  if (!grad_enabled()) fail("edge pruning: the masks are learned by backward passes; run it outside no_grad");
  // hard concrete (Louizos et al. 2018)
  const double beta = 2.0 / 3.0, gamma = -0.1, zeta = 1.1, l0_shift = beta * std::log(-gamma / zeta);
  auto sigm = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  std::vector<double> log_alpha(E, 3.0), m1(E, 0.0), m2(E, 0.0);  // starts near the full model
  double lambda1 = 0, lambda2 = 0;
  const double target = static_cast<double>(opt.target_edges) / static_cast<double>(E);
  Rng rng(opt.seed);
  EdgePruningResult res;
  for (int step = 1; step <= opt.steps; ++step) {
    throw_if_stopped();
    // one sample of every mask, and dz/dlog_alpha
    std::vector<double> z(E), dz(E);
    for (size_t e = 0; e < E; ++e) {
      const double u = std::clamp(static_cast<double>(rng.uniform()), 1e-6, 1 - 1e-6);
      const double s = sigm((std::log(u) - std::log(1 - u) + log_alpha[e]) / beta);
      const double stretched = s * (zeta - gamma) + gamma;
      z[e] = std::clamp(stretched, 0.0, 1.0);
      dz[e] = stretched > 0 && stretched < 1 ? (zeta - gamma) * s * (1 - s) / beta : 0.0;
    }
    Tensor zt = mask_tensor(z);
    zt.requires_grad_();
    const MaskedRunner::Out r = runner.run(zt);
    r.kl.backward();
    model.zero_grad();
    res.final_kl = r.kl.item();
    const Tensor gz = zt.grad();
    // the expected fraction kept and the Lagrangian's pull towards the target of this step
    double kept = 0;
    for (size_t e = 0; e < E; ++e) kept += sigm(log_alpha[e] - l0_shift);
    kept /= static_cast<double>(E);
    const double t = 1.0 - (1.0 - target) * std::min(1.0, 2.0 * step / static_cast<double>(opt.steps));
    const double gap = kept - t, pull = lambda1 + 2 * lambda2 * gap;
    for (size_t e = 0; e < E; ++e) {
      const double p = sigm(log_alpha[e] - l0_shift);
      const double g = static_cast<double>(gz.data()[e]) * dz[e] + pull * p * (1 - p) / static_cast<double>(E);
      // Adam (0.9, 0.999, 1e-8)
      m1[e] = 0.9 * m1[e] + 0.1 * g;
      m2[e] = 0.999 * m2[e] + 0.001 * g * g;
      const double mh = m1[e] / (1 - std::pow(0.9, step)), vh = m2[e] / (1 - std::pow(0.999, step));
      log_alpha[e] -= opt.lr * mh / (std::sqrt(vh) + 1e-8);
    }
    // the lambdas ascend the Lagrangian
    lambda1 += opt.lr * gap;
    lambda2 += opt.lr * gap * gap;
  }
  // the circuit: the target_edges largest log_alpha, model edges first, then the MLP-sender edges
  const size_t E0 = runner.model_edge_count();
  std::vector<size_t> order(E);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return log_alpha[a] > log_alpha[b]; });
  std::vector<bool> kept(E, false);
  for (int i = 0; i < opt.target_edges; ++i) kept[order[static_cast<size_t>(i)]] = true;
  for (size_t e = 0; e < E; ++e) (e < E0 ? res.keep_probability : res.mlp_keep_probability).push_back(sigm(log_alpha[e] - l0_shift));
  res.kept.assign(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(E0));
  res.mlp_kept.assign(kept.begin() + static_cast<std::ptrdiff_t>(E0), kept.end());
  res.final_run = circuit_run(model, in, res.kept, res.mlp_kept);
  return res;
}

// ---- circuits of a size -----------------------------------------------------------------------

std::vector<bool> top_edges(const std::vector<double>& scores, size_t k) {
  if (k > scores.size()) fail("circuit: size ", k, " is above the model's ", scores.size(), " edges");
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::abs(scores[a]) > std::abs(scores[b]); });
  std::vector<bool> kept(scores.size(), false);
  for (size_t i = 0; i < k; ++i) kept[order[i]] = true;
  return kept;
}

std::pair<std::vector<bool>, std::vector<bool>> top_edges(const std::vector<double>& scores, const std::vector<double>& mlp_scores,
                                                          size_t k) {
  std::vector<double> both = scores;
  both.insert(both.end(), mlp_scores.begin(), mlp_scores.end());
  const std::vector<bool> kept = top_edges(both, k);
  const auto split = kept.begin() + static_cast<std::ptrdiff_t>(scores.size());
  return {std::vector<bool>(kept.begin(), split), std::vector<bool>(split, kept.end())};
}

std::vector<FaithfulnessPoint> faithfulness_curve(TransformerLM& model, const PatchingInputs& in,
                                                  const std::vector<double>& scores, const std::vector<size_t>& sizes) {
  const size_t n = model_edges(model.cfg).size();
  if (scores.size() != n) fail("circuit: ", scores.size(), " scores for the model's ", n, " edges");
  for (size_t k : sizes)
    if (k > n) fail("circuit: size ", k, " is above the model's ", n, " edges");
  CircuitRunner runner(model, in);
  std::vector<FaithfulnessPoint> out;
  for (size_t k : sizes) {
    throw_if_stopped();
    out.push_back({k, runner.run(top_edges(scores, k)).metric});
  }
  return out;
}

// ---- the methods by name, scored against exact patching --------------------------------------------

std::vector<std::string> edge_method_names() { return {"attribution", "eap-ig", "atp-star", "acdc", "edge-pruning"}; }

namespace {
// "a, b or c"
std::string choices(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}
}  // namespace

void check_edge_method(const std::string& method) {
  const auto names = edge_method_names();
  if (std::find(names.begin(), names.end(), method) == names.end())
    fail("edges: unknown method '", method, "' (expected ", choices(names), ")");
}

AcdcOptions::Score parse_acdc_score(const std::string& name) {
  if (name == "metric") return AcdcOptions::Metric;
  if (name == "kl") return AcdcOptions::Kl;
  fail("acdc: unknown score '", name, "' (expected metric or kl)");
}

void check_edge_method_options(const EdgeMethodOptions& opt) {
  check_edge_method(opt.method);
  if (opt.ig.steps < 1 || opt.ig.steps > 1000) fail("eap-ig: steps ", opt.ig.steps, " is outside 1..1000");
  if (!(opt.acdc.threshold >= 0) || !std::isfinite(opt.acdc.threshold))
    fail("acdc: threshold ", opt.acdc.threshold, " must be a number >= 0");
  check_edge_pruning_options(opt.pruning, 0);
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

MethodScores run_edge_method(TransformerLM& model, const PatchingInputs& in, const EdgeResult& exact, const EdgeMethodOptions& opt) {
  check_edge_method_options(opt);
  MethodScores out;
  out.method = opt.method;
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.method == "attribution") {
    (void)receiver_gradients(model, in);  // timed as the method would run alone: one backward
    for (const Edge& e : exact.edges) out.scores.push_back(e.attribution);
  } else if (opt.method == "eap-ig") {
    out.scores = eap_ig_scores(model, in, opt.ig, &out.mlp_scores);
  } else if (opt.method == "atp-star") {
    out.scores = atp_star_scores(model, in, opt.atp, &out.mlp_scores);
  } else if (opt.method == "edge-pruning") {
    EdgePruningResult p = edge_pruning(model, in, opt.pruning);
    out.scores = std::move(p.keep_probability);
    out.circuit = std::move(p.kept);
    out.mlp_scores = std::move(p.mlp_keep_probability);
    out.mlp_circuit = std::move(p.mlp_kept);
  } else {
    AcdcResult a = acdc(model, in, opt.acdc);
    out.scores = std::move(a.scores);
    out.circuit = std::move(a.kept);
    out.mlp_scores = std::move(a.mlp_scores);
    out.mlp_circuit = std::move(a.mlp_kept);
  }
  out.seconds = seconds_since(t0);
  return out;
}

namespace {
// ranks of |x| (1 = smallest), ties at their mean rank
std::vector<double> abs_ranks(const std::vector<double>& x) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::abs(x[a]) < std::abs(x[b]); });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && std::abs(x[order[j + 1]]) == std::abs(x[order[i]])) ++j;
    for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * static_cast<double>(i + j) + 1.0;
    i = j + 1;
  }
  return r;
}
}  // namespace

double rank_correlation(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) fail("edges: rank correlation of ", a.size(), " and ", b.size(), " values");
  const std::vector<double> ra = abs_ranks(a), rb = abs_ranks(b);
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < ra.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

double top_k_overlap(const std::vector<double>& a, const std::vector<double>& b, size_t k) {
  if (k < 1 || k > a.size()) fail("edges: top-k overlap of k ", k, " outside 1..", a.size(), " (the model's edges)");
  const std::vector<bool> ta = top_edges(a, k), tb = top_edges(b, k);
  size_t both = 0;
  for (size_t i = 0; i < ta.size(); ++i) both += ta[i] && tb[i];
  return static_cast<double>(both) / static_cast<double>(k);
}

std::vector<size_t> faithfulness_sizes(size_t n) {
  std::vector<size_t> s;
  for (size_t base = 1;; base *= 10) {
    for (size_t m : {size_t{1}, size_t{2}, size_t{5}})
      if (base * m < n) s.push_back(base * m);
    if (base * 10 >= n) break;
  }
  s.insert(s.begin(), 0);
  s.push_back(n);
  return s;
}

EdgeComparison compare_edge_methods(TransformerLM& model, const PatchingInputs& in, const std::vector<std::string>& methods,
                                    const EdgeMethodOptions& opt, size_t top_k, const std::vector<size_t>& sizes) {
  for (const std::string& m : methods) check_edge_method(m);
  if (methods.empty()) fail("edges: no methods to compare");
  check_edge_inputs(model.cfg, in);
  const size_t n = model_edges(model.cfg).size();
  if (top_k < 1 || top_k > n) fail("edges: top-k ", top_k, " is outside 1..", n, " (the model's edges)");
  for (size_t k : sizes)
    if (k > n) fail("circuit: size ", k, " is above the model's ", n, " edges");
  if (std::find(methods.begin(), methods.end(), "edge-pruning") != methods.end())
    check_edge_pruning_options(opt.pruning, circuit_edge_count(model.cfg));
  EdgeComparison c;
  c.top_k = top_k;
  const auto t0 = std::chrono::steady_clock::now();
  c.exact = edge_patching(model, in);
  c.exact_seconds = seconds_since(t0);
  std::vector<double> exact;
  for (const Edge& e : c.exact.edges) exact.push_back(e.exact);
  c.exact_curve = faithfulness_curve(model, in, exact, sizes);
  for (const std::string& name : methods) {
    EdgeMethodOptions o = opt;
    o.method = name;
    MethodComparison m;
    m.scores = run_edge_method(model, in, c.exact, o);
    m.rank_correlation = rank_correlation(m.scores.scores, exact);
    m.top_k_overlap = top_k_overlap(m.scores.scores, exact, top_k);
    m.curve = faithfulness_curve(model, in, m.scores.scores, sizes);
    c.methods.push_back(std::move(m));
  }
  return c;
}

// ---- MIB export ---------------------------------------------------------------------------------

namespace {
std::string mib_sender(const EdgeSender& s) {
  return s.layer < 0 ? "input" : "a" + std::to_string(s.layer) + ".h" + std::to_string(s.head);
}
std::string mib_receiver(const EdgeReceiver& r) {
  switch (r.kind) {
    case EdgeReceiver::Q: case EdgeReceiver::K: case EdgeReceiver::V:
      return "a" + std::to_string(r.layer) + ".h" + std::to_string(r.head) + "<" + std::string(1, "qkv"[r.kind]) + ">";
    case EdgeReceiver::Mlp: return "m" + std::to_string(r.layer);
    case EdgeReceiver::Logits: return "logits";
  }
  return "";
}
}  // namespace

std::string mib_graph_json(const ModelConfig& cfg, const std::vector<double>& scores, const std::vector<bool>& kept,
                           const std::vector<double>& mlp_scores, const std::vector<bool>& mlp_kept) {
  check_edge_model(cfg);
  const auto edges = model_edges(cfg);
  if (scores.size() != edges.size()) fail("mib export: ", scores.size(), " scores for the model's ", edges.size(), " edges");
  if (!kept.empty() && kept.size() != edges.size()) fail("mib export: ", kept.size(), " kept flags for the model's ", edges.size(), " edges");
  nlohmann::ordered_json nodes = nlohmann::ordered_json::object(), out_edges = nlohmann::ordered_json::object();
  auto node = [&](const std::string& n, bool in) { nodes[n]["in_graph"] = nodes.contains(n) ? (nodes[n]["in_graph"].get<bool>() || in) : in; };
  node("input", false);
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int h = 0; h < cfg.n_heads; ++h) node("a" + std::to_string(l) + ".h" + std::to_string(h), false);
    if (cfg.has_mlp()) node("m" + std::to_string(l), mlp_kept.empty());  // without flags every MLP output flows
  }
  node("logits", false);
  for (size_t e = 0; e < edges.size(); ++e) {
    const bool in = !kept.empty() && kept[e];
    const std::string to = mib_receiver(edges[e].second);
    out_edges[mib_sender(edges[e].first) + "->" + to] = {{"score", scores[e]}, {"in_graph", in}};
    if (in) {
      node(mib_sender(edges[e].first), true);
      node(to.substr(0, to.find('<')), true);
    }
  }
  // MIB's MLP senders: m{l} -> every later reader
  const auto mlp_edges = mlp_sender_edge_list(cfg);
  const size_t m = mlp_edges.size();
  if (!mlp_scores.empty() && mlp_scores.size() != m)
    fail("mib export: ", mlp_scores.size(), " MLP-sender scores for the model's ", m, " MLP-sender edges");
  if (!mlp_kept.empty() && mlp_kept.size() != m)
    fail("mib export: ", mlp_kept.size(), " MLP-sender kept flags for the model's ", m, " MLP-sender edges");
  for (size_t e = 0; e < m; ++e) {
    const auto& [l, r] = mlp_edges[e];
    const bool in = mlp_kept.empty() || mlp_kept[e];
    const std::string from = "m" + std::to_string(l), to = mib_receiver(r);
    out_edges[from + "->" + to] = {{"score", mlp_scores.empty() ? 0.0 : mlp_scores[e]}, {"in_graph", in}};
    if (in && !mlp_kept.empty()) {
      node(from, true);
      node(to.substr(0, to.find('<')), true);
    }
  }
  const nlohmann::ordered_json j = {{"cfg", {{"n_layers", cfg.n_layers}, {"n_heads", cfg.n_heads}, {"parallel_attn_mlp", cfg.parallel_block},
                                             {"d_model", cfg.d_model}}},
                                    {"nodes", nodes},
                                    {"edges", out_edges}};
  return j.dump();
}

}  // namespace hl
