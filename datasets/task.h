// Tasks: what a model is trained and evaluated on. One interface (fill a reused batch, a
// seeded held-out set, vocabulary and special tokens, decoding for display, which positions
// are answers for greedy evaluation) and a registry that feeds --task, Python and the docs.
// Each task is one file that registers itself (register_task, below):
//
//   copy_task.cpp   copy, reverse, varcopy: [BOS, x1..xn, SEP, y1..yn] with y = x or reversed
//   induction.cpp   induction: [BOS, r1..rn, r1..rn], random tokens repeated; loss on the repeat
//   text.cpp        text: language modelling on a UTF-8 file (--data), on bytes or BPE tokens
//   tokens.cpp      tokens: sequences a user wrote into a safetensors or .npy file (--data)
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/ops.h"

namespace hl {

// The settings of every task: each task reads the fields its file documents and validates.
struct TaskConfig {
  std::string name = "copy";  // a registered task (task_registry())
  int alphabet = 10;          // symbols (copy family, induction); tokens: vocabulary, 0 = from the data
  int min_len = 16;           // copy family: n is uniform in [min_len, max_len]
  int max_len = 16;           // copy family: longest n; induction: repeated length; text: context
  bool reverse = false;       // copy family: y = reversed x
  std::string data;           // text: a UTF-8 file; tokens: .safetensors or .npy
  std::string eval_data;      // tokens: held-out file (default: the last 10% of the rows)
  std::string tokenizer;      // text: a GPT-2 tokenizer directory (BPE tokens); empty = bytes
  bool shuffle = true;        // tokens: false = training batches are consecutive rows in file order
  void validate() const;
  // data, eval_data and tokenizer as absolute paths (a run read from another directory finds its data);
  // names in parentheses (arrays given from Python) stay as they are.
  void make_paths_absolute();
  // The task's own defaults (e.g. varcopy: alphabet 64, n in 1..16; induction: 32 tokens).
  static TaskConfig preset(const std::string& name);
  std::string to_json() const;  // as stored in checkpoints' "task" metadata
  static TaskConfig from_json(const std::string& text, const std::string& source);
};

struct Batch {
  Ids inputs;          // (B, T)
  Ids targets;         // (B, T), -1 = not in the loss
  Tensor key_padding;  // (B, T), 1 where the input is padding; undefined when nothing is padded
  // Per row: how many input tokens form the prompt of a greedy answer (the answer is the row's
  // counted targets, in order, predicted from position prompt_len - 1 on); 0 = no answer.
  std::vector<int> prompt_len;
  std::vector<std::vector<int32_t>> symbols;  // scratch of the copy tasks (x per row)
  int64_t size() const { return inputs.shape[0]; }
  // Row r's tokens: its first n columns. Padded rows are left-aligned (the padding after the
  // tokens, models/padding.h; token_batches aligns them), so n is T less the trailing padding.
  int64_t row_tokens(int64_t r) const;
  int64_t counted_targets() const;  // targets that count in the loss (not -1)
  // Per row, the positions up to and including its last counted target: all that a loss or an
  // accuracy reads, and all a causal model needs (TransformerLM's ForwardOptions::live_len).
  // Of those positions packed row after row, the ones with a counted target (output_rows) and
  // their targets in the same order (the rows of the model's logits with output_rows).
  // Reuses the buffers. False when every position counts or none does (then the plain forward
  // is the one to use; only len is filled).
  bool live_positions(std::vector<int32_t>& len, Ids& output_rows, Ids& targets) const;
  // Rows [lo, hi) into `out`, reusing its buffers (a rank's share of a data-parallel batch).
  void rows_into(int64_t lo, int64_t hi, Batch& out) const;
};

class Task {
 public:
  explicit Task(TaskConfig cfg) : cfg_(std::move(cfg)) {}
  virtual ~Task() = default;
  const TaskConfig& config() const { return cfg_; }
  virtual int vocab_size() const = 0;
  // Ids 0..n-1 are ordinary symbols (BOS, SEP and PAD come after them): what a corruption may use.
  virtual int symbols() const { return cfg_.alphabet; }
  virtual int seq_len() const = 0;  // model input length T
  // A training batch drawn with rng into b, reusing its buffers (the training loop's steady
  // state allocates nothing).
  virtual void sample_into(Batch& b, int batch_size, Rng& rng) const = 0;
  // The fixed held-out set: n sequences from their own seed, cut into batches.
  virtual std::vector<Batch> held_out(int n, uint64_t seed, int batch_size) const;
  // What every held_out() checks first: n >= 1 sequences in batches of batch_size >= 1.
  static void check_held_out_request(int n, int batch_size);
  virtual std::string token_text(int32_t id) const;  // for display: "BOS", "7", "e", "\n"
  // Whether a row's counted targets form one answer, so "every target of the row right" (exact
  // match) means something: true for the generated tasks and for token files with targets or a
  // loss mask; false for language modelling (text, token files of input_ids alone).
  virtual bool rows_are_answers() const { return true; }
  // The answer a model should produce greedily for row `row`: its counted targets in order.
  // (The batch alone decides it, so it needs no task.)
  static std::vector<int32_t> answer(const Batch& b, int64_t row);
  Batch sample(int batch_size, Rng& rng) const;
  // Puts a task that reads its data in order where it would be after `batches_drawn` batches
  // (a resumed run continues where it stopped); random tasks need nothing.
  virtual void seek(int64_t batches_drawn, int batch_size) const {}

 protected:
  TaskConfig cfg_;
};

// Builds the task a config names (after validating it); fails listing the known tasks.
std::unique_ptr<Task> make_task(const TaskConfig& cfg);

// The `tokens` task from sequences in memory (e.g. NumPy arrays from Python) instead of a file:
// input_ids (N, T); targets (N, T) or empty for next-token targets; loss_mask N*T values or
// empty. `eval` null = the last 10% of the rows. cfg.data and cfg.eval_data name the arrays in
// messages; the same checks as for files apply.
struct TokenArrays {
  Ids input_ids, targets;
  std::vector<float> loss_mask;
  // (N, T) 1 = token, 0 = padding on either side of the row's tokens (TransformerLens's attention_mask), or
  // empty: none. Held-out batches only (token_batches): padding is never attended to or counted.
  std::vector<float> attention_mask;
};
std::unique_ptr<Task> make_tokens_task(const TaskConfig& cfg, const TokenArrays& train, const TokenArrays* eval);
// The same sequences as held-out data for an analysis, by the same rule (targets given, or
// position t predicting input t+1; loss_mask 0 = not counted): batches of batch_size rows in
// order, no padding unless attention_mask pads rows; a left-padded row's tokens are moved to its
// first columns (models/padding.h: the analyses' forwards number positions from column 0), its
// prompt_len, given in the padded columns, with them; padding between tokens is refused.
// prompt_len: per row, the prompt of a greedy answer (empty: 0 = no answer).
// Fails naming `source` when no position counts.
std::vector<Batch> token_batches(const TokenArrays& a, int batch_size, const std::string& source,
                                 const std::vector<int>& prompt_len = {});

// How the text task shows a byte: printable ASCII as itself, "\\n", "\\t", else "\\x1f".
std::string byte_token_text(int32_t id);

// The first n rows of batches as sequences, each without its trailing padding (key_padding).
std::vector<std::vector<int32_t>> unpadded_rows(const std::vector<Batch>& data, int64_t n);

// What a task's file registers, at namespace scope:
//   [[maybe_unused]] const bool kRegistered = register_task({"mine", "one line of help", 50, preset, validate, make});
// The library is linked whole (CMake's WHOLE_ARCHIVE), so every file's registration runs.
struct TaskInfo {
  std::string name;
  std::string help;  // one line for --task's help
  int order = 0;     // place in lists (--task's help and choices, messages)
  TaskConfig preset;  // the task's defaults (its name is filled in)
  std::function<void(const TaskConfig&)> validate;  // the task's own checks, after the common ones
  std::function<std::unique_ptr<Task>(const TaskConfig&)> make;
  // Training settings the task needs to be learned as intended (e.g. induction's model and
  // schedule), as flag -> value; each applies when that flag is not given.
  std::vector<std::pair<std::string, std::string>> train_defaults = {};
};
const TaskInfo* find_task(const std::string& name);  // null for an unknown name
bool register_task(TaskInfo info);  // true; fails for a name registered twice
const std::vector<TaskInfo>& task_registry();  // in `order`
std::vector<std::string> task_names();

}  // namespace hl
