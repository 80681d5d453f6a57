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
  bool takes_tokens = false;  // the command has --tokens (else --batch)
};

// Registers a command that runs a checkpoint on some sequences: --checkpoint, --batch (or with
// `tokens`, --tokens), --task, --seed, --batch-size, --threads, and --out described by
// `out_help`; run(source, out) runs when it is chosen.
using ModelInputRun = int (*)(const Source&, const std::string& out);
void add_model_input_command(CLI::App& app, CommandRunner& runner, const std::string& name, const std::string& help,
                             bool tokens, const std::string& out_help, ModelInputRun run);
// Loads the model and the batch a command works on.
std::pair<std::unique_ptr<TransformerLM>, Batch> load_inputs(const Source& s);

}  // namespace hl
