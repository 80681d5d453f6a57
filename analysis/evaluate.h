// Held-out evaluation on a task: loss, token accuracy and exact match teacher-forced, and (for
// tasks whose rows have prompts) exact match under greedy decoding.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "datasets/task.h"
#include "models/transformer.h"

namespace hl {

struct EvalResult {
  double loss = 0;          // mean cross-entropy over counted targets
  double token_acc = 0;     // argmax == target over counted targets
  double exact_match = 0;   // rows with every counted target right (teacher-forced)
  double ar_exact_match = -1;  // greedy decoding from each row's prompt; -1 = not measured
  int64_t tokens = 0, sequences = 0;
};

// Buffers of forward_batch, reused from call to call (no allocation once they have grown).
struct BatchScratch {
  std::vector<int32_t> live_len;
  Ids output_rows, targets;
};

// The forward of a batch as training and evaluation run it. When the batch has positions after
// a row's last counted target (and no hooks): only each row's live positions are computed and
// the logits come back at the counted targets alone, (targets, V), with `targets` set to
// scratch.targets. Otherwise the plain forward, logits (B, T, V) and `targets` = &batch.targets.
Tensor forward_batch(TransformerLM& model, const Batch& batch, BatchScratch& scratch, const Ids*& targets,
                     const Hooks* hooks = nullptr);

// Runs with dropout off and no graph; `hooks` can ablate heads, patch or record.
// Greedy exact match needs no decoding for rows whose answer follows the prompt as the row's
// own inputs (every copy and induction row): greedy decoding then sees the teacher-forced
// inputs until its first wrong token, which the teacher-forced predictions show too, so the row
// is a greedy exact match exactly when it is a teacher-forced one. Other rows with prompts are
// decoded (KV cache, without `hooks`).
// With row_loss, each row's summed loss over its counted targets too (in double, in data's order),
// e.g. for intervals over examples.
// A row's answer is its counted targets (Task::answer), so the data alone is enough; the form
// with a task reads nothing from it.
EvalResult evaluate(TransformerLM& model, const std::vector<Batch>& data, bool autoregressive,
                    const Hooks* hooks = nullptr, std::vector<double>* row_loss = nullptr);
inline EvalResult evaluate(TransformerLM& model, const Task&, const std::vector<Batch>& data, bool autoregressive,
                           const Hooks* hooks = nullptr, std::vector<double>* row_loss = nullptr) {
  return evaluate(model, data, autoregressive, hooks, row_loss);
}

// Fails unless every input id and target of `data` is in the model's vocabulary and every row
// fits its max_seq_len, naming the first id (or length) that does not; `what` names the data.
void check_data_fits_model(const std::vector<Batch>& data, const ModelConfig& cfg, const std::string& what);

// Greedy decoding of the answers of the rows of a batch that have prompts (others: empty),
// grouped by prompt and answer length (KV cache).
std::vector<std::vector<int32_t>> greedy_answers(TransformerLM& model, const Batch& batch);
// The same over several batches at once (rows of one prompt and answer length decode together
// whichever batch they are in): answers[batch][row].
std::vector<std::vector<std::vector<int32_t>>> greedy_answers(TransformerLM& model, std::span<const Batch> data);

// Continues each row of `prompt` (B, T) by max_new_tokens tokens, KV-cached: temperature 0 takes
// the most likely token (the first on ties), > 0 samples from softmax(logits / temperature) with
// an Rng seeded by `seed` (the same seed, the same tokens). Returns (B, T + max_new_tokens).
// Fails, naming the lengths, when the result would not fit the model's max_seq_len.
// key_padding (B, T), non-zero = padding: prompts of different lengths, padded on the left (every
// row's last column real, so the new tokens follow each prompt); positions count real tokens.
Ids generate(TransformerLM& model, const Ids& prompt, int64_t max_new_tokens, double temperature, uint64_t seed,
             const Tensor& key_padding = Tensor());

}  // namespace hl
