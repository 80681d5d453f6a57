// Edges between the components of a pre-norm model (docs/circuits.md): exact edge patching,
// edge attribution patching (Syed et al. 2023) and path patching (Wang et al. 2022).
//
// Senders write to the residual stream: `embed` (token + position embeddings) and every head
// `L{l}H{h}` (its hook_result, W_O's bias excluded). Receivers read it: a head's query, key or
// value input `L{l}H{h}.q/.k/.v`, the MLP `mlp{l}`, and `logits` (ln_final + unembedding). An
// edge s -> r exists when s writes before r reads. The base run is the clean input, the source
// run the corrupted one: delta_s = out_s(corrupted) - out_s(clean), (B, T, d_model).
// The metric is the mean over the answers of logits[row, pos, clean] - logits[row, pos, corrupted]
// (raw logit-difference units, not normalised).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "analysis/patching.h"
#include "models/sae.h"

namespace hl {

struct EdgeSender {
  int layer = -1, head = -1;  // layer -1: embed
  std::string name() const;    // "embed", "L0H3"
  bool operator==(const EdgeSender&) const = default;
};
struct EdgeReceiver {
  enum Kind { Q, K, V, Mlp, Logits } kind = Logits;
  int layer = -1, head = -1;  // head: q/k/v only; layer: not for logits
  std::string name() const;    // "L1H2.q", "mlp1", "logits"
  bool operator==(const EdgeReceiver&) const = default;
};
// "embed" / "L0H3", checked against the model (unknown name, layer or head out of range).
EdgeSender parse_sender(const ModelConfig& cfg, const std::string& name);
// "L1H2.q" / ".k" / ".v", "mlp1", "logits", likewise (mlp of an attention-only model refused).
EdgeReceiver parse_receiver(const ModelConfig& cfg, const std::string& name);
// Whether s writes to the residual stream before r reads it, in a model of sequential blocks
// (an MLP reads its own layer's heads) ...
bool is_edge(const EdgeSender& s, const EdgeReceiver& r);
// ... and in this model: with parallel blocks (parallel_block) the MLP reads the block's input,
// so a layer's heads do not reach its own MLP. What model_edges and readers_of list.
bool is_edge(const ModelConfig& cfg, const EdgeSender& s, const EdgeReceiver& r);
std::vector<EdgeSender> edge_senders(const ModelConfig& cfg);      // forward order: embed, L0H0, L0H1, ...
std::vector<EdgeReceiver> edge_receivers(const ModelConfig& cfg);  // forward order: L0H0.q/k/v, L0H1.q ..., mlp0, L1..., logits
// Every edge: receivers in forward order, for each its senders in forward order.
std::vector<std::pair<EdgeSender, EdgeReceiver>> model_edges(const ModelConfig& cfg);

struct Edge {
  EdgeSender sender;
  EdgeReceiver receiver;
  double exact = 0, attribution = 0;
  double linearisation_error() const { return attribution - exact; }
};
struct EdgeResult {
  double clean_metric = 0, corrupted_metric = 0;  // the metric of the clean and the corrupted run
  std::vector<Edge> edges;                        // model_edges order
};

// The metric (mean over the answers of the clean minus the corrupted answer's logit), summed in
// double, from logits (B, T, V).
double edge_metric(const Tensor& logits, const std::vector<PatchAnswer>& answers);
// Fails naming the setting for a model these analyses cannot take: post-norm (its residual stream
// is not a sum of the senders' outputs). Every block and attention option of docs/architectures.md
// is taken (parallel blocks, sandwich norms, soft-caps, rotary positions, QK-norm, score scales,
// sliding windows, biases); grouped-query attention through edge_model.
void check_edge_model(const ModelConfig& cfg);
// The model the edge analyses run on, for both doors: `model` itself, or, when it shares keys and
// values between heads (grouped-query attention), its ungrouped equivalent
// (ungroup_grouped_query_attention; TransformerLens's ungroup_grouped_query_attention, as MIB's
// circuit track runs Llama, Qwen and Gemma). Then every head has its own key and value input, and a
// receiver L{l}H{h}.k / .v patches query head h's copy of its group's input alone: a finer
// intervention than the shared head, whose key and value every head of the group reads. Refuses
// what check_edge_model refuses.
struct EdgeModel {
  std::unique_ptr<TransformerLM> ungrouped;  // grouped-query models only
  TransformerLM* model = nullptr;            // what the analyses run on
  TransformerLM& operator*() const { return *model; }
  TransformerLM* operator->() const { return model; }
};
EdgeModel edge_model(TransformerLM& model);
// Fails with one message for what these analyses cannot take: check_edge_model's, a grouped-query
// model not passed through edge_model, clean and corrupted ids of different shapes, no answers, an answer outside the ids
// or the vocabulary, padding other than on the right or an answer at padding (check_patching_padding).
void check_edge_inputs(const ModelConfig& cfg, const PatchingInputs& in);
// Bytes edge_patching needs for `rows` sequences of T tokens (an upper estimate): the model, its
// ungrouped copy if it has grouped-query attention (edge_model), the clean and corrupted runs' caches,
// one delta per sender, the gradients, and one batch of patched runs.
double edge_patching_memory_bytes(const ModelConfig& cfg, int64_t rows, int64_t T);

// What edge_patching's exact runs compute (and mlp_sender_edges', with_mlp_senders), counted from
// the shapes alone, to say the time up front: the edges, their patched runs' token-blocks (a
// packed position through one block: each run from its receiver's block on, over every row up to
// its last answer) and their floating-point operations (the blocks' products, attention over the
// keys, the unembedding at the answers). At real sizes this is hours, where one forward is seconds:
// SmolLM2-135M's shape, two 128-token probe rows, about 1.2e5 edges and 5e14 operations.
struct EdgeWork {
  double edges = 0, token_blocks = 0, flops = 0;
};
EdgeWork edge_patching_work(const ModelConfig& cfg, const PatchingInputs& in, bool with_mlp_senders);
// The operations of one forward of rows x T tokens, counted as edge_patching_work counts a block's:
// what a timed forward measures the machine's rate with.
double forward_flops(const ModelConfig& cfg, int64_t rows, int64_t T);

// Every edge's exact effect, exact(s -> r) = m(clean run with r alone reading its input +
// delta_s) - m(clean run), and its attribution, sum of delta_s * dm/d(r's input) from one
// backward of the clean run. One clean and one corrupted run are cached; each patched run starts
// at the receiver's block (only the receiving head is recomputed there), computes only the
// positions up to each row's last answer and, in the last block, only the answer positions, and
// runs all senders of one receiver as one batch. `progress`, if given, is called with (receivers
// done, receivers).
EdgeResult edge_patching(TransformerLM& model, const PatchingInputs& in,
                         const std::function<void(size_t, size_t)>& progress = {});

// Path patching of `sender` to the set `receivers`: the clean run in which every receiver reads
// its input in that run + delta_s at once (no other component sees delta_s), minus the clean
// run's metric. With every reader of s as receivers it equals activation patching of s.
struct PathPatchingResult {
  double clean_metric = 0, corrupted_metric = 0;
  double path = 0;        // m(path-patched run) - m(clean)
  double activation = 0;  // m(clean run with s's output taken from the corrupted run) - m(clean)
};
PathPatchingResult path_patching(TransformerLM& model, const PatchingInputs& in, const EdgeSender& sender,
                                 const std::vector<EdgeReceiver>& receivers);
// Every receiver s writes to (its readers).
std::vector<EdgeReceiver> readers_of(const ModelConfig& cfg, const EdgeSender& sender);

// dm/d(each receiver's input), (B, T, D) in edge_receivers order, from one forward and backward
// of the clean run with `intervene`'s forward hooks added (e.g. an interpolated embedding for
// EAP-IG; none: the clean run's gradients, which edge attribution uses) ...
std::vector<Tensor> receiver_gradients(TransformerLM& model, const PatchingInputs& in,
                                       const std::function<void(Hooks&)>& intervene = {});
// ... the same gradients stacked, (receivers, B, T, D), as edge_products reads them.
Tensor receiver_gradient_stack(TransformerLM& model, const PatchingInputs& in, const std::function<void(Hooks&)>& intervene = {});
// ... the same gradients added into `sum` (receivers, B, T, D) (undefined: allocated and written):
// EAP-IG's sum over its steps without a stack per step.
void add_receiver_gradients(TransformerLM& model, const PatchingInputs& in, Tensor& sum,
                            const std::function<void(Hooks&)>& intervene = {});
// The attribution product of every edge, model_edges order: sum over (B, T, D) of senders[s] *
// grads[r] for each edge s -> r, with senders (edge_senders' count, B, T, D) and grads
// (edge_receivers' count, B, T, D). One sgemm per receiver layer (its receivers against the senders
// before them) over chunks of the sum, the chunks added in double.
std::vector<double> edge_products(const ModelConfig& cfg, const Tensor& senders, const Tensor& grads);
// ... and per row of the batch: (B, edges), row b's products over its (T, D).
std::vector<double> edge_products_by_row(const ModelConfig& cfg, const Tensor& senders, const Tensor& grads);
// The same product for the MLP-sender edges (mlp_sender_edges' order, mlp_sender_edge_list) from
// the MLPs' deltas (layers, B, T, D) of hook_mlp_out.
std::vector<double> mlp_edge_products(const ModelConfig& cfg, const Tensor& mlp_deltas, const Tensor& grads);
// ... and per row of the batch: (B, MLP-sender edges).
std::vector<double> mlp_edge_products_by_row(const ModelConfig& cfg, const Tensor& mlp_deltas, const Tensor& grads);
// The senders' deltas stacked, (senders, B, T, D) in edge_senders order, from a clean and a
// corrupted cache holding hook_embed (hook_pos_embed where the model has one) and every layer's
// attn.hook_z (is_sender_point's names): a head's delta is its hook_result's, through W_O.
Tensor edge_sender_delta_stack(const TransformerLM& model, const ActivationCache& clean, const ActivationCache& corrupt);
// The embedding sender's output, (B, T, D), from a cache holding hook_embed (and hook_pos_embed
// where the model adds position embeddings): token + position embeddings, as the model adds them.
Tensor embed_output(const ActivationCache& cache);
// Whether `name` is a hook point those caches need (a run_with_cache filter).
bool is_sender_point(const std::string& name);
// delta_s = out_s(corrupted) - out_s(clean) of every sender, (B, T, d_model), edge_senders order,
// from one clean and one corrupted run: views of edge_sender_delta_stack's rows.
std::vector<Tensor> edge_sender_deltas(TransformerLM& model, const PatchingInputs& in);
Tensor edge_sender_delta_stack(TransformerLM& model, const PatchingInputs& in);
// (n, B, T, D) -> n views (B, T, D) of its rows, sharing its storage.
std::vector<Tensor> unstack(const Tensor& stack);

// The MLPs as senders (MIB's `m{l} -> r` edges; a list beside model_edges, which a circuit's edges
// (circuit_discovery.h) also take): for every MLP l and every receiver r reading after it (a later layer's q/k/v or MLP,
// the logits), exact and attribution as edge_patching computes them, with delta =
// hook_mlp_out(corrupted) - hook_mlp_out(clean). Receivers in edge_receivers order, for each the
// MLPs in layer order; empty for an attention-only model.
struct MlpSenderEdge {
  int layer = 0;  // the sending MLP
  EdgeReceiver receiver;
  double exact = 0, attribution = 0;
};
std::vector<MlpSenderEdge> mlp_sender_edges(TransformerLM& model, const PatchingInputs& in);
// The MLPs' deltas stacked, (layers, B, T, D): hook_mlp_out(corrupted) - hook_mlp_out(clean), from
// caches holding every layer's hook_mlp_out.
Tensor mlp_sender_delta_stack(const ModelConfig& cfg, const ActivationCache& clean, const ActivationCache& corrupt);
// Those edges (the sending MLP's layer, the receiver) in that order, without scores.
std::vector<std::pair<int, EdgeReceiver>> mlp_sender_edge_list(const ModelConfig& cfg);

// ---- SAE features as senders (Marks et al.'s sparse feature circuits) ----
// For an SAE on blocks.L.attn.hook_z (heads concatenated, models/sae.h), feature i writes
// f_i W_dec[i] (times the row's std with layer_norm) through W_O into the residual stream, and
// the SAE's error writes the rest of hook_z's output, (x - sum_i f_i W_dec[i] (std)) W_O^T (b_dec
// and the mean included). Their deltas, out(corrupted) - out(clean) (B, T, D), sum to the layer's
// heads' deltas (edge_sender_deltas, W_O's bias excluded). For each, and every receiver reading
// layer L's heads, exact and attribution as edge_patching computes them. Only the features whose
// activation differs between the runs somewhere are senders (the others' delta is 0); receivers
// in edge_receivers order, for each the features in order, then the error.
struct FeatureSenderEdge {
  int feature = -1;  // -1: the SAE's error
  EdgeReceiver receiver;
  double exact = 0, attribution = 0;
  std::string sender_name(int layer) const;  // "L1z.f17", "L1z.err"
};
std::vector<FeatureSenderEdge> feature_sender_edges(TransformerLM& model, const PatchingInputs& in, const Sae& sae);
// Fails in one line for an SAE whose features cannot be senders here (not on a layer's
// attn.hook_z, another width, a model with sandwich norms).
void check_feature_sender_sae(const ModelConfig& cfg, const Sae& sae);
// Those senders' deltas, (features that differ + 1, B, T, D), the error's last; `features` gets
// which features they are.
Tensor feature_sender_delta_stack(TransformerLM& model, const PatchingInputs& in, const Sae& sae, std::vector<int>& features);

// AtP*'s QK fix (circuit_discovery.h): for every edge s -> r into a head's query or key input
// (r = L{l}H{h}.q or .k), head h's output (its hook_result, (B, T, D)) recomputed exactly with r
// reading its input + delta_s (its attention softmax at every query position), minus its clean
// output, dotted with out_grads[l * n_heads + h] (B, T, D; the gradient at that head's output).
// model_edges order; 0 for other edges and for heads whose gradient is undefined (not computed).
// With by_row, per row of the batch: (B, edges), row b's dots over its (T, D). With with_mlps (a
// model with MLPs), each row's edges are followed by the MLP-sender edges' (mlp_sender_edge_list
// order, the MLP's delta hook_mlp_out(corrupted) - hook_mlp_out(clean) in place of delta_s).
std::vector<double> query_key_output_dots(TransformerLM& model, const PatchingInputs& in, const std::vector<Tensor>& out_grads,
                                          bool by_row = false, bool with_mlps = false);
// The same for several sets of out_grads (GradDrop's L + 1): the runs, the senders' deltas and the
// heads' clean results recorded once. model and in must outlive it.
class QueryKeyOutputDots {
 public:
  QueryKeyOutputDots(TransformerLM& model, const PatchingInputs& in, bool with_mlps);
  ~QueryKeyOutputDots();
  std::vector<double> operator()(const std::vector<Tensor>& out_grads, bool by_row) const;
 private:
  struct State;
  std::unique_ptr<State> s_;
};

// For tests: the metric of the clean run in which `receiver` reads its input + delta (B, T,
// d_model), computed through the hooks of a full forward from the receiver's block (the reference
// the fast path of edge_patching is checked against) ...
double patched_receiver_metric(TransformerLM& model, const PatchingInputs& in, const EdgeReceiver& receiver, const Tensor& delta);
// ... and dm/d(receiver's input) of the clean run, (B, T, d_model), as edge_patching uses it.
Tensor receiver_input_gradient(TransformerLM& model, const PatchingInputs& in, const EdgeReceiver& receiver);

}  // namespace hl
