#include "models/checkpoint.h"

#include <nlohmann/json.hpp>

namespace hl {

using json = nlohmann::json;

void add_model(SafetensorsWriter& w, const TransformerLM& model) {
  for (auto& [name, t] : model.named_parameters()) w.add(name, t);
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

ModelConfig checkpoint_config(const SafetensorsFile& f) {
  auto it = f.metadata.find("format");
  if (it != f.metadata.end() && it->second != "headlab-checkpoint")
    fail(f.source, ": metadata format is '", it->second, "', expected 'headlab-checkpoint'");
  auto v = f.metadata.find("format_version");
  if (v != f.metadata.end() && v->second != "1")
    fail(f.source, ": checkpoint format_version '", v->second, "' is not supported (expected 1)");
  return ModelConfig::from_json(f.meta("config"), f.source);
}

void load_parameters(TransformerLM& model, const SafetensorsFile& f) {
  auto params = model.named_parameters();
  for (auto& [name, t] : params) {
    Shape s = t.shape();
    Tensor src = f.f32(name, &s);
    t.copy_from(src);
  }
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
        model.gates(l).data()[h] = g[l][h].get<float>();
      }
    }
  }
}

std::unique_ptr<TransformerLM> load_model(const SafetensorsFile& f) {
  auto model = std::make_unique<TransformerLM>(checkpoint_config(f), 0);
  load_parameters(*model, f);
  return model;
}

std::unique_ptr<TransformerLM> load_model(const std::string& path) {
  return load_model(read_safetensors(path));
}

}  // namespace hl
