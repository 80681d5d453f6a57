// The copy task and its variants (copy, reverse, varcopy), seeded and deterministic.
//
// A sequence is [BOS, x1..xn, SEP, y1..yn] padded with PAD to 2*max_len + 2 tokens, where
// y = x (copy) or y = reversed x (reverse). Symbols are 0..alphabet-1, then PAD, BOS, SEP.
// Input = all but the last token (T = 2*max_len + 1), targets = the next tokens, and only
// the n targets that are copied symbols count in the loss (the others are -1).
#pragma once
#include "datasets/task.h"

namespace hl {

class CopyTask : public Task {
 public:
  explicit CopyTask(const TaskConfig& cfg);
  int pad() const { return cfg_.alphabet; }
  int bos() const { return cfg_.alphabet + 1; }
  int sep() const { return cfg_.alphabet + 2; }
  int vocab_size() const override { return cfg_.alphabet + 3; }
  int seq_len() const override { return 2 * cfg_.max_len + 1; }
  void sample_into(Batch& b, int batch_size, Rng& rng) const override;
  std::string token_text(int32_t id) const override;
  Batch make(const std::vector<std::vector<int32_t>>& symbols) const;  // explicit sequences

 private:
  void encode(Batch& b) const;  // inputs, targets, padding, prompt lengths from b.symbols
};

}  // namespace hl
