// Activation patching per head and per residual-stream position, with attribution patching
// (its first-order approximation) beside it (Meng et al. 2022; Nanda 2023). The metric is the
// logit difference between the clean and the corrupted answer at each row's answer position,
// averaged over rows, and reported normalised: (m - m_corrupted) / (m_clean - m_corrupted), so
// the clean run scores 1 and the corrupted run 0.
#pragma once
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "analysis/heads.h"

namespace hl {

struct PatchAnswer {
  int64_t row = 0, pos = 0;               // logits of this row at this position
  int32_t clean = 0, corrupted = 0;       // the clean and the corrupted answer token
};
struct PatchingInputs {
  Ids clean, corrupted;  // (B, T), equal but where the corruption is
  std::vector<PatchAnswer> answers;
  std::vector<int64_t> source_pos;  // per row, the position changed
  // (B, T) 1 where a row is padding after its tokens (both runs share it), or undefined: no
  // padding. A causal model's tokens never read the padding after them, so the runs take the
  // padded rows as they are and each row's answers are measured as if it ran alone.
  Tensor key_padding;
};
// A batch padded on either side made right-padded (models/padding.h): each row's clean and
// corrupted ids, padding, answers' positions and source_pos moved left by its leading padding,
// which it returns (per row; empty without key_padding). Fails naming attention_mask on a mask of
// another shape, values other than 0/1, a row without token or with padding between tokens, or an
// answer at padding (in the padded frame given). `fn` leads the messages.
std::vector<int64_t> left_align_rows(PatchingInputs& in, const std::string& fn);
// The same checks on rows already left-aligned (a row starting with padding is refused).
void check_patching_padding(const PatchingInputs& in, const std::string& fn);

// Which token of a row corrupt_one_symbol replaces. Source: the answer's earlier occurrence (what
// an induction head copies, through its value input). Previous: the token just before that
// occurrence, when it is the token the answer follows (what an induction head's key matches,
// through the previous-token head); the answer's token itself stays.
enum class Corruption { Source, Previous };
Corruption parse_corruption(const std::string& name);  // "source" | "previous"
std::string to_string(Corruption c);

// From a task's held-out batch: in each row, one source symbol (unique in the row, and its copy
// counted exactly once among the targets) is replaced by a symbol the row does not use; the
// answer is the target position of that copy. For tasks whose rows repeat their prompt (copy,
// reverse, varcopy, induction); in rows without a prompt (tokens, text) the source is a symbol
// seen exactly once up to a later position whose target it is (e.g. the first copy of a repeat).
// `alphabet` = the symbols that may be used; rows with no such symbol are left out. Fails when no
// row qualifies. With Corruption::Previous the token before the source is replaced instead, in
// rows where it is the answer position's token and seen once before it (so the corrupted row
// has no earlier match for the answer's context); the corrupted answer is the replacement symbol.
PatchingInputs corrupt_one_symbol(const Batch& batch, int alphabet, uint64_t seed,
                                  Corruption corruption = Corruption::Source);

// Mean over answers of logits[row, pos, clean] - logits[row, pos, corrupted]: a one-element tensor,
// differentiable in the logits.
Tensor logit_difference(const Tensor& logits, const std::vector<PatchAnswer>& answers);
// A pass's logits over a chunk of rows where they are read: every position's, (rows, T, V), or
// some positions' alone (a patched run computes the answers' positions only).
struct PassLogits {
  Tensor every;                         // (rows, T, V), or undefined
  int64_t T = 0, V = 0;                 // positions per row, vocabulary
  std::map<int64_t, const float*> at;   // without `every`: row * T + pos -> its V logits
  std::vector<Tensor> keep;             // what `at` points into
  const float* row(int64_t r, int64_t pos) const;  // the V logits of the chunk's row r at pos
};
// logit_difference over a batch given in chunks of rows, in row order: the same float sum, bit for
// bit, as logit_difference of the whole batch's logits.
class LogitDifferenceSum {
 public:
  explicit LogitDifferenceSum(const std::vector<PatchAnswer>& answers);  // every answer of the batch (kept by reference)
  void add(const Tensor& logits, int64_t row0);  // logits (rows, T, V) of the batch's rows row0, row0 + 1, ...
  void add(const PassLogits& logits, int64_t row0);
  double value() const { return sum_; }
 private:
  const std::vector<PatchAnswer>* answers_;
  float w_, sum_ = 0.f;
};

struct PatchingResult {
  double clean_metric = 0, corrupted_metric = 0;  // logit differences (not normalised)
  HeadGrid z_exact, z_attribution;                // (layers, heads): hook_z of one head patched
  HeadGrid z_exact_ci95_lo, z_exact_ci95_hi;      // z_exact's 95% bootstrap interval over the answers
  HeadGrid resid_exact, resid_attribution;        // (layers, T): hook_resid_pre at one position patched
  double z_correlation = 0, resid_correlation = 0;  // Pearson, exact vs attribution
};
// Runs the clean and corrupted inputs, then the corrupted one with each head's hook_z (all
// positions) and each layer's hook_resid_pre at each position taken from the clean run; and one
// backward of the corrupted run for the attribution (clean - corrupted) . d metric / d activation.
// Bytes activation_patching needs for `rows` sequences of T tokens: one chunk's clean run's cache,
// corrupted run's with its gradients and forward pass (analysis/chunks.h), and what it keeps per row.
// Every pass runs over chunks of rows, checking for a stop between them.
// `progress`, if given, is called with (patched runs done, patched runs) after each one (a patch
// that changes nothing counts without running).
// A patched run computes only what can reach the answers: from the patched block on, from the
// first position the patch changes (the positions before it read from the corrupted run's keys
// and values) to the last answer's, and the logits at the answers' positions alone. Patched runs
// that start at the same block (a layer's heads, nearby positions of its residual sweep) go
// stacked as the rows of one forward (up to 4096 tokens and 256 MiB): their products run near the
// sgemm peak, where a run's few rows alone run far below it. Each run's values are its own to
// float32 rounding (the products take other row counts).
double patching_memory_bytes(const ModelConfig& cfg, int64_t rows, int64_t T);
PatchingResult activation_patching(TransformerLM& model, const PatchingInputs& in,
                                   const std::function<void(size_t, size_t)>& progress = {});

// Normalised metric with the whole activation `name` of the corrupted run replaced by the clean
// run's: (exact, attribution). Equal when the metric is linear in that activation (e.g.
// ln_final.hook_normalized, read out by the linear unembedding).
std::pair<double, double> patch_whole_activation(TransformerLM& model, const PatchingInputs& in, const std::string& name);

double pearson(const HeadGrid& a, const HeadGrid& b);

// ---- generic activation patching (TransformerLens's generic_activation_patch) ----------------

// The values of one patching sweep, indexed by its axes (row-major: the last axis varies fastest).
struct PatchGrid {
  std::vector<std::string> axes;  // e.g. {"layer", "head"}
  std::vector<int64_t> shape;     // their sizes, e.g. {n_layers, n_heads}
  std::vector<double> values;     // prod(shape) values
  std::vector<std::string> hooks; // per layer index (or the one hook): the full hook names patched
  double clean_metric = NAN, corrupted_metric = NAN;  // with the default metric: the unpatched runs'
  double at(const std::vector<int64_t>& index) const;
};
// A patched run's value from its logits (B, T, V) and its index (one entry per axis).
using PatchMetric = std::function<double(const Tensor& logits, const std::vector<int64_t>& index)>;

// The index axes a hook can be patched over: "layer" (a hook inside blocks, named without its
// "blocks.L." prefix: "hook_z", "attn.hook_z", "hook_resid_pre"), "head" (hooks with a head
// axis), "pos" (the position; the query's for hook_pattern and hook_attn_scores) and "src_pos"
// (the key's, for those two). A full name ("blocks.1.attn.hook_z", "ln_final.hook_normalized")
// takes no layer axis. Fails naming what is wrong.
// For every index over `axes`: the corrupted run with the clean run's activation written at that
// index (every other axis of the activation taken whole: all rows, all of d_head), scored by
// `metric`. The clean run is recorded once; each patched run gives the logits of every position
// (from the patched block on: forward_from). clean and corrupted must have one shape.
PatchGrid generic_activation_patch(TransformerLM& model, const Ids& clean, const Ids& corrupted, const std::string& hook,
                                   const std::vector<std::string>& axes, const PatchMetric& metric);
// The same with the metric of activation_patching: the restored fraction of the mean logit
// difference over in.answers, (m - m_corrupted) / (m_clean - m_corrupted). A patched run then
// computes only what reaches the answers (as activation_patching's, above).
PatchGrid generic_activation_patch(TransformerLM& model, const PatchingInputs& in, const std::string& hook,
                                   const std::vector<std::string>& axes);
// The axes patching over `hook` takes by default: layer (when named without it), then head if the
// hook has one, else pos.
std::vector<std::string> default_patch_axes(const ModelConfig& cfg, const std::string& hook);
// The same for a model's hook points: an attached SAE's hook_sae_acts_pre / acts_post (TransformerLM::add_sae)
// by "feature" (d_sae: a feature's clean activation written into the corrupted run; a feature
// equal in both runs, as most of a sparse SAE's are, is not run), its other points by "pos".
std::vector<std::string> default_patch_axes(const TransformerLM& model, const std::string& hook);

}  // namespace hl
