// Held-out evaluation on the copy task: loss, token accuracy and exact match teacher-forced,
// and exact match under greedy autoregressive decoding with the KV cache.
#pragma once
#include <vector>

#include "datasets/copy_task.h"
#include "models/transformer.h"

namespace hl {

struct EvalResult {
  double loss = 0;          // mean cross-entropy over counted targets
  double token_acc = 0;     // argmax == target over counted targets
  double exact_match = 0;   // rows with every counted target right (teacher-forced)
  double ar_exact_match = -1;  // greedy decoding from [BOS x SEP]; -1 = not measured
  int64_t tokens = 0, sequences = 0;
};

// Runs with dropout off and no graph; `hooks` can ablate heads, patch or record.
EvalResult evaluate(TransformerLM& model, const CopyTask& task, const std::vector<Batch>& data,
                    bool autoregressive, const Hooks* hooks = nullptr);

// Greedy decoding of the answers for the rows of a batch, grouped by length (KV cache).
std::vector<std::vector<int32_t>> greedy_answers(TransformerLM& model, const Batch& batch);

}  // namespace hl
