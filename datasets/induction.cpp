// induction: [BOS, r1..rn, r1..rn] with r uniform random tokens; the loss counts the repeated
// half, which a model can only predict by finding the earlier occurrence of the current token
// and copying what followed it: the setting where induction heads form in 2-layer models
// (Olsson et al. 2022). Tokens 0..alphabet-1, BOS = alphabet; input T = 2n. With --min-length
// below --length, n varies per row (PAD = alphabet + 1 fills the rest of the 2 * length inputs).
#include "datasets/task.h"

namespace hl {

namespace {

class InductionTask : public Task {
 public:
  explicit InductionTask(const TaskConfig& cfg) : Task(cfg) {}
  bool variable() const { return cfg_.min_len < cfg_.max_len; }
  int bos() const { return cfg_.alphabet; }
  int pad() const { return cfg_.alphabet + 1; }  // only with variable lengths
  int vocab_size() const override { return cfg_.alphabet + (variable() ? 2 : 1); }
  int seq_len() const override { return 2 * cfg_.max_len; }
  std::string token_text(int32_t id) const override {
    return id == bos() ? "BOS" : variable() && id == pad() ? "PAD" : std::to_string(id);
  }

  void sample_into(Batch& b, int batch_size, Rng& rng) const override {
    if (batch_size < 1) fail("task: batch size must be positive, got ", batch_size);
    const int64_t B = batch_size, T = seq_len();
    b.inputs.shape = b.targets.shape = Shape{B, T};
    b.inputs.data.resize(static_cast<size_t>(B * T));
    b.targets.data.resize(static_cast<size_t>(B * T));
    b.prompt_len.resize(static_cast<size_t>(B));
    b.key_padding = variable() ? Tensor::zeros({B, T}) : Tensor();
    for (int64_t row = 0; row < B; ++row) {
      // n varies per row only with --min-length below --length: then the offset between the
      // copies varies too, and position alone cannot find the earlier occurrence
      const int64_t n = variable() ? cfg_.min_len + rng.below(static_cast<uint32_t>(cfg_.max_len - cfg_.min_len + 1)) : cfg_.max_len;
      int32_t* in = b.inputs.data.data() + row * T;
      int32_t* tg = b.targets.data.data() + row * T;
      b.prompt_len[row] = static_cast<int>(n + 1);  // [BOS, r], then r again
      in[0] = bos();
      for (int64_t i = 1; i <= n; ++i) in[i] = static_cast<int32_t>(rng.below(static_cast<uint32_t>(cfg_.alphabet)));
      for (int64_t i = n + 1; i < 2 * n; ++i) in[i] = in[i - n];
      // position t predicts token t+1 of [BOS, r, r]; the repeated half counts
      for (int64_t t = 0; t < 2 * n; ++t) tg[t] = t >= n ? in[t + 1 - n] : -1;
      for (int64_t t = 2 * n; t < T; ++t) {
        in[t] = pad();
        tg[t] = -1;
        b.key_padding.at({row, t}) = 1.f;
      }
    }
  }
};

TaskConfig induction_preset() {
  TaskConfig c;
  c.alphabet = 32, c.min_len = c.max_len = 16;
  return c;
}

void validate_induction(const TaskConfig& c) {
  if (c.alphabet < 2) fail("task induction: --alphabet must be at least 2, got ", c.alphabet);
  if (c.max_len < 2) fail("task induction: --length (tokens repeated) must be at least 2, got ", c.max_len);
}

[[maybe_unused]] const bool kRegistered = register_task(
    {"induction", "[BOS r r]: n = 16 random tokens of 32 repeated; loss on the repeat", 20, induction_preset(),
     validate_induction, [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<InductionTask>(c); }});

}  // namespace

}  // namespace hl
