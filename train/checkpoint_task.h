// A checkpoint's model together with the task it was trained on: the one loader every command
// uses, with one message when the two do not fit.
#pragma once
#include <memory>
#include <string>

#include "datasets/task.h"
#include "lib/safetensors.h"
#include "models/transformer.h"

namespace hl {

// The task a checkpoint was trained on (its "task" metadata), else `fallback`.
TaskConfig checkpoint_task(const SafetensorsFile& f, const TaskConfig& fallback);

// The task `tc` made, checked against the model's vocabulary: when they differ, fails with
// "CHECKPOINT: the model's vocabulary (V) does not fit task NAME with alphabet A (W); give
// --task with the task the model was trained on", or, when CHECKPOINT is a Hugging Face model
// directory (a model trained on text, with no task), naming `instead`: what the command takes
// without a task (e.g. "--data probe"), or, empty, that the command needs a model of a task.
std::unique_ptr<Task> task_for_model(const ModelConfig& cfg, const TaskConfig& tc, const std::string& checkpoint,
                                     const std::string& instead = "");

}  // namespace hl
