#include "models/checkpoint.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "lib/fileutil.h"
#include "models/hf_models.h"

namespace hl {

using json = nlohmann::json;

void add_model(SafetensorsWriter& w, const TransformerLM& model) {
  for (auto& [name, t] : model.named_parameters()) {
    const float* d = t.data();  // a checkpoint that load() would refuse is never written
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if (!std::isfinite(d[i]))
        fail("save: the model's tensor '", name, "' holds a non-finite value (", d[i], " at element ", i, " of ",
             t.shape().str(), "); refusing to write a checkpoint that cannot be loaded");
    w.add(name, t);
  }
  json cfg = json::parse(model.cfg.to_json());
  if (!model.gates_all_one()) cfg["head_gates"] = model.gate_values();
  w.set_meta("format", "headlab-checkpoint");
  w.set_meta("format_version", "1");
  w.set_meta("config", cfg.dump());
}

void save_checkpoint(const std::string& path, const TransformerLM& model, const NamedTensors& extra,
                     const std::map<std::string, std::string>& extra_meta) {
  SafetensorsWriter w;
  add_model(w, model);
  for (auto& [name, t] : extra) w.add(name, t);
  for (auto& [k, v] : extra_meta) w.set_meta(k, v);
  w.write(path);
}

SafetensorsFile read_checkpoint(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // a headlab run directory (model.safetensors beside the run's summary or checkpoint, no
    // config.json) stands for its model
    if (!file_exists(path + "/config.json") && file_exists(path + "/model.safetensors") &&
        (file_exists(path + "/summary.json") || file_exists(path + "/checkpoint.safetensors")))
      return read_safetensors(path + "/model.safetensors");
    return read_hf_directory(path);
  }
  return read_safetensors(path);
}

ModelConfig checkpoint_config(const SafetensorsFile& f) {
  auto it = f.metadata.find("format");
  if (it != f.metadata.end() && it->second != "headlab-checkpoint")
    fail(f.source, ": metadata format is '", it->second, "', expected 'headlab-checkpoint'");
  auto v = f.metadata.find("format_version");
  if (v != f.metadata.end() && v->second != "1")
    fail(f.source, ": checkpoint format_version '", v->second, "' is not supported (expected 1)");
  return ModelConfig::from_json(f.meta("config"), f.source);
}

void check_finite(const Tensor& t, const std::string& name, const std::string& source) {
  const float* d = t.data();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (!std::isfinite(d[i]))
      fail(source, ": tensor '", name, "' holds a non-finite value (", d[i], " at element ", i, " of ", t.shape().str(),
           "); refusing to use a model with NaN or Inf weights");
}

void check_checkpoint_tensors(const ModelConfig& cfg, const SafetensorsFile& f, bool releasing) {
  const auto expected = parameter_shapes(cfg);
  for (auto& [name, shape] : expected) {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) fail(f.source, ": missing tensor '", name, "' that its config needs");
    if (it->second.shape != shape)
      fail(f.source, ": tensor '", name, "' has shape ", it->second.shape.str(), " but the config (d_model ", cfg.d_model,
           ", ", cfg.n_layers, " layers, ", cfg.n_heads, " heads, d_ff ", cfg.d_ff, ", vocab ", cfg.vocab_size,
           ", max_seq_len ", cfg.max_seq_len, ") needs ", shape.str());
  }
  for (auto& [name, st] : f.tensors) {
    if (name.rfind("optim.", 0) == 0 || name.rfind("state.", 0) == 0) continue;
    bool known = false;
    for (auto& [pn, shape] : expected) known = known || pn == name;
    if (!known) fail(f.source, ": unexpected tensor '", name, "' (not a parameter of the model its config describes)");
  }
  // what the tensors cannot vouch for (a sinusoid table of max_seq_len rows) must still fit; a
  // load that releases the file's tensors into the model needs only one tensor's room for them
  double need = estimate_step_bytes(cfg, 1, 1, false), largest = 0;
  for (auto& [name, shape] : expected) largest = std::max(largest, static_cast<double>(shape.numel()));
  if (releasing) need -= 4.0 * (static_cast<double>(parameter_count(cfg)) - largest);
  const double have = available_memory_bytes();
  if (need > have)
    fail(f.source, ": the model its config describes needs about ", format_bytes(need), " of memory, more than the ",
         format_bytes(have), " available");
}

namespace {
// load_parameters; with `release` (f itself), each tensor's bytes are freed once copied and the
// freed memory handed back to the system every 64 MiB (glibc keeps freed blocks below its mmap
// threshold otherwise), so the model's pages replace the file's rather than add to them.
void copy_parameters(TransformerLM& model, const SafetensorsFile& f, SafetensorsFile* release) {
  auto params = model.named_parameters();
  size_t freed = 0;
  for (auto& [name, t] : params) {
    f.f32_into(name, t.shape(), t.data());  // straight from the file's bytes: no float32 copy in between
    check_finite(t, name, f.source);
    if (!release) continue;
    std::string& bytes = release->tensors.at(name).bytes;
    freed += bytes.size();
    std::string().swap(bytes);
    if (freed >= (size_t{64} << 20)) malloc_trim(0), freed = 0;
  }
  if (release) malloc_trim(0);
  for (auto& [name, st] : f.tensors) {
    if (name.rfind("optim.", 0) == 0 || name.rfind("state.", 0) == 0) continue;
    bool known = false;
    for (auto& [pn, t] : params) known = known || pn == name;
    if (!known) fail(f.source, ": unexpected tensor '", name, "' (not a parameter of this model)");
  }
  // Head gates from the config, if any are not 1.
  json cfg = json::parse(f.meta("config"));
  if (cfg.contains("head_gates")) {
    const json& g = cfg["head_gates"];
    if (!g.is_array() || static_cast<int>(g.size()) != model.cfg.n_layers)
      fail(f.source, ": config head_gates must be ", model.cfg.n_layers, " lists of ", model.cfg.n_heads, " numbers");
    for (int l = 0; l < model.cfg.n_layers; ++l) {
      if (!g[l].is_array() || static_cast<int>(g[l].size()) != model.cfg.n_heads)
        fail(f.source, ": config head_gates[", l, "] must have ", model.cfg.n_heads, " numbers");
      for (int h = 0; h < model.cfg.n_heads; ++h) {
        if (!g[l][h].is_number()) fail(f.source, ": config head_gates[", l, "][", h, "] is not a number");
        const float v = g[l][h].get<float>();
        if (!std::isfinite(v)) fail(f.source, ": config head_gates[", l, "][", h, "] is not finite");
        model.gates(l).data()[h] = v;
      }
    }
  }
}
}  // namespace

void load_parameters(TransformerLM& model, const SafetensorsFile& f) { copy_parameters(model, f, nullptr); }

namespace {
std::unique_ptr<TransformerLM> build_model(const SafetensorsFile& f, SafetensorsFile* release) {
  const ModelConfig cfg = checkpoint_config(f);
  check_checkpoint_tensors(cfg, f, release != nullptr);
  std::unique_ptr<TransformerLM> model;
  {
    SkipInitGuard loaded_next;  // copy_parameters writes every parameter (pages untouched until then)
    model = std::make_unique<TransformerLM>(cfg, 0);
  }
  copy_parameters(*model, f, release);
  return model;
}
}  // namespace

std::unique_ptr<TransformerLM> load_model(const SafetensorsFile& f) { return build_model(f, nullptr); }
std::unique_ptr<TransformerLM> load_model_releasing(SafetensorsFile& f) { return build_model(f, &f); }

std::unique_ptr<TransformerLM> load_model(const std::string& path) {
  SafetensorsFile f = read_checkpoint(path);
  return load_model_releasing(f);
}

}  // namespace hl
