#include "train/interventions.h"

#include <algorithm>
#include <cmath>

#include "lib/autograd.h"
#include "lib/nn.h"
#include "lib/rng.h"

namespace hl {

namespace {
const char* flag_of(HeadIntervention::Kind k) {
  return k == HeadIntervention::Gate ? "--gate" : k == HeadIntervention::Freeze ? "--freeze" : "--reinit";
}
}  // namespace

HeadIntervention parse_intervention(HeadIntervention::Kind kind, const std::string& text, const std::string& flag) {
  const std::string form = kind == HeadIntervention::Gate ? "LAYER.HEAD=VALUE, e.g. 1.0=0" : "LAYER.HEAD, e.g. 1.0";
  HeadIntervention r;
  r.kind = kind;
  const size_t dot = text.find('.'), eq = text.find('=');
  if (dot == std::string::npos || (kind == HeadIntervention::Gate) != (eq != std::string::npos) ||
      (eq != std::string::npos && eq < dot))
    fail(flag, " '", text, "': expected ", form);
  auto whole = [&](const std::string& s) {
    if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      fail(flag, " '", text, "': expected ", form);
    return std::stoi(s);
  };
  r.layer = whole(text.substr(0, dot));
  r.head = whole(text.substr(dot + 1, eq == std::string::npos ? std::string::npos : eq - dot - 1));
  if (kind == HeadIntervention::Gate) {
    const std::string v = text.substr(eq + 1);
    size_t used = 0;
    float x = 0;
    try {
      x = std::stof(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (v.empty() || used != v.size() || !std::isfinite(x)) fail(flag, " '", text, "': the gate's value must be a finite number");
    r.value = x;
  }
  return r;
}

std::string to_string(const HeadIntervention& i) {
  std::string s = std::to_string(i.layer) + "." + std::to_string(i.head);
  if (i.kind == HeadIntervention::Gate) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(i.value));
    s += std::string("=") + buf;
  }
  return s;
}

std::vector<HeadIntervention> parse_interventions(const std::vector<std::string>& gate, const std::vector<std::string>& freeze,
                                                  const std::vector<std::string>& reinit, const ModelConfig& cfg) {
  std::vector<HeadIntervention> out;
  auto add = [&](HeadIntervention::Kind kind, const std::vector<std::string>& texts) {
    const std::string flag = flag_of(kind);
    for (const std::string& t : texts) {
      const HeadIntervention i = parse_intervention(kind, t, flag);
      if (i.layer >= cfg.n_layers)
        fail(flag, " ", t, ": layer ", i.layer, " is outside 0..", cfg.n_layers - 1, " (the model has ", cfg.n_layers, " layers)");
      if (i.head >= cfg.n_heads)
        fail(flag, " ", t, ": head ", i.head, " is outside 0..", cfg.n_heads - 1, " (the model has ", cfg.n_heads, " heads per layer)");
      if (kind != HeadIntervention::Gate && cfg.kv_heads() != cfg.n_heads)
        fail(flag, " ", t, ": the model's heads share key/value heads (", cfg.kv_heads(), " for ", cfg.n_heads,
             "), so one head's W_K and W_V are not its own");
      for (const HeadIntervention& o : out)
        if (o.kind == kind && o.layer == i.layer && o.head == i.head) fail(flag, " ", t, ": head ", i.layer, ".", i.head, " is given twice");
      out.push_back(i);
    }
  };
  add(HeadIntervention::Gate, gate);
  add(HeadIntervention::Freeze, freeze);
  add(HeadIntervention::Reinit, reinit);
  return out;
}

std::vector<HeadSlice> head_slices(TransformerLM& model, int layer, int head) {
  const ModelConfig& c = model.cfg;
  if (layer < 0 || layer >= c.n_layers || head < 0 || head >= c.n_heads)
    fail("head ", layer, ".", head, " is outside the model's ", c.n_layers, " layers x ", c.n_heads, " heads");
  const int64_t dh = c.head_dim(), D = c.d_model, H = c.n_heads;
  MultiHeadAttention& at = model.blocks[layer]->attn;
  const std::string prefix = block_prefix(layer) + "attn.";  // the parameters' module, as the hooks'
  std::vector<HeadSlice> out;
  auto rows = [&](const std::string& name, Tensor& t, int64_t width) {  // rows head*dh .. of a (rows, width) tensor
    HeadSlice s{prefix + name, t, {}};
    for (int64_t i = head * dh * width; i < (head + 1) * dh * width; ++i) s.indices.push_back(i);
    out.push_back(std::move(s));
  };
  for (auto [name, lin] : {std::pair<const char*, Linear*>{"W_Q", &at.W_Q}, {"W_K", &at.W_K}, {"W_V", &at.W_V}}) {
    rows(std::string(name) + ".weight", lin->weight, D);
    if (lin->bias.defined()) rows(std::string(name) + ".bias", lin->bias, 1);
  }
  HeadSlice o{prefix + "W_O.weight", at.W_O.weight, {}};  // (D, H*dh): columns head*dh ..
  for (int64_t r = 0; r < D; ++r)
    for (int64_t k = 0; k < dh; ++k) o.indices.push_back(r * H * dh + head * dh + k);
  out.push_back(std::move(o));
  return out;
}

HeadInterventions::HeadInterventions(TransformerLM& model, std::vector<HeadIntervention> list) : list_(std::move(list)) {
  for (const HeadIntervention& i : list_)
    if (i.kind == HeadIntervention::Freeze)
      for (HeadSlice& s : head_slices(model, i.layer, i.head)) frozen_.push_back(std::move(s));
}

void HeadInterventions::set_gates(TransformerLM& model) const {
  for (const HeadIntervention& i : list_)
    if (i.kind == HeadIntervention::Gate) model.gates(i.layer).data()[i.head] = i.value;
}

void HeadInterventions::reinit(TransformerLM& model, Optimizer& opt, uint64_t seed) const {
  const std::vector<std::pair<std::string, Tensor>> state = opt.state();
  for (const HeadIntervention& i : list_) {
    if (i.kind != HeadIntervention::Reinit) continue;
    Rng rng(seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(i.layer) << 32) ^ static_cast<uint64_t>(i.head) ^ 0x4E1417ull);
    for (HeadSlice& s : head_slices(model, i.layer, i.head)) {
      const bool bias = s.param.ndim() == 1;  // Linear's biases start at 0, its weights at N(0, 0.02^2)
      Tensor fresh = Tensor::zeros({static_cast<int64_t>(s.indices.size())});
      if (!bias) init_normal(fresh, rng, 0.02f);
      for (size_t k = 0; k < s.indices.size(); ++k) s.param.data()[s.indices[k]] = fresh.data()[k];
      // the optimizer's moments (Adam's exp_avg, exp_avg_sq; SGD's velocity) of these elements
      for (const auto& [name, t] : state) {
        const size_t dot = name.find('.');
        if (dot != std::string::npos && name.compare(dot + 1, std::string::npos, s.name) == 0 && t.defined() &&
            t.numel() == s.param.numel())
          for (int64_t k : s.indices) t.data()[k] = 0.f;
      }
    }
  }
}

void HeadInterventions::remember_frozen() {
  frozen_values_.clear();
  for (const HeadSlice& s : frozen_) {
    std::vector<float> v;
    for (int64_t k : s.indices) v.push_back(s.param.data()[k]);
    frozen_values_.push_back(std::move(v));
  }
}

void HeadInterventions::zero_frozen_grads() const {
  for (const HeadSlice& s : frozen_) {
    const Tensor g = s.param.grad();
    if (!g.defined()) continue;
    for (int64_t k : s.indices) g.data()[k] = 0.f;
  }
}

void HeadInterventions::restore_frozen() const {
  for (size_t i = 0; i < frozen_.size(); ++i)
    for (size_t k = 0; k < frozen_[i].indices.size(); ++k) frozen_[i].param.data()[frozen_[i].indices[k]] = frozen_values_[i][k];
}

}  // namespace hl
