// What grads and attn share: the flags that choose a checkpoint and the sequences to run it
// on (a batch file, given tokens, or a batch drawn from its task), and their loading.
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "datasets/task.h"
#include "models/transformer.h"

namespace hl {

struct Source {
  std::string checkpoint, batch_file, tokens;
  TaskConfig task = TaskConfig::preset("copy");
  uint64_t seed = 0;
  int batch_size = 8;
  int threads = 2;
};

// --checkpoint, --batch or --tokens, --task, --seed, --batch-size, --threads
void add_source_flags(CLI::App* sub, Source& s, bool tokens);
// Loads the model and the batch a command works on.
std::pair<std::unique_ptr<TransformerLM>, Batch> load_inputs(const Source& s);
// The hook name of layer l's attention pattern.
std::string pattern_hook(int layer);

}  // namespace hl
