// The copy task and its variants, seeded and deterministic.
//
// A sequence is [BOS, x1..xn, SEP, y1..yn] padded with PAD to 2*max_len + 2 tokens, where
// y = x (copy) or y = reversed x (reverse). Symbols are 0..alphabet-1, then PAD, BOS, SEP.
// Input = all but the last token (T = 2*max_len + 1), targets = the next tokens, and only
// the n targets that are copied symbols count in the loss (the others are -1).
#pragma once
#include <string>
#include <vector>

#include "lib/ops.h"

namespace hl {

struct TaskConfig {
  std::string name = "copy";  // copy | reverse | varcopy (a preset: alphabet 64, n in 1..16)
  int alphabet = 10;
  int min_len = 16;  // n is uniform in [min_len, max_len]; equal = fixed length
  int max_len = 16;
  bool reverse = false;
  void validate() const;
  // Named presets; "varcopy" separates head counts (see issue 6 / README).
  static TaskConfig preset(const std::string& name);
  // As stored in checkpoints' "task" metadata.
  std::string to_json() const;
  static TaskConfig from_json(const std::string& text, const std::string& source);
};

struct Batch {
  Ids inputs;          // (B, T)
  Ids targets;         // (B, T), -1 = not in the loss
  Tensor key_padding;  // (B, T), 1 where the input is PAD; undefined when nothing is padded
  std::vector<int> lengths;                   // n per row
  std::vector<std::vector<int32_t>> symbols;  // x per row
  int64_t size() const { return inputs.shape[0]; }
  int64_t counted_targets() const;  // targets that count in the loss (not -1)
};

class CopyTask {
 public:
  explicit CopyTask(const TaskConfig& cfg);
  int pad() const { return cfg_.alphabet; }
  int bos() const { return cfg_.alphabet + 1; }
  int sep() const { return cfg_.alphabet + 2; }
  int vocab_size() const { return cfg_.alphabet + 3; }
  int seq_len() const { return 2 * cfg_.max_len + 1; }  // model input length T
  const TaskConfig& config() const { return cfg_; }

  Batch sample(int batch_size, Rng& rng) const;
  // The same draw into an existing batch, reusing its buffers: the training loop's steady
  // state allocates nothing.
  void sample_into(Batch& b, int batch_size, Rng& rng) const;
  Batch make(const std::vector<std::vector<int32_t>>& symbols) const;  // explicit sequences
  // The fixed held-out set: n sequences from their own seed, cut into batches.
  std::vector<Batch> held_out(int n, uint64_t seed, int batch_size) const;
  // The answer a model should produce for row i (y1..yn).
  std::vector<int32_t> answer(const Batch& b, int64_t row) const;

 private:
  void encode(Batch& b) const;  // inputs, targets, padding, lengths from b.symbols
  TaskConfig cfg_;
};

}  // namespace hl
