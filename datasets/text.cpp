// text: language modelling on any file: on its bytes 0..255 (UTF-8 text or anything), or with
// --tokenizer on its BPE tokens (GPT-2's files or a tokenizer.json) (the file must be UTF-8; the vocabulary is the
// tokenizer's). The model sees windows of --length tokens and predicts each next one; training
// windows start anywhere in the first 90% of the tokens, held-out windows in the last 10%.
#include <cctype>
#include <cstdio>

#include "datasets/tokenizer.h"
#include "datasets/task.h"
#include "lib/fileutil.h"

namespace hl {

std::string byte_token_text(int32_t id) {
  if (id == '\n') return "\\n";
  if (id == '\t') return "\\t";
  if (id >= 32 && id < 127) return std::string(1, static_cast<char>(id));
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", id & 0xff);
  return buf;
}

namespace {

class TextTask : public Task {
 public:
  explicit TextTask(const TaskConfig& cfg) : Task(cfg), bytes_(read_file(cfg.data)) {
    if (!cfg.tokenizer.empty()) {  // BPE tokens instead of bytes
      tokenizer_ = load_tokenizer(cfg.tokenizer);  // tokenizer.json or GPT-2's files
      ids_ = tokenizer_->encode(bytes_, cfg.data);
      bytes_ = std::string();
    }
    const size_t n = size();
    split_ = n - n / 10;  // held out: the last 10%
    const size_t need = static_cast<size_t>(cfg.max_len) + 1;
    const char* unit = tokenizer_ ? " tokens" : " bytes";
    if (split_ < need || n - split_ < need)
      fail(cfg.data, ": ", n, unit, " are too few for --length ", cfg.max_len,
           " (each of the training 90% and the held-out 10% needs at least ", need, unit, ")");
  }
  int vocab_size() const override { return tokenizer_ ? tokenizer_->vocab_size() : 256; }
  int symbols() const override { return vocab_size(); }
  int seq_len() const override { return cfg_.max_len; }

  std::string token_text(int32_t id) const override {
    if (!tokenizer_) return byte_token_text(id);
    return tokenizer_->has_id(id) ? tokenizer_->token_text(id) : std::to_string(id);
  }
  bool rows_are_answers() const override { return false; }

  void sample_into(Batch& b, int batch_size, Rng& rng) const override { windows(b, batch_size, rng, 0, split_); }

  std::vector<Batch> held_out(int n, uint64_t seed, int batch_size) const override {
    check_held_out_request(n, batch_size);
    Rng rng(seed);
    std::vector<Batch> out;
    for (int done = 0; done < n; done += batch_size) {
      out.emplace_back();
      windows(out.back(), std::min(batch_size, n - done), rng, split_, size());
    }
    return out;
  }

 private:
  // batch_size windows of T + 1 bytes starting uniformly in [begin, end - T - 1]
  void windows(Batch& b, int batch_size, Rng& rng, size_t begin, size_t end) const {
    if (batch_size < 1) fail("task: batch size must be positive, got ", batch_size);
    const int64_t B = batch_size, T = seq_len();
    b.inputs.shape = b.targets.shape = Shape{B, T};
    b.inputs.data.resize(static_cast<size_t>(B * T));
    b.targets.data.resize(static_cast<size_t>(B * T));
    b.prompt_len.assign(static_cast<size_t>(B), 0);  // no greedy answers: every position counts
    b.key_padding = Tensor();
    const uint64_t starts = end - begin - static_cast<uint64_t>(T);
    for (int64_t r = 0; r < B; ++r) {
      const size_t s = begin + static_cast<size_t>(rng.next_u64() % starts);
      for (int64_t t = 0; t < T; ++t) {
        b.inputs.at(r, t) = at(s + t);
        b.targets.at(r, t) = at(s + t + 1);
      }
    }
  }
  size_t size() const { return tokenizer_ ? ids_.size() : bytes_.size(); }
  int32_t at(size_t i) const { return tokenizer_ ? ids_[i] : static_cast<unsigned char>(bytes_[i]); }
  std::string bytes_;                       // the file (bytes)
  std::shared_ptr<const Tokenizer> tokenizer_;  // with --tokenizer: the file's tokens in ids_
  std::vector<int32_t> ids_;
  size_t split_;
};

TaskConfig text_preset() {
  TaskConfig c;
  c.alphabet = 256, c.min_len = c.max_len = 64;
  return c;
}

void validate_text(const TaskConfig& c) {
  if (c.max_len < 1) fail("task text: --length (context) must be positive, got ", c.max_len);
  if (c.data.empty()) fail("task text: give the data file with --data");
}

[[maybe_unused]] const bool kRegistered = register_task(
    {"text", "language modelling on --data FILE, its bytes or with --tokenizer DIR GPT-2's tokens (held out: its last 10%)", 30, text_preset(), validate_text,
     [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<TextTask>(c); }});

}  // namespace

}  // namespace hl
