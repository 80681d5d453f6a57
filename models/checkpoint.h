// Model checkpoints as safetensors (../shared/INTEROP.md): parameters under their PyTorch
// names, metadata {"format": "headlab-checkpoint", "format_version": "1", "config": JSON}.
// Extra tensors (optimizer moments, RNG state) go under their own prefix ("optim.", "state.").
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/safetensors.h"
#include "models/transformer.h"

namespace hl {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

void add_model(SafetensorsWriter& w, const TransformerLM& model);
void save_checkpoint(const std::string& path, const TransformerLM& model,
                     const NamedTensors& extra = {},
                     const std::map<std::string, std::string>& extra_meta = {});

// Config from a checkpoint's metadata (gates not included).
ModelConfig checkpoint_config(const SafetensorsFile& f);
// Builds the model a checkpoint describes and loads its parameters and head gates.
std::unique_ptr<TransformerLM> load_model(const SafetensorsFile& f);
std::unique_ptr<TransformerLM> load_model(const std::string& path);
// Copies parameters into an existing model: every parameter must be present with its shape,
// and no tensor outside the model may appear except under "optim." or "state.".
void load_parameters(TransformerLM& model, const SafetensorsFile& f);

}  // namespace hl
