// Held-out evaluation on a task: loss, token accuracy and exact match teacher-forced, and (for
// tasks whose rows have prompts) exact match under greedy decoding with the KV cache.
#pragma once
#include <span>
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

// Runs with dropout off and no graph; `hooks` can ablate heads, patch or record.
EvalResult evaluate(TransformerLM& model, const Task& task, const std::vector<Batch>& data,
                    bool autoregressive, const Hooks* hooks = nullptr);

// Greedy decoding of the answers of the rows of a batch that have prompts (others: empty),
// grouped by prompt and answer length (KV cache).
std::vector<std::vector<int32_t>> greedy_answers(TransformerLM& model, const Batch& batch);
// The same over several batches at once (rows of one prompt and answer length decode together
// whichever batch they are in): answers[batch][row].
std::vector<std::vector<std::vector<int32_t>>> greedy_answers(TransformerLM& model, std::span<const Batch> data);

}  // namespace hl
