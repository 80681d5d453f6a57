#include "train/checkpoint_task.h"

namespace hl {

TaskConfig checkpoint_task(const SafetensorsFile& f, const TaskConfig& fallback) {
  auto it = f.metadata.find("task");
  return it == f.metadata.end() ? fallback : TaskConfig::from_json(it->second, f.source);
}

std::unique_ptr<Task> task_for_model(const ModelConfig& cfg, const TaskConfig& tc, const std::string& checkpoint) {
  std::unique_ptr<Task> task = make_task(tc);
  if (task->vocab_size() != cfg.vocab_size)
    fail(checkpoint, ": the model's vocabulary (", cfg.vocab_size, ") does not fit task ", tc.name, " with alphabet ",
         tc.alphabet, " (", task->vocab_size(), "); give --task with the task the model was trained on");
  return task;
}

}  // namespace hl
