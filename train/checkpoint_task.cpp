#include "train/checkpoint_task.h"

#include <filesystem>

#include "lib/fileutil.h"

namespace hl {

TaskConfig checkpoint_task(const SafetensorsFile& f, const TaskConfig& fallback) {
  auto it = f.metadata.find("task");
  return it == f.metadata.end() ? fallback : TaskConfig::from_json(it->second, f.source);
}

std::unique_ptr<Task> task_for_model(const ModelConfig& cfg, const TaskConfig& tc, const std::string& checkpoint,
                                     const std::string& instead) {
  std::unique_ptr<Task> task = make_task(tc);
  std::error_code ec;
  const bool hugging_face = std::filesystem::is_directory(checkpoint, ec) && file_exists(checkpoint + "/config.json");
  if (task->vocab_size() != cfg.vocab_size && hugging_face)
    fail(checkpoint, ": a Hugging Face model has no task to draw rows from (its vocabulary of ", cfg.vocab_size,
         " tokens does not fit task ", tc.name, "); ",
         instead.empty() ? "this command draws its rows from a task: give a model trained on one of headlab's tasks"
                         : "give " + instead);
  if (task->vocab_size() != cfg.vocab_size)
    fail(checkpoint, ": the model's vocabulary (", cfg.vocab_size, ") does not fit task ", tc.name, " with alphabet ",
         tc.alphabet, " (", task->vocab_size(), "); give --task with the task the model was trained on");
  return task;
}

}  // namespace hl
