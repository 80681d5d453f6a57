// induction: rows of random tokens in which a block of n random tokens (n uniform in
// [min_len, max_len]) is written twice in a row at a random offset; the loss counts the second
// copy's predictable tokens (r_2..r_n). No position tells where the first copy is, so the only
// way to predict the second is to find the earlier occurrence of the current token and copy what
// followed it: the setting where induction heads form (Olsson et al. 2022). Rows are 2 max_len + 8
// tokens (the longest block still has 9 offsets), tokens 0..alphabet-1, nothing padded, drawn
// fresh every batch. Its preset also sets the model and schedule under which a 2-layer
// attention-only model forms the previous-token -> induction circuit (docs/studies.md).
#include "datasets/task.h"

namespace hl {

namespace {

class InductionTask : public Task {
 public:
  explicit InductionTask(const TaskConfig& cfg) : Task(cfg) {}
  int vocab_size() const override { return cfg_.alphabet; }
  int seq_len() const override { return 2 * cfg_.max_len + 8; }

  void sample_into(Batch& b, int batch_size, Rng& rng) const override {
    if (batch_size < 1) fail("task: batch size must be positive, got ", batch_size);
    const int64_t B = batch_size, T = seq_len();
    b.inputs.shape = b.targets.shape = Shape{B, T};
    b.inputs.data.resize(static_cast<size_t>(B * T));
    b.targets.data.resize(static_cast<size_t>(B * T));
    b.prompt_len.resize(static_cast<size_t>(B));
    b.key_padding = Tensor();
    const auto symbol = [&] { return static_cast<int32_t>(rng.below(static_cast<uint32_t>(cfg_.alphabet))); };
    for (int64_t row = 0; row < B; ++row) {
      const int64_t n = cfg_.min_len + rng.below(static_cast<uint32_t>(cfg_.max_len - cfg_.min_len + 1));
      const int64_t start = rng.below(static_cast<uint32_t>(T - 2 * n + 1));  // the first copy: [start, start + n)
      int32_t* in = b.inputs.data.data() + row * T;
      int32_t* tg = b.targets.data.data() + row * T;
      for (int64_t t = 0; t < T; ++t) in[t] = symbol();
      for (int64_t t = 0; t < n; ++t) in[start + n + t] = in[start + t];
      // position t predicts token t + 1: the second copy's tokens after its first are predictable
      for (int64_t t = 0; t < T; ++t) tg[t] = t >= start + n && t < start + 2 * n - 1 ? in[t + 1] : -1;
      b.prompt_len[row] = static_cast<int>(start + n + 1);  // greedy from the second copy's first token
    }
  }
};

TaskConfig induction_preset() {
  TaskConfig c;
  c.alphabet = 32, c.min_len = 4, c.max_len = 12;  // rows of 32 tokens
  return c;
}

void validate_induction(const TaskConfig& c) {
  if (c.alphabet < 2) fail("task induction: --alphabet must be at least 2, got ", c.alphabet);
  if (c.min_len < 2) fail("task induction: --min-length (the shortest block) must be at least 2, got ", c.min_len);
  if (c.max_len < c.min_len)
    fail("task induction: --length (the longest block) ", c.max_len, " is below --min-length ", c.min_len);
}

[[maybe_unused]] const bool kRegistered = register_task(
    {"induction",
     "random tokens with a block of 4..12 tokens written twice in a row at a random place; loss on the second copy "
     "(2-layer attention-only model, 2 heads, 4000 steps: forms induction heads)",
     20, induction_preset(), validate_induction,
     [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<InductionTask>(c); },
     // the regime where the circuit forms (seeds 0-4, docs/studies.md)
     {{"--layers", "2"}, {"--heads", "2"}, {"--d-ff", "0"}, {"--lr", "0.001"}, {"--schedule", "constant"},
      {"--warmup", "200"}, {"--steps", "4000"}, {"--eval-every", "100"}}});

}  // namespace

}  // namespace hl
