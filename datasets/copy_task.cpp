#include "datasets/copy_task.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace hl {

void TaskConfig::validate() const {
  if (name != "copy" && name != "reverse" && name != "varcopy")
    fail("task: unknown task '", name, "' (expected copy, reverse or varcopy)");
  if (alphabet < 1) fail("task: alphabet must be positive, got ", alphabet);
  if (min_len < 1) fail("task: length must be positive, got ", min_len);
  if (max_len < min_len) fail("task: max length ", max_len, " is below min length ", min_len);
}

TaskConfig TaskConfig::preset(const std::string& name) {
  TaskConfig c;
  c.name = name;
  if (name == "reverse") c.reverse = true;
  if (name == "varcopy") {
    c.alphabet = 64;
    c.min_len = 1;
    c.max_len = 16;
  }
  c.validate();
  return c;
}

std::string TaskConfig::to_json() const {
  return nlohmann::json{{"name", name}, {"alphabet", alphabet}, {"min_len", min_len}, {"max_len", max_len},
                        {"reverse", reverse}}
      .dump();
}

TaskConfig TaskConfig::from_json(const std::string& text, const std::string& source) {
  try {
    const nlohmann::json t = nlohmann::json::parse(text);
    TaskConfig c;
    c.name = t.at("name");
    c.alphabet = t.at("alphabet");
    c.min_len = t.at("min_len");
    c.max_len = t.at("max_len");
    c.reverse = t.at("reverse");
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": task description is unreadable (", e.what(), ")");
  }
}

CopyTask::CopyTask(const TaskConfig& cfg) : cfg_(cfg) { cfg_.validate(); }

int64_t Batch::counted_targets() const {
  int64_t n = 0;
  for (int32_t t : targets.data) n += t >= 0;
  return n;
}

void CopyTask::encode(Batch& b) const {
  const int64_t B = static_cast<int64_t>(b.symbols.size()), T = seq_len();
  b.inputs.shape = b.targets.shape = Shape{B, T};
  b.inputs.data.resize(static_cast<size_t>(B * T));
  b.targets.data.resize(static_cast<size_t>(B * T));
  b.lengths.resize(static_cast<size_t>(B));
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
    b.lengths[r] = n;
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

Batch CopyTask::sample(int batch_size, Rng& rng) const {
  Batch b;
  sample_into(b, batch_size, rng);
  return b;
}

std::vector<Batch> CopyTask::held_out(int n, uint64_t seed, int batch_size) const {
  Rng rng(seed);
  std::vector<Batch> out;
  for (int done = 0; done < n; done += batch_size) out.push_back(sample(std::min(batch_size, n - done), rng));
  return out;
}

std::vector<int32_t> CopyTask::answer(const Batch& b, int64_t row) const {
  std::vector<int32_t> y = b.symbols[row];
  if (cfg_.reverse) std::reverse(y.begin(), y.end());
  return y;
}

}  // namespace hl
