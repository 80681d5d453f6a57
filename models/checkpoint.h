// Model checkpoints as safetensors (docs/formats.md): parameters under their PyTorch
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

// The one reader of model checkpoints: a headlab checkpoint (safetensors), a headlab run directory
// (its model.safetensors), or a directory holding a Hugging Face GPT-2 model (config.json +
// model.safetensors or its shards; models/hf_gpt2.h), returned in headlab's layout. Every command, TransformerLM.load and train --init read through it.
SafetensorsFile read_checkpoint(const std::string& path);
// Config from a checkpoint's metadata (gates not included).
ModelConfig checkpoint_config(const SafetensorsFile& f);
// Checks, before any model is built, that the file's tensors are exactly the parameters `cfg`
// describes (names and shapes; extra tensors only under "optim." or "state.") and that the
// model fits in memory: a config that claims more than its tensors is refused in
// milliseconds, not after allocating gigabytes.
// `releasing`: the load moves the file's tensors into the model (load_model_releasing), so the
// parameters need no room beyond the file's.
void check_checkpoint_tensors(const ModelConfig& cfg, const SafetensorsFile& f, bool releasing = false);
// Builds the model a checkpoint describes and loads its parameters and head gates.
std::unique_ptr<TransformerLM> load_model(const SafetensorsFile& f);
// The same, emptying f's tensors as they are copied (f keeps its metadata and tensor names), so
// the load peaks at about one model rather than the file's tensors and the model side by side.
std::unique_ptr<TransformerLM> load_model_releasing(SafetensorsFile& f);
std::unique_ptr<TransformerLM> load_model(const std::string& path);  // releasing: the file is not kept
// Copies parameters into an existing model: every parameter must be present with its shape
// and hold only finite values, and no tensor outside the model may appear except under
// "optim." or "state.".
void load_parameters(TransformerLM& model, const SafetensorsFile& f);
// Fails naming the tensor and the first bad element if t holds NaN or Inf.
void check_finite(const Tensor& t, const std::string& name, const std::string& source);

}  // namespace hl
