#include "analysis/edges.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "lib/fileutil.h"
#include "lib/parallel.h"
#include "lib/stop.h"
#include "models/hf_models.h"

namespace hl {

// ---- nodes -----------------------------------------------------------------------------------

std::string EdgeSender::name() const {
  return layer < 0 ? "embed" : "L" + std::to_string(layer) + "H" + std::to_string(head);
}

std::string EdgeReceiver::name() const {
  switch (kind) {
    case Q: case K: case V:
      return "L" + std::to_string(layer) + "H" + std::to_string(head) + "." + std::string(1, "qkv"[kind]);
    case Mlp: return "mlp" + std::to_string(layer);
    case Logits: return "logits";
  }
  return "";
}

namespace {

// "L{l}H{h}" at the start of text: (l, h) and the characters read, or read = 0.
struct HeadName {
  int layer = -1, head = -1;
  size_t read = 0;
};
HeadName parse_head_name(const std::string& s) {
  HeadName r;
  size_t i = 0;
  auto number = [&](int& out) {
    const size_t start = i;
    int64_t v = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && i - start < 9) v = v * 10 + (s[i++] - '0');
    out = static_cast<int>(v);
    return i > start;
  };
  if (s.empty() || s[0] != 'L') return r;
  ++i;
  if (!number(r.layer) || i >= s.size() || s[i] != 'H') return r;
  ++i;
  if (!number(r.head)) return r;
  r.read = i;
  return r;
}

void check_head(const ModelConfig& cfg, int layer, int head, const std::string& name) {
  if (layer >= cfg.n_layers)
    fail("edges: '", name, "': layer ", layer, " is outside 0..", cfg.n_layers - 1, " (the model has ", cfg.n_layers, " layers)");
  if (head >= cfg.n_heads)
    fail("edges: '", name, "': head ", head, " is outside 0..", cfg.n_heads - 1, " (the model has ", cfg.n_heads, " heads)");
}

}  // namespace

EdgeSender parse_sender(const ModelConfig& cfg, const std::string& name) {
  if (name == "embed") return {};
  const HeadName h = parse_head_name(name);
  if (!h.read || h.read != name.size())
    fail("edges: unknown sender '", name, "' (expected embed or a head L{layer}H{head}, e.g. L0H3)");
  check_head(cfg, h.layer, h.head, name);
  return {h.layer, h.head};
}

EdgeReceiver parse_receiver(const ModelConfig& cfg, const std::string& name) {
  if (name == "logits") return {};
  if (name.starts_with("mlp") && name.size() > 3 && name.size() < 13 &&
      std::all_of(name.begin() + 3, name.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    const int layer = std::stoi(name.substr(3));
    if (!cfg.has_mlp()) fail("edges: '", name, "': the model is attention-only (d_ff 0): it has no MLP receivers");
    check_head(cfg, layer, 0, name);
    return {EdgeReceiver::Mlp, layer, -1};
  }
  const HeadName h = parse_head_name(name);
  const std::string rest = h.read ? name.substr(h.read) : "";
  if (!h.read || (rest != ".q" && rest != ".k" && rest != ".v"))
    fail("edges: unknown receiver '", name, "' (expected L{layer}H{head}.q, .k or .v, mlp{layer} or logits)");
  check_head(cfg, h.layer, h.head, name);
  return {rest == ".q" ? EdgeReceiver::Q : rest == ".k" ? EdgeReceiver::K : EdgeReceiver::V, h.layer, h.head};
}

bool is_edge(const EdgeSender& s, const EdgeReceiver& r) {
  if (s.layer < 0) return true;  // the embedding is written before everything
  switch (r.kind) {
    case EdgeReceiver::Q: case EdgeReceiver::K: case EdgeReceiver::V: return s.layer < r.layer;
    case EdgeReceiver::Mlp: return s.layer <= r.layer;  // the MLP reads hook_resid_mid: its layer's heads included
    case EdgeReceiver::Logits: return true;
  }
  return false;
}

bool is_edge(const ModelConfig& cfg, const EdgeSender& s, const EdgeReceiver& r) {
  // a parallel block's MLP reads hook_resid_pre, beside attention: only earlier layers reach it
  if (cfg.parallel_block && r.kind == EdgeReceiver::Mlp && s.layer >= 0) return s.layer < r.layer;
  return is_edge(s, r);
}

std::vector<EdgeSender> edge_senders(const ModelConfig& cfg) {
  std::vector<EdgeSender> s = {EdgeSender{}};
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_heads; ++h) s.push_back({l, h});
  return s;
}

std::vector<EdgeReceiver> edge_receivers(const ModelConfig& cfg) {
  std::vector<EdgeReceiver> r;
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int h = 0; h < cfg.n_heads; ++h)
      for (EdgeReceiver::Kind k : {EdgeReceiver::Q, EdgeReceiver::K, EdgeReceiver::V}) r.push_back({k, l, h});
    if (cfg.has_mlp()) r.push_back({EdgeReceiver::Mlp, l, -1});
  }
  r.push_back(EdgeReceiver{});
  return r;
}

std::vector<std::pair<EdgeSender, EdgeReceiver>> model_edges(const ModelConfig& cfg) {
  std::vector<std::pair<EdgeSender, EdgeReceiver>> e;
  const std::vector<EdgeSender> senders = edge_senders(cfg);
  for (const EdgeReceiver& r : edge_receivers(cfg))
    for (const EdgeSender& s : senders)
      if (is_edge(cfg, s, r)) e.push_back({s, r});
  return e;
}

std::vector<EdgeReceiver> readers_of(const ModelConfig& cfg, const EdgeSender& sender) {
  std::vector<EdgeReceiver> r;
  for (const EdgeReceiver& x : edge_receivers(cfg))
    if (is_edge(cfg, sender, x)) r.push_back(x);
  return r;
}

// ---- inputs and the metric -------------------------------------------------------------------

double edge_metric(const Tensor& logits, const std::vector<PatchAnswer>& answers) {
  const int64_t T = logits.size(1), V = logits.size(2);
  double s = 0;
  for (const PatchAnswer& a : answers) {
    const float* row = logits.data() + (a.row * T + a.pos) * V;
    s += static_cast<double>(row[a.clean]) - static_cast<double>(row[a.corrupted]);
  }
  return s / static_cast<double>(answers.size());
}

void check_edge_model(const ModelConfig& cfg) {
  if (cfg.norm != Norm::Pre)
    fail("edges: the model is post-norm (norm = post): its residual stream is normalised after every block, so it is not the "
         "sum of the senders' outputs an edge patches; edges are defined for pre-norm models, whose receivers read the "
         "residual stream through their own layer norm");
}

EdgeModel edge_model(TransformerLM& model) {
  check_edge_model(model.cfg);
  EdgeModel m;
  if (model.cfg.kv_heads() != model.cfg.n_heads) {
    ModelConfig ungrouped = model.cfg;
    ungrouped.n_kv_heads = 0;
    check_fits_in_memory(4.0 * static_cast<double>(parameter_count(ungrouped)), "edges: the model's ungrouped copy");
    m.ungrouped = ungroup_grouped_query_attention(model);
  }
  m.model = m.ungrouped ? m.ungrouped.get() : &model;
  return m;
}

void check_edge_inputs(const ModelConfig& cfg, const PatchingInputs& in) {
  check_edge_model(cfg);
  if (cfg.kv_heads() != cfg.n_heads)
    fail("edges: the model shares keys and values between heads (n_kv_heads ", cfg.kv_heads(), " of n_heads ", cfg.n_heads,
         "); the edge analyses run on its ungrouped equivalent (edge_model), where a head's .k and .v receivers are its own");
  if (in.clean.shape.ndim != 2 || in.clean.shape != in.corrupted.shape)
    fail("edges: the clean ids ", in.clean.shape.str(), " and the corrupted ids ", in.corrupted.shape.str(),
         " must be (B, T) of one shape");
  if (in.clean.shape[1] > cfg.max_seq_len)
    fail("edges: sequences of ", in.clean.shape[1], " tokens exceed the model's max_seq_len ", cfg.max_seq_len);
  for (const Ids* ids : {&in.clean, &in.corrupted})
    for (int32_t t : ids->data)
      if (t < 0 || t >= cfg.vocab_size)
        fail("edges: token id ", t, " in the ", ids == &in.clean ? "clean" : "corrupted", " ids is outside the vocabulary 0..",
             cfg.vocab_size - 1);
  if (in.answers.empty()) fail("edges: no answers (rows of (row, pos, clean token, corrupted token)) to measure the metric at");
  for (const PatchAnswer& a : in.answers)
    if (a.row < 0 || a.row >= in.clean.shape[0] || a.pos < 0 || a.pos >= in.clean.shape[1] || a.clean < 0 ||
        a.clean >= cfg.vocab_size || a.corrupted < 0 || a.corrupted >= cfg.vocab_size)
      fail("edges: answer (", a.row, ", ", a.pos, ", ", a.clean, ", ", a.corrupted, ") is outside the ids ", in.clean.shape.str(),
           " or the vocabulary 0..", cfg.vocab_size - 1);
  check_patching_padding(in, "edges");
}

// A batch of patched edge runs (FastEdges): at most this many packed rows, and this many bytes of
// their answers' logits. Products of a few thousand rows already run at the sgemm peak; more rows
// only take memory (at 2^16 rows Qwen2.5-0.5B's MLP alone held 1.2 GiB).
inline constexpr int64_t kEdgeBatchRows = 8192;
inline constexpr double kEdgeBatchLogitBytes = 256.0 * 1024 * 1024;

double edge_patching_memory_bytes(const ModelConfig& model_cfg, int64_t rows, int64_t T) {
  // a grouped-query model is held beside its ungrouped copy (edge_model), which the analyses run
  ModelConfig cfg = model_cfg;
  cfg.n_kv_heads = 0;
  const double copy = model_cfg.kv_heads() != model_cfg.n_heads ? 4.0 * static_cast<double>(parameter_count(cfg)) : 0.0;
  const double D = static_cast<double>(cfg.d_model), tokens = static_cast<double>(rows) * static_cast<double>(T),
               L = cfg.n_layers, H = cfg.n_heads;
  // beyond the loaded model: the backward's activations and their gradients (the parameters ask for
  // none: FrozenParameters), the heads' results of both cached runs, one delta per sender, the
  // receivers' gradients, and a batch of patched runs (kEdgeBatchRows rows, each with the block's
  // activations, and its answers' logits)
  const double backward = estimate_step_bytes(cfg, rows, T, true) - estimate_step_bytes(cfg, 0, T, true);
  const double caches = 2 * L * H * tokens * D, deltas = (1 + L * H) * tokens * D, grads = (3 * H + 2) * L * tokens * D;
  const double batch = std::max(tokens, static_cast<double>(kEdgeBatchRows)) * (12 * D + 3 * static_cast<double>(cfg.d_ff));
  return copy + backward + 4.0 * (caches + deltas + grads + batch) + kEdgeBatchLogitBytes;
}

namespace {
// Operations of one position through one block: its products (2 per weight) and attention over
// `keys` keys (q.k and the weighted sum of v, per head).
double block_flops(const ModelConfig& cfg, double keys) {
  double weights = 0;
  for (const auto& [name, shape] : parameter_shapes(cfg))
    if (name.starts_with("blocks.0.") && shape.ndim == 2) weights += static_cast<double>(shape.numel());
  return 2.0 * weights + 4.0 * keys * static_cast<double>(cfg.n_heads * cfg.head_dim());
}
}  // namespace

double forward_flops(const ModelConfig& cfg, int64_t rows, int64_t T) {
  const double tokens = static_cast<double>(rows) * static_cast<double>(T);
  return tokens * (cfg.n_layers * block_flops(cfg, 0.5 * static_cast<double>(T)) + 2.0 * static_cast<double>(cfg.d_model * cfg.vocab_size));
}

EdgeWork edge_patching_work(const ModelConfig& cfg, const PatchingInputs& in, bool with_mlp_senders) {
  // the packed positions of a patched run (FastEdges' Packing): each row up to its last answer
  std::map<int64_t, int64_t> last;  // row -> its last answer's position
  std::set<std::pair<int64_t, int64_t>> outs;
  for (const PatchAnswer& a : in.answers) last[a.row] = std::max(last[a.row], a.pos), outs.insert({a.row, a.pos});
  double n = 0, keys = 0;
  for (const auto& [row, pos] : last) n += static_cast<double>(pos + 1), keys += 0.5 * static_cast<double>(pos + 1) * static_cast<double>(pos + 2);
  const double per_block = block_flops(cfg, n > 0 ? keys / n : 0.0);
  const double unembed = 2.0 * static_cast<double>(outs.size()) * static_cast<double>(cfg.d_model * cfg.vocab_size);
  EdgeWork w;
  auto add = [&](const EdgeReceiver& r, double senders) {
    const double blocks = r.kind == EdgeReceiver::Logits ? 0.0 : static_cast<double>(cfg.n_layers - r.layer);
    w.edges += senders;
    w.token_blocks += senders * n * blocks;
    w.flops += senders * (n * blocks * per_block + unembed);
  };
  const std::vector<EdgeSender> senders = edge_senders(cfg);
  for (const EdgeReceiver& r : edge_receivers(cfg)) {
    double s = 0;
    for (const EdgeSender& x : senders) s += is_edge(cfg, x, r);
    add(r, s);
    // the MLPs as senders (mlp_sender_edges): those of the layers before r's, every one for the logits
    if (with_mlp_senders && cfg.has_mlp()) add(r, r.kind == EdgeReceiver::Logits ? cfg.n_layers : r.layer);
  }
  return w;
}

Tensor embed_output(const ActivationCache& cache) {
  // rotary and NoPE models add no position embedding; the positions' (1, T, D) broadcast
  return cache.has("hook_pos_embed") ? add(cache["hook_embed"], cache["hook_pos_embed"]) : cache["hook_embed"];
}

bool is_sender_point(const std::string& n) { return n == "hook_embed" || n == "hook_pos_embed" || n.ends_with("attn.hook_z"); }

Tensor edge_sender_delta_stack(const TransformerLM& model, const ActivationCache& clean, const ActivationCache& corrupt) {
  const ModelConfig& c = model.cfg;
  const Tensor& e = clean["hook_embed"];  // (B, T, D)
  const int64_t n = e.numel(), D = e.size(2), N = n / D, H = c.n_heads, dh = c.head_dim();
  Tensor out = Tensor::empty({1 + static_cast<int64_t>(c.n_layers) * H, e.size(0), e.size(1), D});
  float* o = out.data();
  const Tensor d = sub(embed_output(corrupt), embed_output(clean));
  std::copy(d.data(), d.data() + n, o);
  // head h's result (hook_result, W_O's bias excluded) is z_h W_O[:, h]^T: its delta from the
  // heads' outputs z (B, T, H, dh), which the runs give without computing every head's result
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string z = hook_name(l, "attn.hook_z");
    const Tensor dz = sub(corrupt[z], clean[z]);
    const float *dzp = dz.data(), *w = model.blocks[l]->attn.W_O.weight.data();  // (D, H dh)
    float* ol = o + (1 + l * H) * n;
    parallel_ranges(N, N * D * H, [&](int64_t lo, int64_t hi) {
      for (int64_t h = 0; h < H; ++h)
        gemm(false, true, hi - lo, D, dh, 1.f, dzp + lo * H * dh + h * dh, H * dh, w + h * dh, H * dh, 0.f, ol + h * n + lo * D, D);
    });
  }
  return out;
}

std::vector<Tensor> unstack(const Tensor& stack) {
  std::vector<Tensor> out;
  const int64_t n = stack.numel() / stack.size(0);
  for (int64_t i = 0; i < stack.size(0); ++i) out.push_back(storage_view(stack, i * n, {stack.size(1), stack.size(2), stack.size(3)}));
  return out;
}

namespace {
// head h of a per-head activation (B, T, H, D) -> (B, T, D)
Tensor head_slice(const Tensor& x, int h) {
  return reshape(slice(x, 2, h, h + 1), {x.size(0), x.size(1), x.size(3)});
}

// The clean run's residual streams and both runs' sender outputs.
struct Runs {
  // per layer (B, T, D): the block's input; resid_pre + hook_attn_out (hook_resid_mid of a
  // sequential block, resid_post attention-only); what ln2 reads (resid_mid, or resid_pre in a
  // parallel block)
  std::vector<Tensor> resid_pre, resid_mid, mlp_in;
  std::vector<Tensor> attn_raw;              // sandwich norms only: attention's output before ln1_post (B, T, D)
  Tensor resid_final;                        // (B, T, D): ln_final's input
  Tensor delta_stack;                        // (senders, B, T, D): edge_sender_delta_stack
  std::vector<Tensor> deltas;                // per sender (edge_senders order), (B, T, D): views of delta_stack
  double clean_metric = 0, corrupted_metric = 0;
};

Runs record_runs(TransformerLM& model, const PatchingInputs& in) {
  const ModelConfig& c = model.cfg;
  EvalScope mode(model);
  NoGradGuard ng;
  Runs r;
  r.clean_metric = edge_metric(model.forward(in.clean), in.answers);
  throw_if_stopped();  // between passes over every row
  r.corrupted_metric = edge_metric(model.forward(in.corrupted), in.answers);
  throw_if_stopped();
  // sandwich norms: the heads' results, for what ln1_post reads
  auto senders_filter = [&](const std::string& n) { return is_sender_point(n) || (c.sandwich_norm && n.ends_with("attn.hook_result")); };
  const std::string last = hook_name(c.n_layers - 1, "hook_resid_post");
  // a parallel block has no hook_resid_mid: resid_pre + hook_attn_out, as the block adds them
  const std::string mid_name = !c.has_mlp() ? "hook_resid_post" : c.parallel_block ? "hook_attn_out" : "hook_resid_mid";
  const ActivationCache clean = model.run_with_cache(in.clean, [&](const std::string& n) {
    return senders_filter(n) || n.ends_with("hook_resid_pre") || n.ends_with(mid_name) || n == last;
  }).second;
  throw_if_stopped();
  const ActivationCache corrupt = model.run_with_cache(in.corrupted, senders_filter).second;
  for (int l = 0; l < c.n_layers; ++l) {
    const Tensor& pre = clean[hook_name(l, "hook_resid_pre")];
    r.resid_pre.push_back(pre);
    r.resid_mid.push_back(c.parallel_block && c.has_mlp() ? add(pre, clean[hook_name(l, mid_name.c_str())])
                                                          : clean[hook_name(l, mid_name.c_str())]);
    r.mlp_in.push_back(c.parallel_block ? pre : r.resid_mid.back());
    if (c.sandwich_norm) {  // the heads' results summed, plus W_O's bias: what ln1_post reads
      const Tensor& res = clean[hook_name(l, "attn.hook_result")];  // (B, T, H, D)
      const Tensor& b = model.blocks[l]->attn.W_O.bias;
      const Tensor raw = sum(res, {2});
      r.attn_raw.push_back(b.defined() ? add(raw, b) : raw);
    }
  }
  r.resid_final = clean[last];
  r.delta_stack = edge_sender_delta_stack(model, clean, corrupt);
  r.deltas = unstack(r.delta_stack);
  return r;
}

size_t sender_index(const ModelConfig& c, const EdgeSender& s) {
  return s.layer < 0 ? 0 : 1 + static_cast<size_t>(s.layer) * c.n_heads + s.head;
}

// The hooks that make each receiver read (its input in this run) + delta. The inputs are read
// where the run makes them (hook_resid_pre, hook_resid_mid, the last hook_resid_post); the
// logits' input starts as `resid_final` for a run that begins after the last block.
Hooks receiver_hooks(TransformerLM& model, const std::vector<std::pair<EdgeReceiver, Tensor>>& patches, const Tensor& resid_final) {
  const ModelConfig& c = model.cfg;
  Hooks hooks;
  std::map<int, std::vector<std::pair<EdgeReceiver, Tensor>>> by_layer;
  for (const auto& p : patches) by_layer[p.first.kind == EdgeReceiver::Logits ? c.n_layers : p.first.layer].push_back(p);
  for (auto& [l, ps] : by_layer) {
    if (l == c.n_layers) {  // logits: unembed(ln_final(resid_final + delta))
      auto x = std::make_shared<Tensor>(resid_final);
      hooks.add_forward(hook_name(c.n_layers - 1, "hook_resid_post"), [x](const Tensor& t, const std::string&) {
        *x = t;
        return Tensor();
      });
      const Tensor delta = ps[0].second;
      LayerNorm* ln = model.ln_f.get();
      hooks.add_forward("ln_final.hook_normalized", [x, delta, ln](const Tensor&, const std::string&) {
        return ln->forward(add(*x, delta));
      });
      continue;
    }
    TransformerBlock& block = *model.blocks[l];
    auto pre = std::make_shared<Tensor>(), mid = std::make_shared<Tensor>();
    hooks.add_forward(hook_name(l, "hook_resid_pre"), [pre](const Tensor& t, const std::string&) {
      *pre = t;
      return Tensor();
    });
    for (EdgeReceiver::Kind kind : {EdgeReceiver::Q, EdgeReceiver::K, EdgeReceiver::V}) {
      std::vector<std::pair<int, Tensor>> heads;
      for (const auto& [r, d] : ps)
        if (r.kind == kind) heads.push_back({r.head, d});
      if (heads.empty()) continue;
      const char* point = kind == EdgeReceiver::Q ? "attn.hook_q_input" : kind == EdgeReceiver::K ? "attn.hook_k_input" : "attn.hook_v_input";
      LayerNorm* ln = &block.ln1;
      // head h's copy of ln1's output (B, T, H, D) replaced by ln1(input + delta)
      hooks.add_forward(hook_name(l, point), [pre, heads, ln](const Tensor& copies, const std::string&) {
        Tensor y = copies.clone();
        const int64_t rows = copies.size(0) * copies.size(1), H = copies.size(2), D = copies.size(3);
        for (const auto& [h, d] : heads) {
          const Tensor v = ln->forward(add(*pre, d));  // (B, T, D)
          for (int64_t r = 0; r < rows; ++r) std::copy(v.data() + r * D, v.data() + (r + 1) * D, y.data() + (r * H + h) * D);
        }
        return y;
      });
    }
    for (const auto& [r, d] : ps)
      if (r.kind == EdgeReceiver::Mlp) {
        // what ln2 reads: hook_resid_mid, or in a parallel block the block's input (as `pre`)
        if (c.parallel_block) mid = pre;
        else
          hooks.add_forward(hook_name(l, "hook_resid_mid"), [mid](const Tensor& t, const std::string&) {
            *mid = t;
            return Tensor();
          });
        LayerNorm* ln = block.ln2.get();
        const Tensor delta = d;
        hooks.add_forward(hook_name(l, "ln2.hook_normalized"), [mid, delta, ln](const Tensor&, const std::string&) {
          return ln->forward(add(*mid, delta));
        });
      }
  }
  return hooks;
}

// The metric of the clean run with the patches, through hooks, from the first receiver's block.
double hooked_patched_metric(TransformerLM& model, const PatchingInputs& in, const Runs& runs,
                             const std::vector<std::pair<EdgeReceiver, Tensor>>& patches) {
  const ModelConfig& c = model.cfg;
  int start = c.n_layers;
  for (const auto& p : patches) {
    if (p.first.kind == EdgeReceiver::Mlp && !c.has_mlp()) fail("edges: the model is attention-only: no MLP receivers");
    if (p.first.kind != EdgeReceiver::Logits) start = std::min(start, p.first.layer);
  }
  const Hooks hooks = receiver_hooks(model, patches, runs.resid_final);
  EvalScope mode(model);
  NoGradGuard ng;
  ForwardOptions opt;
  opt.hooks = &hooks;
  return edge_metric(model.forward_from(start, start < c.n_layers ? runs.resid_pre[start] : runs.resid_final, opt), in.answers);
}

// A norm's input (N, D) as its backward reads it: y = (x - mean) / s * w + b, or the RMS form
// without the centring (mean 0, s = sqrt(mean(x^2) + eps)); w its gain. x_hat and 1 / s once per
// run, for every gradient that goes back through it (the statistics in double).
struct NormRows {
  std::vector<float> x_hat;  // (N, D): (x - mean) / s
  std::vector<float> inv_s;  // (N)
  std::vector<float> gain;   // (D)
  int64_t D = 0;
  bool centred = true;
};

NormRows norm_rows(const Tensor& x, const LayerNorm& ln) {
  const int64_t D = x.shape().back(), N = x.numel() / D;
  NormRows nr{std::vector<float>(static_cast<size_t>(N * D)), std::vector<float>(static_cast<size_t>(N)),
              std::vector<float>(static_cast<size_t>(D)), D, ln.centred()};
  for (int64_t j = 0; j < D; ++j) nr.gain[j] = static_cast<float>(ln.gain(j));
  const float* xd = x.data();
  parallel_for(N, N * D, [&](int64_t r) {
    const float* xr = xd + r * D;
    double mu = 0, var = 0;
    if (nr.centred) {
#pragma omp simd reduction(+ : mu)
      for (int64_t j = 0; j < D; ++j) mu += xr[j];
      mu /= static_cast<double>(D);
    }
#pragma omp simd reduction(+ : var)
    for (int64_t j = 0; j < D; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    const double inv_s = 1.0 / std::sqrt(var / static_cast<double>(D) + ln.eps);
    float* xh = nr.x_hat.data() + r * D;
    for (int64_t j = 0; j < D; ++j) xh[j] = static_cast<float>((xr[j] - mu) * inv_s);
    nr.inv_s[r] = static_cast<float>(inv_s);
  });
  return nr;
}

// dL/dx for rows [r0, r0 + n) of the norm's input from g = dL/dy at its output (src, (n, D)):
// per row (g w - mean(g w) - x_hat mean(g w x_hat)) / s, written to (or, with `add`, added to)
// dst's rows (dst points at row 0 of an (N, D) array). The norm's own backward, written out
// because the gradient arrives at a hook after it.
void norm_back_rows(const NormRows& nr, int64_t r0, int64_t n, const float* src, float* dst, bool add) {
  const int64_t D = nr.D;
  const float inv_d = 1.f / static_cast<float>(D), *w = nr.gain.data();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    const float *xh = nr.x_hat.data() + r * D, *gr = src + i * D, inv_s = nr.inv_s[r];
    float mg = 0, mgx = 0;
#pragma omp simd reduction(+ : mg, mgx)
    for (int64_t j = 0; j < D; ++j) {
      const float gw = gr[j] * w[j];
      mg += gw;
      mgx += gw * xh[j];
    }
    mg = nr.centred ? mg * inv_d : 0.f;
    mgx *= inv_d;
    float* out = dst + r * D;
    if (add)
      for (int64_t j = 0; j < D; ++j) out[j] += (gr[j] * w[j] - mg - xh[j] * mgx) * inv_s;
    else
      for (int64_t j = 0; j < D; ++j) out[j] = (gr[j] * w[j] - mg - xh[j] * mgx) * inv_s;
  }
}

// While one lives, no parameter of the module asks for a gradient: the analyses' backward wants
// the activations' gradients only, and the weights' would double its products.
class FrozenParameters {
 public:
  explicit FrozenParameters(const Module& m) {
    for (Tensor p : m.parameters())
      if (p.requires_grad()) {
        p.requires_grad_(false);
        frozen_.push_back(p);
      }
  }
  ~FrozenParameters() {
    for (Tensor& p : frozen_) p.requires_grad_(true);
  }
  FrozenParameters(const FrozenParameters&) = delete;
  FrozenParameters& operator=(const FrozenParameters&) = delete;

 private:
  std::vector<Tensor> frozen_;
};

}  // namespace

// dm/d(each receiver's input), (R, B, T, D) in edge_receivers order, from one forward and backward
// of the clean run in which only the activations ask for gradients (the token embedding is the
// leaf). q/k/v of head h: the gradient at hook_q/k/v (B, T, H, dh) times that head's rows of
// W_Q/W_K/W_V (what the head's own copy of ln1's output would get: one (rows, dh) x (dh, D)
// product per head, no copies of the input), taken back through ln1; mlp: at ln2's output taken
// back through ln2 (to what it reads: resid_mid, or resid_pre in a parallel block); logits: at
// ln_final's input. The norms' inputs are read from the same run, so an intervened run's gradients
// are its own. Each hook's gradients go through the norm's backward in blocks of rows that stay in
// cache and are written (or added) once: the stack is the largest array of the run.
void add_receiver_gradients(TransformerLM& model, const PatchingInputs& in, Tensor& sum, const std::function<void(Hooks&)>& intervene) {
  if (!grad_enabled()) fail("edges: edge attribution needs one backward; run it outside no_grad");
  const ModelConfig& c = model.cfg;
  const int L = c.n_layers, H = c.n_heads;
  const int64_t B = in.clean.shape[0], T = in.clean.shape[1], D = c.d_model, N = B * T, dh = c.head_dim();
  const std::vector<EdgeReceiver> receivers = edge_receivers(c);
  const int64_t R = static_cast<int64_t>(receivers.size());
  auto row_of = [&](const EdgeReceiver& r) { return static_cast<int64_t>(std::find(receivers.begin(), receivers.end(), r) - receivers.begin()); };
  const bool add = sum.defined();
  if (!add) sum = Tensor::empty({R, B, T, D});  // every row written (or the run fails below)
  else if (sum.shape() != Shape{R, B, T, D})
    fail("edges: receiver gradients (", R, ", ", B, ", ", T, ", ", D, ") added to a sum of ", sum.shape().str());
  std::vector<bool> reached(static_cast<size_t>(R), false);
  Hooks hooks;
  if (intervene) intervene(hooks);
  // after the intervention's hooks: the embedding (replaced or not) is the leaf gradients start from
  hooks.add_forward("hook_embed", [](const Tensor& x, const std::string&) {
    if (x.requires_grad()) return Tensor();
    Tensor leaf = x.detach();
    leaf.requires_grad_();
    return leaf;
  });
  std::vector<NormRows> ln1_in(L), ln2_in(L);  // this run's norm inputs and their statistics
  for (int l = 0; l < L; ++l) {
    const TransformerBlock* block = model.blocks[l].get();
    // ln2 reads hook_resid_mid in a sequential block, the block's input in a parallel one
    hooks.add_forward(hook_name(l, "hook_resid_pre"), [&, l, block](const Tensor& t, const std::string&) {
      ln1_in[l] = norm_rows(t.detach(), block->ln1);
      if (c.has_mlp() && c.parallel_block) ln2_in[l] = norm_rows(t.detach(), *block->ln2);
      return Tensor();
    });
    if (c.has_mlp() && !c.parallel_block)
      hooks.add_forward(hook_name(l, "hook_resid_mid"), [&, l, block](const Tensor& t, const std::string&) {
        ln2_in[l] = norm_rows(t.detach(), *block->ln2);
        return Tensor();
      });
  }
  float* o = sum.data();
  constexpr int64_t kRows = 64;  // a block: (kRows, D) floats per head, in cache between its product and the norm
  // grad (B, T, H, dh) at hook_q/k/v of layer l -> per head h, grad_h W[h] (rows, D), through ln1, into its row
  auto per_head = [&, o](int l, EdgeReceiver::Kind kind, const Tensor& W) {
    return [&, o, l, kind, W](const Tensor& g, const std::string&) {
      std::vector<int64_t> rows(static_cast<size_t>(H));
      for (int h = 0; h < H; ++h) rows[h] = row_of({kind, l, h}), reached[rows[h]] = true;
      const float *gd = g.data(), *w = W.data();
      const NormRows& nr = ln1_in[l];
      parallel_ranges(N, N * D * H, [&](int64_t lo, int64_t hi) {
        std::vector<float> block(static_cast<size_t>(kRows * D));
        for (int64_t r0 = lo; r0 < hi; r0 += kRows) {
          const int64_t n = std::min(kRows, hi - r0);
          for (int h = 0; h < H; ++h) {
            gemm(false, false, n, D, dh, 1.f, gd + r0 * H * dh + h * dh, H * dh, w + h * dh * D, D, 0.f, block.data(), D);
            norm_back_rows(nr, r0, n, block.data(), o + rows[h] * N * D, add);
          }
        }
      });
    };
  };
  for (int l = 0; l < L; ++l) {
    const MultiHeadAttention& attn = model.blocks[l]->attn;
    hooks.add_backward(hook_name(l, "attn.hook_q"), per_head(l, EdgeReceiver::Q, attn.W_Q.weight));
    hooks.add_backward(hook_name(l, "attn.hook_k"), per_head(l, EdgeReceiver::K, attn.W_K.weight));
    hooks.add_backward(hook_name(l, "attn.hook_v"), per_head(l, EdgeReceiver::V, attn.W_V.weight));
    if (c.has_mlp()) {
      const int64_t row = row_of({EdgeReceiver::Mlp, l, -1});
      hooks.add_backward(hook_name(l, "ln2.hook_normalized"), [&, o, l, row](const Tensor& g, const std::string&) {
        const float* gd = g.data();
        parallel_ranges(N, N * D, [&](int64_t lo, int64_t hi) { norm_back_rows(ln2_in[l], lo, hi - lo, gd + lo * D, o + row * N * D, add); });
        reached[row] = true;
      });
    }
  }
  hooks.add_backward(hook_name(L - 1, "hook_resid_post"), [&, o](const Tensor& g, const std::string&) {
    const float* gd = g.data();
    float* out = o + (R - 1) * N * D;
    parallel_ranges(N * D, N * D, [gd, out, add](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = add ? out[i] + gd[i] : gd[i];
    });
    reached[R - 1] = true;
  });
  {
    EvalScope mode(model);
    FrozenParameters frozen(model);
    ForwardOptions opt;
    opt.hooks = &hooks;
    logit_difference(model.forward(in.clean, opt), in.answers).backward();
  }
  for (int64_t r = 0; r < R; ++r)
    if (!reached[r]) fail("edges: no gradient reached ", r == R - 1 ? std::string("the logits' input") : receivers[r].name());
}

Tensor receiver_gradient_stack(TransformerLM& model, const PatchingInputs& in, const std::function<void(Hooks&)>& intervene) {
  Tensor out;
  add_receiver_gradients(model, in, out, intervene);
  return out;
}

std::vector<Tensor> receiver_gradients(TransformerLM& model, const PatchingInputs& in,
                                       const std::function<void(Hooks&)>& intervene) {
  return unstack(receiver_gradient_stack(model, in, intervene));
}

namespace {

// out[i * ldo + j] += sum over k < K of a[i * lda + k] b[j * ldb + k] for i < m, j < n: float
// products over chunks of the sum (the threads share the chunks), the chunks added in double in
// their order (the sgemm's float sums stay short; the result does not depend on the thread count).
void row_products(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n, int64_t K, double* out, int64_t ldo) {
  constexpr int64_t kChunk = 1 << 14;
  if (m == 0 || n == 0) return;
  const int64_t chunks = (K + kChunk - 1) / kChunk;
  std::vector<float> part(static_cast<size_t>(chunks * m * n));  // (chunks, m, n)
  parallel_for(chunks, m * n * K, [&](int64_t c) {
    const int64_t k0 = c * kChunk, k = std::min(kChunk, K - k0);
    gemm(false, true, m, n, k, 1.f, a + k0, lda, b + k0, ldb, 0.f, part.data() + c * m * n, n);
  });
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) out[i * ldo + j] += part[(c * m + i) * n + j];
}

// edge_products over `parts` equal consecutive parts of each sender's and receiver's (B, T, D)
// (parts = B: the rows): out[p * edges + e], model_edges order.
std::vector<double> edge_products_in_parts(const ModelConfig& cfg, const Tensor& senders, const Tensor& grads, int64_t parts) {
  const std::vector<EdgeSender> ss = edge_senders(cfg);
  const std::vector<EdgeReceiver> rs = edge_receivers(cfg);
  const int64_t S = static_cast<int64_t>(ss.size()), R = static_cast<int64_t>(rs.size());
  if (senders.size(0) != S || grads.size(0) != R || senders.numel() / S != grads.numel() / R)
    fail("edges: products of ", senders.shape().str(), " senders and ", grads.shape().str(), " gradients for the model's ", S,
         " senders and ", R, " receivers");
  const int64_t K = senders.numel() / S, part = K / parts;
  std::vector<double> full(static_cast<size_t>(parts * S * R), 0.0);  // (parts, S, R)
  // per receiver layer (its receivers contiguous), the senders up to the last one that reaches it
  for (int64_t r0 = 0; r0 < R;) {
    int64_t r1 = r0;
    while (r1 < R && rs[r1].layer == rs[r0].layer && (rs[r1].kind == EdgeReceiver::Logits) == (rs[r0].kind == EdgeReceiver::Logits)) ++r1;
    int64_t n_s = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t r = r0; r < r1; ++r)
        if (is_edge(cfg, ss[s], rs[r])) n_s = s + 1;
    for (int64_t p = 0; p < parts; ++p)
      row_products(senders.data() + p * part, K, n_s, grads.data() + r0 * K + p * part, K, r1 - r0, part, full.data() + p * S * R + r0, R);
    r0 = r1;
  }
  const auto edges = model_edges(cfg);
  std::vector<double> out;
  out.reserve(static_cast<size_t>(parts) * edges.size());
  for (int64_t p = 0; p < parts; ++p)
    for (const auto& [s, r] : edges)
      out.push_back(full[p * S * R + static_cast<int64_t>(std::find(ss.begin(), ss.end(), s) - ss.begin()) * R +
                         (std::find(rs.begin(), rs.end(), r) - rs.begin())]);
  return out;
}

}  // namespace

std::vector<double> edge_products(const ModelConfig& cfg, const Tensor& senders, const Tensor& grads) {
  return edge_products_in_parts(cfg, senders, grads, 1);
}

std::vector<double> edge_products_by_row(const ModelConfig& cfg, const Tensor& senders, const Tensor& grads) {
  return edge_products_in_parts(cfg, senders, grads, senders.size(1));
}

std::vector<std::pair<int, EdgeReceiver>> mlp_sender_edge_list(const ModelConfig& cfg) {
  std::vector<std::pair<int, EdgeReceiver>> out;
  if (!cfg.has_mlp()) return out;
  for (const EdgeReceiver& r : edge_receivers(cfg))
    for (int l = 0; l < cfg.n_layers; ++l)
      if (r.kind == EdgeReceiver::Logits || l < r.layer) out.push_back({l, r});
  return out;
}

namespace {
// mlp_edge_products over `parts` equal consecutive parts of each (B, T, D): out[p * edges + e]
std::vector<double> mlp_edge_products_in_parts(const ModelConfig& cfg, const Tensor& mlp_deltas, const Tensor& grads, int64_t parts) {
  const std::vector<EdgeReceiver> rs = edge_receivers(cfg);
  const int64_t L = cfg.n_layers, R = static_cast<int64_t>(rs.size());
  if (mlp_deltas.size(0) != L || grads.size(0) != R || mlp_deltas.numel() / L != grads.numel() / R)
    fail("edges: products of ", mlp_deltas.shape().str(), " MLP outputs and ", grads.shape().str(), " gradients for the model's ", L,
         " MLPs and ", R, " receivers");
  const int64_t K = grads.numel() / R, part = K / parts;
  std::vector<double> full(static_cast<size_t>(parts * L * R), 0.0);  // (parts, L, R)
  for (int64_t p = 0; p < parts; ++p)
    row_products(mlp_deltas.data() + p * part, K, L, grads.data() + p * part, K, R, part, full.data() + p * L * R, R);
  const auto edges = mlp_sender_edge_list(cfg);
  std::vector<double> out;
  for (int64_t p = 0; p < parts; ++p)
    for (const auto& [l, r] : edges) out.push_back(full[p * L * R + l * R + (std::find(rs.begin(), rs.end(), r) - rs.begin())]);
  return out;
}
}  // namespace

std::vector<double> mlp_edge_products(const ModelConfig& cfg, const Tensor& mlp_deltas, const Tensor& grads) {
  return mlp_edge_products_in_parts(cfg, mlp_deltas, grads, 1);
}

std::vector<double> mlp_edge_products_by_row(const ModelConfig& cfg, const Tensor& mlp_deltas, const Tensor& grads) {
  return mlp_edge_products_in_parts(cfg, mlp_deltas, grads, mlp_deltas.size(1));
}

Tensor edge_sender_delta_stack(TransformerLM& model, const PatchingInputs& in) {
  check_edge_inputs(model.cfg, in);
  EvalScope mode(model);
  NoGradGuard ng;
  const ActivationCache clean = model.run_with_cache(in.clean, is_sender_point).second;
  const ActivationCache corrupt = model.run_with_cache(in.corrupted, is_sender_point).second;
  return edge_sender_delta_stack(model, clean, corrupt);
}

std::vector<Tensor> edge_sender_deltas(TransformerLM& model, const PatchingInputs& in) { return unstack(edge_sender_delta_stack(model, in)); }

namespace {

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  const float *x = a.data(), *y = b.data();
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

// ---- the fast path of exact edge patching -----------------------------------------------------

// The positions a patched run computes: in row b the first live_len[b] (up to its last answer),
// packed back to back (n rows); and among them the answers' (out rows). Batches of S patched runs
// stack S copies of the n packed rows.
struct Packing {
  std::vector<int32_t> live_len;
  Ids rows;                         // (n): packed row -> b * T + t
  std::vector<int32_t> out_rows;    // packed rows of the answers' positions (each once)
  std::vector<int64_t> answer_out;  // per answer, its index in out_rows
  int64_t n = 0, T = 0;

  Packing(const PatchingInputs& in) {
    const int64_t B = in.clean.shape[0];
    T = in.clean.shape[1];
    live_len.assign(static_cast<size_t>(B), 0);
    for (const PatchAnswer& a : in.answers) live_len[a.row] = std::max<int32_t>(live_len[a.row], static_cast<int32_t>(a.pos + 1));
    std::vector<int64_t> start(static_cast<size_t>(B));
    std::vector<int32_t> flat;
    for (int64_t b = 0; b < B; ++b) {
      start[b] = static_cast<int64_t>(flat.size());
      for (int32_t t = 0; t < live_len[b]; ++t) flat.push_back(static_cast<int32_t>(b * T + t));
    }
    n = static_cast<int64_t>(flat.size());
    rows = Ids(Shape{n}, flat);
    std::map<int64_t, int64_t> out_of;  // packed row -> index in out_rows
    for (const PatchAnswer& a : in.answers) out_of.emplace(start[a.row] + a.pos, 0);
    for (auto& [p, i] : out_of) i = static_cast<int64_t>(out_rows.size()), out_rows.push_back(static_cast<int32_t>(p));
    for (const PatchAnswer& a : in.answers) answer_out.push_back(out_of[start[a.row] + a.pos]);
  }
  Tensor pack(const Tensor& x) const { return gather_rows(x, rows); }  // (B, T, D) -> (n, D)
  int64_t n_out() const { return static_cast<int64_t>(out_rows.size()); }
};

// S stacked copies of the packing: live lengths, out rows and positions (what rotary turns by) of the batch.
struct Stack {
  std::vector<int32_t> live_len, positions;
  Ids out_rows;
  Stack(const Packing& p, int64_t S) : out_rows(Shape{S * p.n_out()}) {
    for (int64_t j = 0; j < S; ++j) {
      live_len.insert(live_len.end(), p.live_len.begin(), p.live_len.end());
      for (int64_t i = 0; i < p.n_out(); ++i) out_rows.data[j * p.n_out() + i] = static_cast<int32_t>(j * p.n + p.out_rows[i]);
      for (int64_t i = 0; i < p.n; ++i) positions.push_back(static_cast<int32_t>(p.rows.data[i] % p.T));
    }
  }
};

Tensor tile(const Tensor& x, int64_t S) { return S == 1 ? x : concat(std::vector<Tensor>(static_cast<size_t>(S), x), 0); }

// x (n, D) + each of the S blocks of d (S n, D), broadcast (no copies of x): (S n, D)
Tensor add_stacked(const Tensor& x, const Tensor& d) {
  const int64_t n = x.size(0), D = x.size(1);
  return reshape(add(reshape(d, {d.size(0) / n, n, D}), x), {d.size(0), D});
}

class FastEdges {
 public:
  FastEdges(TransformerLM& model, const PatchingInputs& in, const Runs& runs) : m_(model), c_(model.cfg), in_(in), pk_(in) {
    for (int l = 0; l < c_.n_layers; ++l) {
      pre_.push_back(pk_.pack(runs.resid_pre[l]));
      mid_.push_back(pk_.pack(runs.resid_mid[l]));
      mlp_in_.push_back(c_.parallel_block ? pre_.back() : mid_.back());
      if (c_.sandwich_norm) raw_.push_back(pk_.pack(runs.attn_raw[l]));
    }
    final_ = pk_.pack(runs.resid_final);
    for (const Tensor& d : runs.deltas) deltas_.push_back(pk_.pack(d));
    // a batch of at most kEdgeBatchRows rows and kEdgeBatchLogitBytes of logits (or one run)
    const double logits_per_run = 4.0 * static_cast<double>(pk_.n_out()) * static_cast<double>(c_.vocab_size);
    max_stack_ = std::max<int64_t>(1, std::min<int64_t>(kEdgeBatchRows / std::max<int64_t>(1, pk_.n),
                                                        static_cast<int64_t>(kEdgeBatchLogitBytes / std::max(1.0, logits_per_run))));
  }

  // AtP*'s QK fix (query_key_output_dots): for each sender s of r (a head's .q or .k), head h's
  // result with r reading its input + delta_s, minus its clean result, dotted with `grad` (the
  // gradient at the head's output, packed (n, D)). With by_row, each sender's dot per row of the
  // batch (B values each, the rows' sums).
  std::vector<double> head_change_dots(const EdgeReceiver& r, const std::vector<size_t>& senders, const Tensor& grad, bool by_row = false) {
    const int l = r.layer, which = r.kind == EdgeReceiver::Q ? 0 : 1;
    const CleanHead& ch = clean_head(l, r.head);
    const int64_t block = pk_.n * c_.d_model;
    std::vector<double> out;
    for (size_t at = 0; at < senders.size(); at += static_cast<size_t>(max_stack_)) {
      const size_t end = std::min(senders.size(), at + static_cast<size_t>(max_stack_));
      const int64_t S = static_cast<int64_t>(end - at);
      throw_if_stopped();
      std::vector<Tensor> ds;
      for (size_t i = at; i < end; ++i) ds.push_back(deltas_[senders[i]]);
      const Tensor delta = S == 1 ? ds[0] : concat(ds, 0);  // (S n, D)
      Tensor qkv[3];
      for (int w = 0; w < 3; ++w)
        qkv[w] = w == which ? project(l, r.head, w, m_.blocks[l]->ln1.forward(add_stacked(pre_[l], delta))) : tile(ch.qkv[w], S);
      const Tensor change = add_stacked(neg(ch.result), head_result(l, r.head, qkv[0], qkv[1], qkv[2], S));  // (S n, D)
      const int64_t B = static_cast<int64_t>(pk_.live_len.size()), D = c_.d_model;
      for (int64_t j = 0; j < S; ++j) {
        std::vector<double> rows(by_row ? static_cast<size_t>(B) : 1, 0.0);
        const float *x = change.data() + j * block, *g = grad.data();
        for (int64_t p = 0; p < pk_.n; ++p) {  // packed row p is row b * T + t of the batch
          double& s = rows[by_row ? pk_.rows.data[p] / pk_.T : 0];
          for (int64_t i = p * D; i < (p + 1) * D; ++i) s += static_cast<double>(x[i]) * g[i];
        }
        out.insert(out.end(), rows.begin(), rows.end());
      }
    }
    return out;
  }
  Tensor pack(const Tensor& x) const { return pk_.pack(x); }

  // exact(s -> r) for the given senders of r
  std::vector<double> receiver(const EdgeReceiver& r, const std::vector<size_t>& senders) {
    std::vector<double> out;
    for (size_t at = 0; at < senders.size(); at += static_cast<size_t>(max_stack_)) {
      const std::vector<size_t> chunk(senders.begin() + static_cast<std::ptrdiff_t>(at),
                                      senders.begin() + static_cast<std::ptrdiff_t>(std::min(senders.size(), at + static_cast<size_t>(max_stack_))));
      const int64_t S = static_cast<int64_t>(chunk.size());
      throw_if_stopped();  // each chunk is a batch of patched runs
      std::vector<Tensor> ds;
      for (size_t s : chunk) ds.push_back(deltas_[s]);
      const Tensor delta = S == 1 ? ds[0] : concat(ds, 0);  // (S n, D)
      const Tensor logits = patched_logits(r, delta, S);
      const double base = base_metric(r);
      for (int64_t j = 0; j < S; ++j) out.push_back(metric(logits, j) - base);
    }
    return out;
  }

 private:
  // The metric of batch copy j from the answers' logits (S n_out, V).
  double metric(const Tensor& logits, int64_t j) const {
    const int64_t V = logits.size(1);
    double s = 0;
    for (size_t a = 0; a < in_.answers.size(); ++a) {
      const float* row = logits.data() + (j * pk_.n_out() + pk_.answer_out[a]) * V;
      s += static_cast<double>(row[in_.answers[a].clean]) - static_cast<double>(row[in_.answers[a].corrupted]);
    }
    return s / static_cast<double>(in_.answers.size());
  }

  // The unpatched run through the same path, per layer where the patched runs go on (the base of
  // exact: an edge whose delta is 0 gives 0).
  double base_metric(const EdgeReceiver& r) {
    const int key = r.kind == EdgeReceiver::Logits ? c_.n_layers : r.layer;
    auto it = base_.find(key);
    if (it != base_.end()) return it->second;
    const Tensor logits = key == c_.n_layers ? unembed(gather_rows(final_, Stack(pk_, 1).out_rows))
                                             : after_attention(key, attn_sum(key, Tensor(), 1), mlp_in_[key], Tensor(), 1);
    return base_[key] = metric(logits, 0);
  }

  // ln_final, the head and the final soft-cap, as the model's forward ends
  Tensor unembed(const Tensor& x) const { return m_.cap_logits(m_.head.forward(m_.ln_f->forward(x))); }

  // The residual stream after block l's attention, resid_pre + hook_attn_out (S n, D), when the
  // attention's output (before any sandwich norm, W_O's bias included) moves by raw_delta (S n, D;
  // undefined = the clean run's). Without a sandwich norm the move adds as it is; with one it
  // goes through ln1_post with the rest of the output.
  Tensor attn_sum(int l, const Tensor& raw_delta, int64_t S) const {
    if (!c_.sandwich_norm) return raw_delta.defined() ? add_stacked(mid_[l], raw_delta) : tile(mid_[l], S);
    const Tensor raw = raw_delta.defined() ? add_stacked(raw_[l], raw_delta) : tile(raw_[l], S);
    return add_stacked(pre_[l], m_.blocks[l]->ln1_post->forward(raw));
  }

  // The rest of block l from its attention's output on, then the later blocks, ln_final and the
  // head: the residual after attention (S n, D) and what the MLP reads (S n or n rows, D: the
  // same in a sequential block, the block's input in a parallel one) -> the answers' logits
  // (S n_out, V). mlp_delta (S n, D), if given, is added to the MLP's input alone.
  Tensor after_attention(int l, const Tensor& mid_in, const Tensor& mlp_read, const Tensor& mlp_delta, int64_t S) {
    const Stack st(pk_, S);
    const bool last = l + 1 == c_.n_layers;
    const Tensor mid = last ? gather_rows(mid_in, st.out_rows) : mid_in;
    Tensor x = mid;
    const TransformerBlock& b = *m_.blocks[l];
    if (b.ffn) {
      // the MLP's input: its own rows (a sequential block's, mid_in) or the clean ones of every copy
      const Tensor own = c_.parallel_block ? tile(mlp_read, S) : mlp_read;
      const Tensor base = c_.parallel_block ? (last ? gather_rows(own, st.out_rows) : own) : mid;
      const Tensor read = mlp_delta.defined() ? add(base, last ? gather_rows(mlp_delta, st.out_rows) : mlp_delta) : base;
      const Tensor y = b.ffn->forward(b.ln2->forward(read));
      x = add(mid, b.ln2_post ? b.ln2_post->forward(y) : y);
    }
    if (last) return unembed(x);
    ForwardOptions opt;
    opt.live_len = st.live_len;
    opt.output_rows = &st.out_rows;
    return m_.forward_from(l + 1, x, opt);
  }

  // Head h of layer l on its projected q, k and v (each (S n, dh)): its result z_h W_O[:, h]
  // (S n, D), with the layer's attention options as MultiHeadAttention applies them: QK-norm,
  // rotary positions (each packed row at its position in its sequence), the score scale, the
  // sliding window and the soft-cap.
  Tensor head_result(int l, int h, const Tensor& q_in, const Tensor& k_in, const Tensor& v, int64_t S) {
    const MultiHeadAttention& a = m_.blocks[l]->attn;
    const AttentionConfig& ac = a.cfg;
    const int64_t dh = c_.head_dim();
    const Stack st(pk_, S);
    Tensor q = q_in, k = k_in;
    if (ac.qk_norm) {
      q = head_rms_norm(q, 1, dh, a.q_norm->weight, ac.norm_eps, ac.qk_norm_one_plus);
      k = head_rms_norm(k, 1, dh, a.k_norm->weight, ac.norm_eps, ac.qk_norm_one_plus);
    }
    if (ac.rotary) {
      q = rotary(q, 1, st.positions, a.rotary_cos_sin, ac.rope);
      k = rotary(k, 1, st.positions, a.rotary_cos_sin, ac.rope);
    }
    AttentionArgs args;
    args.n_heads = 1;
    args.d_head = static_cast<int>(dh);
    args.causal = true;
    args.scale = ac.scale;
    args.window = ac.window;
    args.gates = slice(a.gates, 0, h, h + 1);
    const Tensor qkv = concat({q, k, v}, 1);
    const Tensor z = ac.softcap > 0.f ? attention_varlen_capped(qkv, st.live_len, args, ac.softcap)
                                      : attention_varlen(qkv, st.live_len, args);  // (S n, dh)
    return linear(z, head_cols(a.W_O.weight, h, dh));
  }

  // Head h's projection `which` (0 q, 1 k, 2 v) of ln1's output x (rows, D): (rows, dh).
  Tensor project(int l, int h, int which, const Tensor& x) const {
    const MultiHeadAttention& a = m_.blocks[l]->attn;
    const Linear& lin = which == 0 ? a.W_Q : which == 1 ? a.W_K : a.W_V;
    const int64_t dh = c_.head_dim();
    return linear(x, head_rows(lin.weight, h, dh), lin.bias.defined() ? slice(lin.bias, 0, h * dh, (h + 1) * dh) : Tensor());
  }

  struct CleanHead {
    Tensor qkv[3], result;  // (n, dh) each, (n, D)
  };
  const CleanHead& clean_head(int l, int h) {
    auto key = std::make_pair(l, h);
    auto it = clean_heads_.find(key);
    if (it != clean_heads_.end()) return it->second;
    CleanHead ch;
    const Tensor ln = m_.blocks[l]->ln1.forward(pre_[l]);
    for (int w = 0; w < 3; ++w) ch.qkv[w] = project(l, h, w, ln);
    ch.result = head_result(l, h, ch.qkv[0], ch.qkv[1], ch.qkv[2], 1);
    return clean_heads_[key] = ch;
  }

  Tensor patched_logits(const EdgeReceiver& r, const Tensor& delta, int64_t S) {
    const int l = r.layer;
    switch (r.kind) {
      case EdgeReceiver::Logits: {
        const Stack st(pk_, S);
        return unembed(gather_rows(add_stacked(final_, delta), st.out_rows));
      }
      case EdgeReceiver::Mlp: return after_attention(l, attn_sum(l, Tensor(), S), mlp_in_[l], delta, S);
      default: {
        // only head h changes in block l: attention's output is the clean one plus (its new
        // result - its clean result)
        const int which = r.kind == EdgeReceiver::Q ? 0 : r.kind == EdgeReceiver::K ? 1 : 2;
        const CleanHead& ch = clean_head(l, r.head);
        Tensor qkv[3];
        for (int w = 0; w < 3; ++w)
          qkv[w] = w == which ? project(l, r.head, w, m_.blocks[l]->ln1.forward(add_stacked(pre_[l], delta))) : tile(ch.qkv[w], S);
        const Tensor result = head_result(l, r.head, qkv[0], qkv[1], qkv[2], S);
        const Tensor mid = attn_sum(l, add_stacked(neg(ch.result), result), S);
        return after_attention(l, mid, c_.parallel_block ? mlp_in_[l] : mid, Tensor(), S);
      }
    }
  }

  TransformerLM& m_;
  const ModelConfig& c_;
  const PatchingInputs& in_;
  Packing pk_;
  std::vector<Tensor> pre_, mid_, mlp_in_, raw_, deltas_;  // packed (n, D); raw_: sandwich norms only
  Tensor final_;
  int64_t max_stack_ = 1;
  std::map<int, double> base_;
  std::map<std::pair<int, int>, CleanHead> clean_heads_;
};

}  // namespace

EdgeResult edge_patching(TransformerLM& model, const PatchingInputs& in, const std::function<void(size_t, size_t)>& progress) {
  check_edge_inputs(model.cfg, in);
  const ModelConfig& c = model.cfg;
  const Runs runs = record_runs(model, in);
  throw_if_stopped();
  const std::vector<double> attribution = edge_products(c, runs.delta_stack, receiver_gradient_stack(model, in));
  throw_if_stopped();
  EvalScope mode(model);
  NoGradGuard ng;
  FastEdges fast(model, in, runs);
  EdgeResult res;
  res.clean_metric = runs.clean_metric;
  res.corrupted_metric = runs.corrupted_metric;
  const std::vector<EdgeReceiver> receivers = edge_receivers(c);
  const std::vector<EdgeSender> senders = edge_senders(c);
  for (size_t ri = 0; ri < receivers.size(); ++ri) {
    throw_if_stopped();
    const EdgeReceiver& r = receivers[ri];
    std::vector<size_t> from;
    for (size_t si = 0; si < senders.size(); ++si)
      if (is_edge(c, senders[si], r)) from.push_back(si);
    const std::vector<double> exact = fast.receiver(r, from);
    for (size_t i = 0; i < from.size(); ++i)
      res.edges.push_back({senders[from[i]], r, exact[i], attribution[res.edges.size()]});
    if (progress) progress(ri + 1, receivers.size());
  }
  return res;
}

namespace {
// The MLPs' deltas (layers, B, T, D), appended to runs.deltas after the senders' (index
// edge_senders' count + l): FastEdges then patches them as senders.
Tensor append_mlp_deltas(TransformerLM& model, const PatchingInputs& in, Runs& runs) {
  EvalScope mode(model);
  NoGradGuard ng;
  auto mlp_out = [](const std::string& n) { return n.ends_with("hook_mlp_out"); };
  const Tensor mlp_deltas =
      mlp_sender_delta_stack(model.cfg, model.run_with_cache(in.clean, mlp_out).second, model.run_with_cache(in.corrupted, mlp_out).second);
  for (const Tensor& d : unstack(mlp_deltas)) runs.deltas.push_back(d);
  return mlp_deltas;
}
}  // namespace

std::vector<MlpSenderEdge> mlp_sender_edges(TransformerLM& model, const PatchingInputs& in) {
  check_edge_inputs(model.cfg, in);
  const ModelConfig& c = model.cfg;
  if (!c.has_mlp()) return {};
  Runs runs = record_runs(model, in);
  const size_t first = runs.deltas.size();  // the MLPs' deltas go after the heads'
  const Tensor mlp_deltas = append_mlp_deltas(model, in, runs);  // (layers, B, T, D)
  throw_if_stopped();
  const std::vector<double> attribution = mlp_edge_products(c, mlp_deltas, receiver_gradient_stack(model, in));
  EvalScope mode(model);
  NoGradGuard ng;
  FastEdges fast(model, in, runs);
  std::vector<MlpSenderEdge> out;
  const std::vector<EdgeReceiver> receivers = edge_receivers(c);
  for (size_t ri = 0; ri < receivers.size(); ++ri) {
    throw_if_stopped();
    const EdgeReceiver& r = receivers[ri];
    std::vector<size_t> from;
    for (int l = 0; l < c.n_layers; ++l)
      if (r.kind == EdgeReceiver::Logits || l < r.layer) from.push_back(first + static_cast<size_t>(l));
    if (from.empty()) continue;
    const std::vector<double> exact = fast.receiver(r, from);
    for (size_t i = 0; i < from.size(); ++i) out.push_back({static_cast<int>(from[i] - first), r, exact[i], attribution[out.size()]});
  }
  return out;
}

std::string FeatureSenderEdge::sender_name(int layer) const {
  return "L" + std::to_string(layer) + "z." + (feature < 0 ? std::string("err") : "f" + std::to_string(feature));
}

void check_feature_sender_sae(const ModelConfig& c, const Sae& sae) {
  const std::string& hook = sae.cfg.hook_name;
  const int L = hook_layer(hook);
  if (L < 0 || L >= c.n_layers || in_block_name(hook) != "attn.hook_z" || sae.cfg.transcoder())
    fail("edges: the SAE at '", hook, "' is not on a layer's attn.hook_z: feature senders write through W_O (an SAE on blocks.L.attn.hook_z)");
  if (sae.cfg.d_in != c.n_heads * c.head_dim())
    fail("edges: the SAE at ", hook, " takes d_in = ", sae.cfg.d_in, ", the model's hook_z has ", c.n_heads * c.head_dim());
  if (c.sandwich_norm) fail("edges: feature senders need heads that write into the residual stream directly (the model has sandwich norms)");
}

Tensor feature_sender_delta_stack(TransformerLM& model, const PatchingInputs& in, const Sae& sae, std::vector<int>& features) {
  const ModelConfig& c = model.cfg;
  check_feature_sender_sae(c, sae);
  const std::string& hook = sae.cfg.hook_name;
  const int L = hook_layer(hook);
  EvalScope mode(model);
  NoGradGuard ng;
  const int64_t B = in.clean.shape[0], T = in.clean.shape[1], N = B * T, F = sae.cfg.d_sae, W = sae.cfg.d_in, D = c.d_model;
  // per run: the features (N, F), each row's std with layer_norm (N, 1), the error in hook_z space (N, W)
  struct Run { Tensor f, scale, err; };
  auto run = [&](const Ids& ids) {
    const Tensor x = sae_rows(model.run_with_cache(ids, name_is(hook)).second[hook], W, hook);  // (N, W)
    Run r;
    r.f = sae.encode(x);
    Tensor written = matmul(r.f, sae.W_dec);  // sum_i f_i W_dec[i]
    if (sae.layer_norm()) sae.normalize_input(x, &r.scale), written = mul(written, r.scale);
    r.err = sub(x, written);
    return r;
  };
  const Run clean = run(in.clean), corrupt = run(in.corrupted);
  features.clear();
  for (int64_t i = 0; i < F; ++i)
    for (int64_t n = 0; n < N; ++n)
      if (clean.f.data()[n * F + i] != corrupt.f.data()[n * F + i] ||
          (sae.layer_norm() && clean.f.data()[n * F + i] != 0.f && clean.scale.data()[n] != corrupt.scale.data()[n])) {
        features.push_back(static_cast<int>(i));
        break;
      }
  const int64_t S = static_cast<int64_t>(features.size()) + 1;
  check_fits_in_memory(4.0 * static_cast<double>(S * N * D), "edges: the deltas of " + std::to_string(S - 1) + " features of " + hook);
  const Tensor& w_o = model.blocks[static_cast<size_t>(L)]->attn.W_O.weight;  // (D, W)
  const Tensor writes = matmul(sae.W_dec, w_o, false, true);                   // (F, D): feature i's write per unit
  Tensor stack = Tensor::zeros({S, B, T, D});
  for (int64_t s = 0; s + 1 < S; ++s) {
    const int64_t i = features[static_cast<size_t>(s)];
    float* o = stack.data() + s * N * D;
    for (int64_t n = 0; n < N; ++n) {
      // f_i (times the row's std) in the corrupted run minus the clean run's
      float a = corrupt.f.data()[n * F + i], b = clean.f.data()[n * F + i];
      if (sae.layer_norm()) a *= corrupt.scale.data()[n], b *= clean.scale.data()[n];
      const float df = a - b;
      if (df != 0.f)
        for (int64_t d = 0; d < D; ++d) o[n * D + d] = df * writes.data()[i * D + d];
    }
  }
  const Tensor err = matmul(sub(corrupt.err, clean.err), w_o, false, true);  // (N, D)
  std::copy_n(err.data(), N * D, stack.data() + (S - 1) * N * D);
  return stack;
}

std::vector<FeatureSenderEdge> feature_sender_edges(TransformerLM& model, const PatchingInputs& in, const Sae& sae) {
  check_edge_inputs(model.cfg, in);
  const ModelConfig& c = model.cfg;
  std::vector<int> features;
  const Tensor deltas = feature_sender_delta_stack(model, in, sae, features);  // (S, B, T, D)
  const int L = hook_layer(sae.cfg.hook_name);
  throw_if_stopped();
  const Tensor grads = receiver_gradient_stack(model, in);  // (R, B, T, D)
  Runs runs = record_runs(model, in);
  const size_t first = runs.deltas.size();  // the features' deltas go after the senders'
  for (const Tensor& d : unstack(deltas)) runs.deltas.push_back(d);
  EvalScope mode(model);
  NoGradGuard ng;
  FastEdges fast(model, in, runs);
  const std::vector<EdgeReceiver> receivers = edge_receivers(c);
  const int64_t S = deltas.size(0), K = deltas.numel() / S;
  std::vector<FeatureSenderEdge> out;
  for (size_t ri = 0; ri < receivers.size(); ++ri) {
    const EdgeReceiver& r = receivers[ri];
    if (!is_edge(c, EdgeSender{L, 0}, r)) continue;  // reads before layer L's heads write
    std::vector<size_t> from;
    for (int64_t s = 0; s < S; ++s) from.push_back(first + static_cast<size_t>(s));
    const std::vector<double> exact = fast.receiver(r, from);
    const float* g = grads.data() + static_cast<int64_t>(ri) * K;
    for (int64_t s = 0; s < S; ++s) {
      const float* d = deltas.data() + s * K;
      double a = 0;
      for (int64_t k = 0; k < K; ++k) a += double(d[k]) * g[k];
      out.push_back({s + 1 < S ? features[static_cast<size_t>(s)] : -1, r, exact[static_cast<size_t>(s)], a});
    }
  }
  return out;
}

Tensor mlp_sender_delta_stack(const ModelConfig& c, const ActivationCache& clean, const ActivationCache& corrupt) {
  std::vector<Tensor> d;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string n = hook_name(l, "hook_mlp_out");
    const Tensor x = sub(corrupt[n], clean[n]);  // (B, T, D)
    d.push_back(reshape(x, {1, x.size(0), x.size(1), x.size(2)}));
  }
  return concat(d, 0);
}

struct QueryKeyOutputDots::State {
  TransformerLM& model;
  const PatchingInputs& in;
  bool mlps;
  Runs runs;
  std::unique_ptr<FastEdges> fast;  // reads runs
};

QueryKeyOutputDots::QueryKeyOutputDots(TransformerLM& model, const PatchingInputs& in, bool with_mlps) {
  check_edge_inputs(model.cfg, in);
  s_.reset(new State{model, in, with_mlps && model.cfg.has_mlp(), record_runs(model, in), nullptr});
  if (s_->mlps) (void)append_mlp_deltas(model, in, s_->runs);  // sender index edge_senders' count + l
  EvalScope mode(model);
  NoGradGuard ng;
  s_->fast = std::make_unique<FastEdges>(model, in, s_->runs);
}

QueryKeyOutputDots::~QueryKeyOutputDots() = default;

std::vector<double> query_key_output_dots(TransformerLM& model, const PatchingInputs& in, const std::vector<Tensor>& out_grads,
                                          bool by_row, bool with_mlps) {
  return QueryKeyOutputDots(model, in, with_mlps)(out_grads, by_row);
}

std::vector<double> QueryKeyOutputDots::operator()(const std::vector<Tensor>& out_grads, bool by_row) const {
  TransformerLM& model = s_->model;
  const PatchingInputs& in = s_->in;
  const ModelConfig& c = model.cfg;
  if (out_grads.size() != static_cast<size_t>(c.n_layers) * c.n_heads)
    fail("edges: ", out_grads.size(), " head output gradients for the model's ", c.n_layers * c.n_heads, " heads");
  const std::vector<EdgeSender> senders = edge_senders(c);
  const bool mlps = s_->mlps;
  EvalScope mode(model);
  NoGradGuard ng;
  FastEdges& fast = *s_->fast;
  const size_t E = model_edges(c).size(), M = mlps ? mlp_sender_edge_list(c).size() : 0, W = E + M;
  const size_t B = by_row ? static_cast<size_t>(in.clean.shape[0]) : 1;
  std::vector<double> out(B * W, 0.0);  // (B, E + M): per row the edges, then the MLP-sender edges
  size_t e = 0, m = E;
  for (const EdgeReceiver& r : edge_receivers(c)) {
    std::vector<size_t> from, from_mlps;
    for (size_t si = 0; si < senders.size(); ++si)
      if (is_edge(c, senders[si], r)) from.push_back(si);
    if (mlps)
      for (int l = 0; l < c.n_layers; ++l)
        if (r.kind == EdgeReceiver::Logits || l < r.layer) from_mlps.push_back(senders.size() + static_cast<size_t>(l));
    const Tensor& g = r.kind == EdgeReceiver::Q || r.kind == EdgeReceiver::K ? out_grads[static_cast<size_t>(r.layer) * c.n_heads + r.head]
                                                                             : Tensor();
    if (g.defined()) {
      const Tensor packed = fast.pack(g);
      for (const auto& [list, at] : {std::pair{&from, e}, std::pair{&from_mlps, m}}) {
        const std::vector<double> d = fast.head_change_dots(r, *list, packed, by_row);  // (senders, B)
        for (size_t i = 0; i < list->size(); ++i)
          for (size_t b = 0; b < B; ++b) out[b * W + at + i] = d[i * B + b];
      }
    }
    e += from.size();
    m += from_mlps.size();
  }
  return out;
}

PathPatchingResult path_patching(TransformerLM& model, const PatchingInputs& in, const EdgeSender& sender,
                                 const std::vector<EdgeReceiver>& receivers) {
  check_edge_inputs(model.cfg, in);
  const ModelConfig& c = model.cfg;
  if (sender.layer >= c.n_layers || sender.head >= c.n_heads || (sender.layer >= 0 && sender.head < 0))
    fail("edges: sender ", sender.name(), " is not in the model (", c.n_layers, " layers of ", c.n_heads, " heads)");
  if (receivers.empty()) fail("edges: path patching of ", sender.name(), " needs at least one receiver");
  for (size_t i = 0; i < receivers.size(); ++i) {
    const EdgeReceiver& r = receivers[i];
    (void)parse_receiver(c, r.name());  // in range, and an MLP only where there is one
    if (!is_edge(c, sender, r))
      fail("edges: ", sender.name(), " is written after ", r.name(), " reads the residual stream (no edge ", sender.name(), " -> ",
           r.name(), ")");
    for (size_t j = 0; j < i; ++j)
      if (receivers[j] == r) fail("edges: receiver ", r.name(), " given twice");
  }
  const Runs runs = record_runs(model, in);
  const Tensor& delta = runs.deltas[sender_index(c, sender)];
  std::vector<std::pair<EdgeReceiver, Tensor>> patches;
  for (const EdgeReceiver& r : receivers) patches.push_back({r, delta});
  PathPatchingResult res;
  res.clean_metric = runs.clean_metric;
  res.corrupted_metric = runs.corrupted_metric;
  res.path = hooked_patched_metric(model, in, runs, patches) - runs.clean_metric;
  // activation patching of the sender: its output in the clean run taken from the corrupted run
  EvalScope mode(model);
  NoGradGuard ng;
  ActivationCache corrupt;
  const std::string point = sender.layer < 0 ? "hook_embed" : hook_name(sender.layer, "attn.hook_result");
  corrupt = model.run_with_cache(in.corrupted, name_is(point)).second;
  Hooks hooks;
  const int h = sender.head;
  hooks.add_forward(point, [&](const Tensor& x, const std::string&) {
    if (h < 0) return corrupt[point].clone();
    Tensor y = x.clone();
    const Tensor& from = corrupt[point];  // (B, T, H, D)
    const int64_t rows = x.size(0) * x.size(1), H = x.size(2), D = x.size(3);
    for (int64_t r = 0; r < rows; ++r) std::copy(from.data() + (r * H + h) * D, from.data() + (r * H + h + 1) * D, y.data() + (r * H + h) * D);
    return y;
  });
  ForwardOptions opt;
  opt.hooks = &hooks;
  res.activation = edge_metric(model.forward(in.clean, opt), in.answers) - runs.clean_metric;
  return res;
}

double patched_receiver_metric(TransformerLM& model, const PatchingInputs& in, const EdgeReceiver& receiver, const Tensor& delta) {
  check_edge_inputs(model.cfg, in);
  (void)parse_receiver(model.cfg, receiver.name());
  const Runs runs = record_runs(model, in);
  if (delta.shape() != runs.resid_final.shape())
    fail("edges: delta ", delta.shape().str(), " must be the residual stream's shape ", runs.resid_final.shape().str());
  return hooked_patched_metric(model, in, runs, {{receiver, delta}});
}

Tensor receiver_input_gradient(TransformerLM& model, const PatchingInputs& in, const EdgeReceiver& receiver) {
  check_edge_inputs(model.cfg, in);
  (void)parse_receiver(model.cfg, receiver.name());
  const std::vector<Tensor> g = receiver_gradients(model, in);
  const std::vector<EdgeReceiver> all = edge_receivers(model.cfg);
  return g[static_cast<size_t>(std::find(all.begin(), all.end(), receiver) - all.begin())];
}

}  // namespace hl
