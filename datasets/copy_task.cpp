#include "datasets/copy_task.h"

#include <algorithm>

namespace hl {

CopyTask::CopyTask(const TaskConfig& cfg) : Task(cfg) { cfg_.validate(); }

void CopyTask::encode(Batch& b) const {
  const int64_t B = static_cast<int64_t>(b.symbols.size()), T = seq_len();
  b.inputs.shape = b.targets.shape = Shape{B, T};
  b.inputs.data.resize(static_cast<size_t>(B * T));
  b.targets.data.resize(static_cast<size_t>(B * T));
  b.prompt_len.resize(static_cast<size_t>(B));
  bool any_pad = false;
  for (int64_t r = 0; r < B; ++r) {
    const auto& x = b.symbols[r];
    const int n = static_cast<int>(x.size());
    if (n < 1 || n > cfg_.max_len) fail("task: sequence length ", n, " outside 1..", cfg_.max_len);
    for (int32_t s : x)
      if (s < 0 || s >= cfg_.alphabet) fail("task: symbol ", s, " outside the alphabet 0..", cfg_.alphabet - 1);
    // token t of [BOS, x1..xn, SEP, y1..yn, PAD...] (y = x, or x reversed)
    auto token = [&](int64_t t) -> int32_t {
      if (t == 0) return bos();
      if (t <= n) return x[t - 1];
      if (t == n + 1) return sep();
      if (t < 2 * n + 2) return cfg_.reverse ? x[2 * n + 1 - t] : x[t - n - 2];
      return pad();
    };
    for (int64_t t = 0; t < T; ++t) {
      b.inputs.at(r, t) = token(t);
      // input position t predicts token t+1; it counts when that is a copied symbol
      b.targets.at(r, t) = (t + 1 >= n + 2 && t + 1 < 2 * n + 2) ? token(t + 1) : -1;
      any_pad = any_pad || b.inputs.at(r, t) == pad();
    }
    b.prompt_len[r] = n + 2;  // [BOS, x, SEP], then the answer y
  }
  b.key_padding = Tensor();
  if (any_pad) {
    b.key_padding = Tensor::zeros({B, T});
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t)
        if (b.inputs.at(r, t) == pad()) b.key_padding.at({r, t}) = 1.f;
  }
}

Batch CopyTask::make(const std::vector<std::vector<int32_t>>& symbols) const {
  Batch b;
  b.symbols = symbols;
  encode(b);
  return b;
}

void CopyTask::sample_into(Batch& b, int batch_size, Rng& rng) const {
  if (batch_size < 1) fail("task: batch size must be positive, got ", batch_size);
  b.symbols.resize(static_cast<size_t>(batch_size));  // inner vectors keep their capacity
  for (auto& x : b.symbols) {
    const int n = cfg_.min_len + static_cast<int>(rng.below(static_cast<uint32_t>(cfg_.max_len - cfg_.min_len + 1)));
    x.resize(n);
    for (auto& s : x) s = static_cast<int32_t>(rng.below(static_cast<uint32_t>(cfg_.alphabet)));
  }
  encode(b);
}

std::string CopyTask::token_text(int32_t id) const {
  if (id == pad()) return "PAD";
  if (id == bos()) return "BOS";
  if (id == sep()) return "SEP";
  return std::to_string(id);
}

namespace {

// n symbols of an alphabet, n uniform in [min_len, max_len]
void validate_copy(const TaskConfig& c) {
  if (c.alphabet < 1) fail("task: alphabet must be positive, got ", c.alphabet);
  if (c.min_len < 1) fail("task: length must be positive, got ", c.min_len);
  if (c.max_len < c.min_len) fail("task: max length ", c.max_len, " is below min length ", c.min_len);
}
std::unique_ptr<Task> make_copy(const TaskConfig& c) { return std::make_unique<CopyTask>(c); }
TaskConfig copy_preset(int alphabet, int min_len, int max_len, bool reverse) {
  TaskConfig c;
  c.alphabet = alphabet, c.min_len = min_len, c.max_len = max_len, c.reverse = reverse;
  return c;
}

[[maybe_unused]] const bool kCopy = register_task({"copy", "[BOS x SEP x]: copy n symbols (alphabet 10, n = 16)", 10,
                                                   copy_preset(10, 16, 16, false), validate_copy, make_copy});
[[maybe_unused]] const bool kReverse = register_task({"reverse", "[BOS x SEP reversed x] (alphabet 10, n = 16)", 11,
                                                      copy_preset(10, 16, 16, true), validate_copy, make_copy});
[[maybe_unused]] const bool kVarcopy = register_task(
    {"varcopy", "copy with n uniform in 1..16, alphabet 64 (padded): separates head counts", 12,
     copy_preset(64, 1, 16, false), validate_copy, make_copy});

}  // namespace

}  // namespace hl
