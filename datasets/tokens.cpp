// tokens: sequences a user wrote (from Python or anything) into a file:
//   .safetensors  input_ids (N, T) I32/I64; optional targets (N, T) I32/I64 (-1 = not in the
//                 loss) and loss_mask (N, T) F32/I32/I64 (0 = not in the loss)
//   .npy          input_ids (N, T) int32/int64 (little-endian, C order)
// Without targets a row is language modelling: position t predicts input t+1. The vocabulary is
// --alphabet, or the largest id + 1 when that is 0. Held out: --eval-data, or the last 10% of
// the rows. Training batches are rows drawn at random, or with --shuffle off consecutive rows
// in file order (wrapping around).
#include <algorithm>
#include <cstring>
#include <optional>

#include "datasets/task.h"
#include "models/padding.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"

namespace hl {

namespace {

struct Rows {
  int64_t n = 0, T = 0;
  std::vector<int32_t> ids, targets;  // (n, T)
  bool answers = false;  // targets or a loss mask were given (not plain next-token prediction)
  bool has_mask = false, has_targets = false;
};

// Token ids are 0 .. kMaxTokenId - 1 (a vocabulary of at most 2^24).
constexpr int32_t kMaxTokenId = 1 << 24;

// input_ids from a .npy file: version 1-3 header, '<i4' or '<i8', C order, 2-d.
Ids read_npy(const std::string& path) {
  const std::string bytes = read_file(path);
  auto bad = [&](auto&&... why) { fail(path, ": not a valid .npy file of input_ids: ", why...); };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) bad("the magic string \\x93NUMPY is missing");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, at;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad("truncated header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[8 + i]);
    at = 12;
  } else {
    bad("unsupported version ", major);
  }
  if (at + header_len > bytes.size()) bad("the header runs past the end of the file");
  const std::string header = bytes.substr(at, header_len);
  auto field = [&](const std::string& key) {
    const size_t k = header.find("'" + key + "'");
    if (k == std::string::npos) bad("the header has no '", key, "'");
    return header.substr(header.find(':', k) + 1);
  };
  const std::string descr = field("descr");
  const size_t q = descr.find('\'');
  const std::string dtype = descr.substr(q + 1, descr.find('\'', q + 1) - q - 1);
  size_t item;
  if (dtype == "<i4") item = 4;
  else if (dtype == "<i8") item = 8;
  else bad("dtype '", dtype, "' is not int32 or int64 (little-endian)");
  if (field("fortran_order").find("False") != 0 && field("fortran_order").find(" False") != 0) bad("Fortran order is not supported");
  const std::string sh = field("shape");
  // "(N, T)": whole non-negative numbers and commas only
  const size_t open = sh.find('('), close = sh.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open) bad("the shape is not a tuple: ", sh.substr(0, 40));
  std::vector<int64_t> dims;
  for (size_t i = open + 1; i < close;) {
    const char c = sh[i];
    if (c == ' ' || c == ',') {
      ++i;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      for (; i < close && std::isdigit(static_cast<unsigned char>(sh[i])); ++i)
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, sh[i] - '0', &v))
          bad("a dimension of the shape ", sh.substr(open, close - open + 1), " is too large");
      dims.push_back(v);
    } else {
      bad("the shape ", sh.substr(open, close - open + 1), " holds '", std::string(1, c), "': dimensions are whole numbers of 0 or more");
    }
  }
  if (dims.size() != 2) bad("input_ids must be (N, T), got ", dims.size(), " dimensions");
  uint64_t count = 0, need = 0;  // elements and bytes, checked for overflow
  if (__builtin_mul_overflow(static_cast<uint64_t>(dims[0]), static_cast<uint64_t>(dims[1]), &count) ||
      __builtin_mul_overflow(count, static_cast<uint64_t>(item), &need))
    bad("the shape (", dims[0], ", ", dims[1], ") has more elements than any file can hold");
  const size_t data = at + header_len;
  if (bytes.size() - data < need)
    bad("truncated: shape (", dims[0], ", ", dims[1], ") needs ", need, " bytes of data, the file has ", bytes.size() - data);
  Ids out(Shape{dims[0], dims[1]});
  for (uint64_t i = 0; i < count; ++i) {
    int64_t v;
    if (item == 8) {
      std::memcpy(&v, bytes.data() + data + 8 * i, 8);
    } else {
      int32_t w;
      std::memcpy(&w, bytes.data() + data + 4 * i, 4);
      v = w;
    }
    if (v < 0 || v >= kMaxTokenId) fail(path, ": input_ids value ", v, " at row ", i / dims[1], ", position ", i % dims[1], " is outside 0..", kMaxTokenId - 1);
    out.data[i] = static_cast<int32_t>(v);
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Rows with their targets (given, or next-token), loss mask applied; ids checked. `source`
// names the file (or the arrays) in messages.
Rows rows_from(const Ids& ids, const Ids& targets, const std::vector<float>& mask, const std::string& path) {
  Rows r;
  if (ids.shape.ndim != 2) fail(path, ": input_ids must be (N, T), got ", ids.shape.str());
  if (targets.numel() && targets.shape != ids.shape)
    fail(path, ": targets has shape ", targets.shape.str(), " but input_ids is ", ids.shape.str());
  if (!mask.empty() && static_cast<int64_t>(mask.size()) != ids.numel())
    fail(path, ": loss_mask has ", mask.size(), " values but input_ids is ", ids.shape.str());
  r.n = ids.shape[0];
  r.T = ids.shape[1];
  if (r.n < 1 || r.T < 1) fail(path, ": input_ids ", ids.shape.str(), " holds no tokens");
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (ids.data[i] < 0 || ids.data[i] >= kMaxTokenId)
      fail(path, ": input_ids has the id ", ids.data[i], " at row ", i / r.T, ", position ", i % r.T, ", outside 0..", kMaxTokenId - 1);
  r.ids = ids.data;
  r.answers = targets.numel() > 0 || !mask.empty();
  r.has_mask = !mask.empty();
  r.has_targets = targets.numel() > 0;
  if (targets.numel()) {
    r.targets = targets.data;
    for (int64_t i = 0; i < targets.numel(); ++i)
      if (r.targets[i] < -1 || r.targets[i] >= kMaxTokenId)
        fail(path, ": targets has ", r.targets[i], " at row ", i / r.T, ", position ", i % r.T, ", outside -1..", kMaxTokenId - 1,
             " (-1: no target)");
  } else {  // language modelling: position t predicts input t+1
    r.targets.assign(r.ids.size(), -1);
    for (int64_t row = 0; row < r.n; ++row)
      for (int64_t t = 0; t + 1 < r.T; ++t) r.targets[row * r.T + t] = r.ids[row * r.T + t + 1];
  }
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i] == 0.f) r.targets[i] = -1;
  return r;
}

// Fails unless some position of `r` has a target: a loss or a score over nothing is not 0.
void require_targets(const Rows& r, const std::string& path, const char* purpose) {
  for (int32_t t : r.targets)
    if (t >= 0) return;
  const std::string why = r.has_mask      ? "its loss_mask is 0 at every position that has a target"
                          : r.has_targets ? "every target is -1"
                          : r.T < 2       ? "sequences of " + std::to_string(r.T) + " token predict no next token"
                                          : "no position has a next token";
  fail(path, ": no position has a target (", why, "): nothing to ", purpose);
}

// One file's rows with their targets (given, or next-token), loss mask applied; ids checked.
Rows read_rows(const std::string& path) {
  Rows r;
  Ids ids, targets;
  std::vector<float> mask;
  if (ends_with(path, ".npy")) {
    ids = read_npy(path);
  } else {
    const SafetensorsFile f = read_safetensors(path);
    if (!f.has("input_ids")) fail(path, ": no 'input_ids' tensor (expected input_ids (N, T), optional targets and loss_mask)");
    for (const char* name : {"input_ids", "targets"})
      if (f.has(name) && f.get(name).dtype == DType::F32)
        fail(path, ": '", name, "' is F32; token ids must be I32 or I64");
    ids = f.ids("input_ids");
    if (ids.shape.ndim != 2) fail(path, ": input_ids must be (N, T), got ", ids.shape.str());
    if (f.has("targets")) {
      targets = f.ids("targets");
      if (targets.shape != ids.shape)
        fail(path, ": targets has shape ", targets.shape.str(), " but input_ids is ", ids.shape.str());
    }
    if (f.has("loss_mask")) {
      const StTensor& m = f.get("loss_mask");
      if (m.shape != ids.shape) fail(path, ": loss_mask has shape ", m.shape.str(), " but input_ids is ", ids.shape.str());
      if (m.dtype == DType::F32) {
        mask = f.f32("loss_mask").to_vector();
      } else {
        for (int32_t v : f.ids("loss_mask").data) mask.push_back(static_cast<float>(v));
      }
    }
  }
  return rows_from(ids, targets, mask, path);
}

// Rows `rows` of `src` into b, reusing its buffers (no padding: every position is a token).
void fill(Batch& b, const Rows& src, const std::vector<int64_t>& rows) {
  const int64_t B = static_cast<int64_t>(rows.size()), T = src.T;
  b.inputs.shape = b.targets.shape = Shape{B, T};
  b.inputs.data.resize(static_cast<size_t>(B * T));
  b.targets.data.resize(static_cast<size_t>(B * T));
  b.prompt_len.assign(static_cast<size_t>(B), 0);
  b.key_padding = Tensor();
  for (int64_t i = 0; i < B; ++i) {
    std::copy_n(src.ids.begin() + rows[i] * T, T, b.inputs.data.begin() + i * T);
    std::copy_n(src.targets.begin() + rows[i] * T, T, b.targets.data.begin() + i * T);
  }
}

class TokensTask : public Task {
 public:
  explicit TokensTask(const TaskConfig& cfg)
      : TokensTask(cfg, read_rows(cfg.data), cfg.eval_data.empty() ? std::optional<Rows>() : read_rows(cfg.eval_data)) {}
  TokensTask(const TaskConfig& cfg, Rows all, std::optional<Rows> eval) : Task(cfg) {
    if (eval) {
      train_ = std::move(all);
      eval_ = std::move(*eval);
      if (eval_.T != train_.T)
        fail(cfg.eval_data, ": sequences of ", eval_.T, " tokens, but ", cfg.data, " has ", train_.T);
    } else {
      if (all.n < 2) fail(cfg.data, ": ", all.n, " row is too few: the last 10% of the rows (at least one) are held out");
      const int64_t held = std::max<int64_t>(1, all.n / 10), kept = all.n - held;
      train_.n = kept, eval_.n = held, train_.T = eval_.T = all.T;
      train_.answers = eval_.answers = all.answers;
      train_.has_mask = eval_.has_mask = all.has_mask;
      train_.has_targets = eval_.has_targets = all.has_targets;
      train_.ids.assign(all.ids.begin(), all.ids.begin() + kept * all.T);
      train_.targets.assign(all.targets.begin(), all.targets.begin() + kept * all.T);
      eval_.ids.assign(all.ids.begin() + kept * all.T, all.ids.end());
      eval_.targets.assign(all.targets.begin() + kept * all.T, all.targets.end());
    }
    require_targets(train_, cfg.data + (eval ? "" : " (its first 90% of rows, for training)"), "learn");
    require_targets(eval_, eval ? cfg.eval_data : cfg.data + " (its last 10% of rows, held out)", "measure");
    int32_t top = 0;
    for (const Rows* r : {&train_, &eval_}) {
      for (int32_t v : r->ids) top = std::max(top, v);
      for (int32_t v : r->targets) top = std::max(top, v);
    }
    vocab_ = cfg.alphabet > 0 ? cfg.alphabet : top + 1;
    if (top >= vocab_)
      fail(cfg.alphabet > 0 ? "--alphabet " : "", cfg.alphabet > 0 ? std::to_string(cfg.alphabet) + ": " : "", cfg.data,
           " holds the id ", top, ", outside the vocabulary 0..", vocab_ - 1);
  }
  int vocab_size() const override { return vocab_; }
  int symbols() const override { return vocab_; }  // no special tokens
  int seq_len() const override { return static_cast<int>(train_.T); }
  bool rows_are_answers() const override { return eval_.answers; }  // what evaluation scores

  void sample_into(Batch& b, int batch_size, Rng& rng) const override {
    if (batch_size < 1) fail("task: batch size must be positive, got ", batch_size);
    std::vector<int64_t>& rows = rows_scratch_;
    rows.resize(static_cast<size_t>(batch_size));
    for (auto& r : rows) {
      if (cfg_.shuffle) {
        r = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(train_.n));
      } else {  // consecutive rows in file order (seek() places a resumed run)
        r = next_row_;
        next_row_ = (next_row_ + 1) % train_.n;
      }
    }
    fill(b, train_, rows);
  }

  std::vector<Batch> held_out(int n, uint64_t, int batch_size) const override {
    check_held_out_request(n, batch_size);
    std::vector<Batch> out;
    const int64_t count = std::min<int64_t>(n, eval_.n);
    for (int64_t done = 0; done < count; done += batch_size) {
      std::vector<int64_t> rows;
      for (int64_t r = done; r < std::min<int64_t>(count, done + batch_size); ++r) rows.push_back(r);
      out.emplace_back();
      fill(out.back(), eval_, rows);
    }
    return out;
  }

  void seek(int64_t batches_drawn, int batch_size) const override {
    next_row_ = static_cast<int64_t>((static_cast<uint64_t>(batches_drawn) * static_cast<uint64_t>(batch_size)) %
                                     static_cast<uint64_t>(train_.n));
  }

 private:
  Rows train_, eval_;
  int vocab_ = 0;
  mutable int64_t next_row_ = 0;
  mutable std::vector<int64_t> rows_scratch_;
};

TaskConfig tokens_preset() {
  TaskConfig c;
  c.alphabet = 0;  // the vocabulary from the data
  return c;
}

void validate_tokens(const TaskConfig& c) {
  if (c.data.empty()) fail("task tokens: give the data file with --data");
  if (c.alphabet < 0) fail("task tokens: --alphabet (vocabulary) must not be negative");
}

[[maybe_unused]] const bool kRegistered = register_task(
    {"tokens", "your sequences: --data FILE (.safetensors or .npy) with input_ids (N, T)", 40, tokens_preset(),
     validate_tokens, [](const TaskConfig& c) -> std::unique_ptr<Task> { return std::make_unique<TokensTask>(c); }});

// A left-padded batch's rows with their tokens moved to their first columns (the one rule of
// every analysis, models/padding.h): ids, targets, loss_mask and attention_mask turned together,
// prompt_len (given in the padded frame, as the ids) moved with its row. False, and nothing
// written, without a mask or when no row starts with padding.
bool left_align(const TokenArrays& a, const std::vector<int>& prompt_len, const std::string& source, TokenArrays& out,
                std::vector<int>& out_prompt_len) {
  if (a.attention_mask.empty()) return false;
  const int64_t N = a.input_ids.shape[0], T = a.input_ids.shape[1];
  if (static_cast<int64_t>(a.attention_mask.size()) != N * T)
    fail(source, ": attention_mask has ", a.attention_mask.size(), " values but input_ids is ", a.input_ids.shape.str());
  for (float m : a.attention_mask)
    if (m != 0.f && m != 1.f) fail(source, ": attention_mask: values are 1 (token) or 0 (padding), got ", m);
  std::vector<float> key_padding(a.attention_mask.size());
  std::transform(a.attention_mask.begin(), a.attention_mask.end(), key_padding.begin(), [](float m) { return 1.f - m; });
  const std::vector<int64_t> lead = leading_padding(key_padding, N, T, source + ": attention_mask");
  if (!any_shift(lead)) return false;
  out = a;
  rotate_rows_left(out.input_ids.data.data(), T, 1, lead);
  rotate_rows_left(out.attention_mask.data(), T, 1, lead);
  if (out.targets.numel() == N * T) rotate_rows_left(out.targets.data.data(), T, 1, lead);
  if (static_cast<int64_t>(out.loss_mask.size()) == N * T) rotate_rows_left(out.loss_mask.data(), T, 1, lead);
  out_prompt_len = prompt_len;
  if (static_cast<int64_t>(prompt_len.size()) == N)
    for (int64_t i = 0; i < N; ++i) {
      int& p = out_prompt_len[static_cast<size_t>(i)];
      if (p == 0) continue;
      if (p <= lead[static_cast<size_t>(i)] || p > T)
        fail(source, ": prompt_len ", p, " at row ", i, " is outside ", lead[static_cast<size_t>(i)] + 1, "..", T,
             " (the row's tokens, counted in the padded columns; 0: no answer)");
      p -= static_cast<int>(lead[static_cast<size_t>(i)]);
    }
  return true;
}

}  // namespace

std::unique_ptr<Task> make_tokens_task(const TaskConfig& cfg, const TokenArrays& train, const TokenArrays* eval) {
  cfg.validate();
  Rows rows = rows_from(train.input_ids, train.targets, train.loss_mask, cfg.data);
  std::optional<Rows> held;
  if (eval) held = rows_from(eval->input_ids, eval->targets, eval->loss_mask, cfg.eval_data);
  return std::make_unique<TokensTask>(cfg, std::move(rows), std::move(held));
}

std::vector<Batch> token_batches(const TokenArrays& given, int batch_size, const std::string& source,
                                 const std::vector<int>& given_prompt_len) {
  if (batch_size < 1) fail(source, ": batch_size must be positive, got ", batch_size);
  TokenArrays aligned;
  std::vector<int> aligned_prompt_len;
  const bool moved = left_align(given, given_prompt_len, source, aligned, aligned_prompt_len);
  const TokenArrays& a = moved ? aligned : given;
  const std::vector<int>& prompt_len = moved ? aligned_prompt_len : given_prompt_len;
  // a padded row counts only its tokens: position t counts where it is a token and, without
  // targets, where the token it predicts (t + 1) is one too
  const std::vector<float>& pad = a.attention_mask;
  std::vector<float> counted = a.loss_mask;
  if (!pad.empty()) {
    const int64_t N = a.input_ids.shape[0], T = a.input_ids.shape[1];
    if (counted.empty()) counted.assign(pad.size(), 1.f);
    const bool next_token = a.targets.numel() == 0;
    for (int64_t i = 0; i < N; ++i) {
      const float* m = pad.data() + i * T;
      for (int64_t t = 0; t < T; ++t) {
        const bool real = m[t] == 1.f && (!next_token || (t + 1 < T && m[t + 1] == 1.f));
        if (!real) counted[i * T + t] = 0.f;
      }
    }
  }
  const Rows r = rows_from(a.input_ids, a.targets, counted, source);
  require_targets(r, source, "measure");
  if (!prompt_len.empty()) {
    if (static_cast<int64_t>(prompt_len.size()) != r.n)
      fail(source, ": prompt_len has ", prompt_len.size(), " values but input_ids has ", r.n, " rows");
    for (size_t i = 0; i < prompt_len.size(); ++i)
      if (prompt_len[i] < 0 || prompt_len[i] > r.T)
        fail(source, ": prompt_len ", prompt_len[i], " at row ", i, " is outside 0..", r.T, " (0: no answer)");
  }
  std::vector<Batch> out;
  for (int64_t done = 0; done < r.n; done += batch_size) {
    std::vector<int64_t> rows;
    for (int64_t i = done; i < std::min<int64_t>(r.n, done + batch_size); ++i) rows.push_back(i);
    out.emplace_back();
    fill(out.back(), r, rows);
    if (!pad.empty()) {  // key_padding: 1 where the input is padding
      Batch& b = out.back();
      b.key_padding = Tensor::zeros({static_cast<int64_t>(rows.size()), r.T});
      for (size_t i = 0; i < rows.size(); ++i)
        for (int64_t t = 0; t < r.T; ++t) b.key_padding.data()[i * r.T + t] = 1.f - pad[rows[i] * r.T + t];
    }
    if (!prompt_len.empty())
      std::copy_n(prompt_len.begin() + done, rows.size(), out.back().prompt_len.begin());
  }
  return out;
}

}  // namespace hl
