#include "datasets/task.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>


namespace hl {

namespace {
std::vector<TaskInfo>& registry() {
  static std::vector<TaskInfo> tasks;  // filled by the tasks' files before main
  return tasks;
}
}  // namespace

const TaskInfo* find_task(const std::string& name) {
  for (const TaskInfo& t : registry())
    if (t.name == name) return &t;
  return nullptr;
}

bool register_task(TaskInfo info) {
  if (find_task(info.name)) fail("register_task: task '", info.name, "' is registered twice");
  info.preset.name = info.name;
  std::vector<TaskInfo>& r = registry();
  auto at = std::find_if(r.begin(), r.end(), [&](const TaskInfo& t) { return t.order > info.order; });
  r.insert(at, std::move(info));
  return true;
}

const std::vector<TaskInfo>& task_registry() { return registry(); }

std::vector<std::string> task_names() {
  std::vector<std::string> n;
  for (const TaskInfo& t : task_registry()) n.push_back(t.name);
  return n;
}

void TaskConfig::validate() const {
  const TaskInfo* task = find_task(name);
  if (!task) {
    std::string list;
    for (auto& n : task_names()) list += (list.empty() ? "" : ", ") + n;
    fail("task: unknown task '", name, "' (expected one of ", list, ")");
  }
  if (task->validate) task->validate(*this);
  if (!tokenizer.empty() && name != "text") fail("task ", name, ": --tokenizer is for --task text (language modelling on its tokens)");
  if (alphabet > (1 << 24)) fail("task: alphabet ", alphabet, " is above the supported maximum ", 1 << 24);
  if (max_len > (1 << 19)) fail("task: length ", max_len, " is above the supported maximum ", 1 << 19);
}

TaskConfig TaskConfig::preset(const std::string& name) {
  if (const TaskInfo* t = find_task(name)) return t->preset;
  TaskConfig c;  // validate() names the unknown task
  c.name = name;
  return c;
}

std::string TaskConfig::to_json() const {
  nlohmann::json j = {{"name", name}, {"alphabet", alphabet}, {"min_len", min_len}, {"max_len", max_len}, {"reverse", reverse}};
  if (!data.empty()) j["data"] = data;  // only the file-backed tasks have these
  if (!eval_data.empty()) j["eval_data"] = eval_data;
  if (!tokenizer.empty()) j["tokenizer"] = tokenizer;
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
    c.tokenizer = t.value("tokenizer", std::string());
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
  for (std::string* p : {&data, &eval_data, &tokenizer})
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

std::vector<int32_t> Task::answer(const Batch& b, int64_t row) {
  std::vector<int32_t> y;
  const int64_t T = b.targets.shape[1];
  for (int64_t t = 0; t < T; ++t)
    if (b.targets.at(row, t) >= 0) y.push_back(b.targets.at(row, t));
  return y;
}

std::unique_ptr<Task> make_task(const TaskConfig& cfg) {
  cfg.validate();
  return find_task(cfg.name)->make(cfg);
}

int64_t Batch::row_tokens(int64_t r) const {
  const int64_t W = inputs.shape[1];
  int64_t n = W;
  if (key_padding.defined())
    while (n > 0 && key_padding.data()[r * W + n - 1] != 0.f) --n;
  return n;
}

std::vector<std::vector<int32_t>> unpadded_rows(const std::vector<Batch>& data, int64_t n) {
  std::vector<std::vector<int32_t>> rows;
  for (const Batch& b : data)
    for (int64_t r = 0; r < b.size() && static_cast<int64_t>(rows.size()) < n; ++r) {
      const int64_t W = b.inputs.shape[1], T = std::max<int64_t>(1, b.row_tokens(r));  // an all-padding row keeps its first token
      rows.emplace_back(b.inputs.data.begin() + r * W, b.inputs.data.begin() + r * W + T);
    }
  return rows;
}

}  // namespace hl
