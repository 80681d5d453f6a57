// induction: [BOS, r1..rn, r1..rn] with r uniform random tokens; the loss counts the repeated
// half, which a model can only predict by finding the earlier occurrence of the current token
// and copying what followed it: the setting where induction heads form in 2-layer models
// (Olsson et al. 2022). Tokens 0..alphabet-1, BOS = alphabet; input T = 2n.
#include "datasets/task.h"

namespace hl {

namespace {

class InductionTask : public Task {
 public:
  explicit InductionTask(const TaskConfig& cfg) : Task(cfg) {}
  int bos() const { return cfg_.alphabet; }
  int vocab_size() const override { return cfg_.alphabet + 1; }
  int seq_len() const override { return 2 * cfg_.max_len; }
  std::string token_text(int32_t id) const override { return id == bos() ? "BOS" : std::to_string(id); }

  void sample_into(Batch& b, int batch_size, Rng& rng) const override {
    if (batch_size < 1) fail("task: batch size must be positive, got ", batch_size);
    const int64_t B = batch_size, n = cfg_.max_len, T = seq_len();
    b.inputs.shape = b.targets.shape = Shape{B, T};
    b.inputs.data.resize(static_cast<size_t>(B * T));
    b.targets.data.resize(static_cast<size_t>(B * T));
    b.prompt_len.assign(static_cast<size_t>(B), static_cast<int>(n + 1));  // [BOS, r], then r again
    b.key_padding = Tensor();
    for (int64_t row = 0; row < B; ++row) {
      int32_t* in = b.inputs.data.data() + row * T;
      int32_t* tg = b.targets.data.data() + row * T;
      in[0] = bos();
      for (int64_t i = 1; i <= n; ++i) in[i] = static_cast<int32_t>(rng.below(static_cast<uint32_t>(cfg_.alphabet)));
      for (int64_t i = n + 1; i < T; ++i) in[i] = in[i - n];
      // position t predicts token t+1 of [BOS, r, r]; the repeated half counts
      for (int64_t t = 0; t < T; ++t) tg[t] = t >= n ? in[(t + 1 - n - 1) % n + 1] : -1;
    }
  }
};

}  // namespace

std::unique_ptr<Task> make_induction_task(const TaskConfig& cfg) { return std::make_unique<InductionTask>(cfg); }

}  // namespace hl
