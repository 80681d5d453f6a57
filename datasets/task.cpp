#include "datasets/task.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "datasets/copy_task.h"

namespace hl {

// Defined in datasets/induction.cpp, text.cpp and tokens.cpp.
std::unique_ptr<Task> make_induction_task(const TaskConfig& cfg);
std::unique_ptr<Task> make_text_task(const TaskConfig& cfg);
std::unique_ptr<Task> make_tokens_task(const TaskConfig& cfg);

const std::vector<TaskInfo>& task_registry() {
  static const std::vector<TaskInfo> tasks = {
      {"copy", "[BOS x SEP x]: copy n symbols (alphabet 10, n = 16)"},
      {"reverse", "[BOS x SEP reversed x] (alphabet 10, n = 16)"},
      {"varcopy", "copy with n uniform in 1..16, alphabet 64 (padded): separates head counts"},
      {"induction", "[BOS r r]: n = 16 random tokens of 32 repeated; loss on the repeat"},
      {"text", "byte-level language modelling on --data FILE (held out: its last 10%)"},
      {"tokens", "your sequences: --data FILE (.safetensors or .npy) with input_ids (N, T)"}};
  return tasks;
}

std::vector<std::string> task_names() {
  std::vector<std::string> n;
  for (const TaskInfo& t : task_registry()) n.push_back(t.name);
  return n;
}

namespace {
bool is_copy_family(const std::string& name) { return name == "copy" || name == "reverse" || name == "varcopy"; }
}  // namespace

void TaskConfig::validate() const {
  const auto names = task_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string list;
    for (auto& n : names) list += (list.empty() ? "" : ", ") + n;
    fail("task: unknown task '", name, "' (expected one of ", list, ")");
  }
  if (is_copy_family(name)) {
    if (alphabet < 1) fail("task: alphabet must be positive, got ", alphabet);
    if (min_len < 1) fail("task: length must be positive, got ", min_len);
    if (max_len < min_len) fail("task: max length ", max_len, " is below min length ", min_len);
  }
  if (name == "induction") {
    if (alphabet < 2) fail("task induction: --alphabet must be at least 2, got ", alphabet);
    if (max_len < 2) fail("task induction: --length (tokens repeated) must be at least 2, got ", max_len);
  }
  if (name == "text" && max_len < 1) fail("task text: --length (context) must be positive, got ", max_len);
  if ((name == "text" || name == "tokens") && data.empty()) fail("task ", name, ": give the data file with --data");
  if (name == "tokens" && alphabet < 0) fail("task tokens: --alphabet (vocabulary) must not be negative");
  if (alphabet > (1 << 24)) fail("task: alphabet ", alphabet, " is above the supported maximum ", 1 << 24);
  if (max_len > (1 << 19)) fail("task: length ", max_len, " is above the supported maximum ", 1 << 19);
}

TaskConfig TaskConfig::preset(const std::string& name) {
  TaskConfig c;
  c.name = name;
  if (name == "reverse") c.reverse = true;
  if (name == "varcopy") c.alphabet = 64, c.min_len = 1, c.max_len = 16;
  if (name == "induction") c.alphabet = 32, c.min_len = c.max_len = 16;
  if (name == "text") c.alphabet = 256, c.min_len = c.max_len = 64;
  if (name == "tokens") c.alphabet = 0;
  return c;
}

std::string TaskConfig::to_json() const {
  nlohmann::json j = {{"name", name}, {"alphabet", alphabet}, {"min_len", min_len}, {"max_len", max_len}, {"reverse", reverse}};
  if (!data.empty()) j["data"] = data;  // only the file-backed tasks have these
  if (!eval_data.empty()) j["eval_data"] = eval_data;
  j["shuffle"] = shuffle;
  return j.dump();
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
    c.data = t.value("data", std::string());
    c.eval_data = t.value("eval_data", std::string());
    c.shuffle = t.value("shuffle", true);
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": task description is unreadable (", e.what(), ")");
  }
}

int64_t Batch::counted_targets() const {
  int64_t n = 0;
  for (int32_t t : targets.data) n += t >= 0;
  return n;
}

bool Batch::live_positions(std::vector<int32_t>& len, Ids& output_rows, Ids& out_targets) const {
  const int64_t B = size(), T = inputs.shape[1];
  int64_t counted = 0;
  len.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    int32_t last = 0;  // one past the last counted target
    for (int64_t t = 0; t < T; ++t)
      if (targets.at(b, t) >= 0) {
        last = static_cast<int32_t>(t + 1);
        ++counted;
      }
    len[static_cast<size_t>(b)] = last;
  }
  // rows live to the end still gain when some positions have no target (the last block's
  // output side runs only on the targets)
  if (counted == 0 || counted == B * T) return false;
  output_rows.data.reserve(static_cast<size_t>(B * T));  // once: later batches reuse them
  out_targets.data.reserve(static_cast<size_t>(B * T));
  output_rows.data.clear();
  out_targets.data.clear();
  for (int64_t b = 0, i = 0; b < B; ++b)
    for (int32_t t = 0; t < len[static_cast<size_t>(b)]; ++t, ++i)
      if (targets.at(b, t) >= 0) {
        output_rows.data.push_back(static_cast<int32_t>(i));
        out_targets.data.push_back(targets.at(b, t));
      }
  output_rows.shape = out_targets.shape = Shape{static_cast<int64_t>(output_rows.data.size())};
  return true;
}

void Batch::rows_into(int64_t lo, int64_t hi, Batch& out) const {
  if (lo < 0 || hi > size() || lo > hi) fail("Batch::rows_into: rows [", lo, ", ", hi, ") of a batch of ", size());
  const int64_t T = inputs.shape[1];
  out.inputs.shape = out.targets.shape = Shape{hi - lo, T};
  out.inputs.data.assign(inputs.data.begin() + lo * T, inputs.data.begin() + hi * T);
  out.targets.data.assign(targets.data.begin() + lo * T, targets.data.begin() + hi * T);
  if (prompt_len.empty()) out.prompt_len.clear();  // a batch made by hand may have none
  else out.prompt_len.assign(prompt_len.begin() + lo, prompt_len.begin() + hi);
  if (key_padding.defined()) {
    if (!out.key_padding.defined() || out.key_padding.shape() != Shape{hi - lo, T}) out.key_padding = Tensor::zeros({hi - lo, T});
    std::copy_n(key_padding.data() + lo * T, (hi - lo) * T, out.key_padding.data());
  } else {
    out.key_padding = Tensor();
  }
}

void Task::check_held_out_request(int n, int batch_size) {
  if (n < 1) fail("held-out data: the number of sequences must be at least 1, got ", n);
  if (batch_size < 1) fail("held-out data: the batch size must be at least 1, got ", batch_size);
}

void TaskConfig::make_paths_absolute() {
  for (std::string* p : {&data, &eval_data})
    if (!p->empty() && p->front() != '(') {
      std::error_code ec;
      const std::filesystem::path abs = std::filesystem::absolute(*p, ec);
      if (!ec) *p = abs.lexically_normal().string();
    }
}

std::vector<Batch> Task::held_out(int n, uint64_t seed, int batch_size) const {
  check_held_out_request(n, batch_size);
  Rng rng(seed);
  std::vector<Batch> out;
  for (int done = 0; done < n; done += batch_size) out.push_back(sample(std::min(batch_size, n - done), rng));
  return out;
}

Batch Task::sample(int batch_size, Rng& rng) const {
  Batch b;
  sample_into(b, batch_size, rng);
  return b;
}

std::string Task::token_text(int32_t id) const { return std::to_string(id); }

std::vector<int32_t> Task::answer(const Batch& b, int64_t row) const {
  std::vector<int32_t> y;
  const int64_t T = b.targets.shape[1];
  for (int64_t t = 0; t < T; ++t)
    if (b.targets.at(row, t) >= 0) y.push_back(b.targets.at(row, t));
  return y;
}

std::unique_ptr<Task> make_task(const TaskConfig& cfg) {
  cfg.validate();
  if (is_copy_family(cfg.name)) return std::make_unique<CopyTask>(cfg);
  if (cfg.name == "induction") return make_induction_task(cfg);
  if (cfg.name == "text") return make_text_task(cfg);
  return make_tokens_task(cfg);
}

}  // namespace hl
