#include "models/hooks.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

namespace hl {

std::string block_prefix(int layer) { return "blocks." + std::to_string(layer) + "."; }
std::string hook_name(int layer, const std::string& in_block) { return block_prefix(layer) + in_block; }
std::string attn_hook(int layer, const std::string& what) { return block_prefix(layer) + "attn.hook_" + what; }

int hook_layer(const std::string& name) {
  if (!name.starts_with("blocks.")) return -1;
  size_t i = 7;
  int layer = 0;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) layer = layer * 10 + (name[i++] - '0');
  return i < name.size() && name[i] == '.' ? layer : -1;
}

std::string in_block_name(const std::string& name) {
  if (hook_layer(name) < 0) return name;
  return name.substr(name.find('.', 7) + 1);
}

std::string get_act_name(std::string name, std::optional<int> layer, std::string layer_type) {
  if ((name.find('.') != std::string::npos || name.rfind("hook_", 0) == 0) && !layer && layer_type.empty()) return name;
  // "resid_pre3", "pattern0a": the name, the layer, then the layer type
  const size_t digit = name.find_first_of("0123456789");
  if (digit != std::string::npos && digit > 0) {
    size_t end = digit;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    layer = std::stoi(name.substr(digit, end - digit));
    layer_type = name.substr(end);
    name = name.substr(0, digit);
  }
  static const std::map<std::string, std::string> act_alias = {
      {"attn", "pattern"}, {"attn_logits", "attn_scores"}, {"key", "k"}, {"query", "q"}, {"value", "v"},
      {"mlp_pre", "pre"}, {"mlp_mid", "mid"}, {"mlp_post", "post"}};
  static const std::map<std::string, std::string> type_alias = {
      {"a", "attn"}, {"m", "mlp"}, {"b", ""}, {"block", ""}, {"blocks", ""}, {"attention", "attn"}};
  if (auto it = act_alias.find(name); it != act_alias.end()) name = it->second;
  static const std::set<std::string> attn = {"k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores",
                                             "q_input", "k_input", "v_input"};
  static const std::set<std::string> mlp = {"pre", "post", "mid", "pre_linear"};
  if (attn.count(name)) layer_type = "attn";
  else if (mlp.count(name)) layer_type = "mlp";
  else if (auto it = type_alias.find(layer_type); it != type_alias.end()) layer_type = it->second;
  std::string in_block = layer_type.empty() ? "" : layer_type + ".";
  in_block += "hook_" + name;
  if (layer) return hook_name(*layer, in_block);
  if (name == "scale" || name == "normalized") return "ln_final." + in_block;
  return in_block;
}

void append_hook_points(std::vector<HookPointInfo>& to, const std::string& prefix, const std::vector<HookPointInfo>& points) {
  for (const HookPointInfo& p : points) to.push_back({prefix + p.name, p.shape, p.what});
}

NameFilter name_is(const std::string& name) {
  return [name](const std::string& n) { return n == name; };
}
NameFilter names_in(const std::vector<std::string>& names) {
  return [names](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
}
NameFilter names_ending_with(const std::string& suffix) {
  return [suffix](const std::string& n) {
    return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
}
NameFilter all_names() {
  return [](const std::string&) { return true; };
}

const Tensor& ActivationCache::operator[](const std::string& name) const {
  auto it = d_->acts.find(name);
  if (it == d_->acts.end()) {
    std::string have;
    for (auto& [n, t] : d_->acts) have += (have.empty() ? "" : ", ") + n;
    fail("activation cache: no '", name, "' (cached: ", have.empty() ? "nothing" : have, ")");
  }
  return it->second;
}

const Tensor& ActivationCache::grad(const std::string& name) const {
  auto it = d_->grads.find(name);
  if (it == d_->grads.end())
    fail("activation cache: no gradient for '", name, "' (cache it with gradients and run backward first)");
  return it->second;
}

std::vector<std::string> ActivationCache::names() const {
  std::vector<std::string> n;
  for (auto& [k, v] : d_->acts) n.push_back(k);
  return n;
}

void ActivationCache::clear() {
  d_->acts.clear();
  d_->grads.clear();
}

Hooks& Hooks::add_forward(NameFilter where, ForwardHook fn) {
  s_->fwd.push_back({std::move(where), std::move(fn)});
  return *this;
}
Hooks& Hooks::add_backward(NameFilter where, BackwardHook fn) {
  s_->bwd.push_back({std::move(where), std::move(fn)});
  return *this;
}
Hooks& Hooks::cache(const ActivationCache& c, NameFilter filter, bool with_grads) {
  s_->rec.push_back({std::move(filter), c.d_, with_grads});
  return *this;
}

bool Hooks::has_forward(const std::string& name) const {
  for (auto& sp : s_->splices)
    if (sp.first == name) return true;
  for (auto& f : s_->fwd)
    if (f.where(name)) return true;
  for (auto& r : s_->rec)
    if (r.where(name)) return true;
  return false;
}

bool Hooks::has_backward(const std::string& name) const {
  for (auto& b : s_->bwd)
    if (b.where(name)) return true;
  for (auto& r : s_->rec)
    if (r.grads && r.where(name)) return true;
  return false;
}

void Hooks::backward_at(const std::string& name, const Tensor& g) const {
  for (auto& b : s_->bwd)
    if (b.where(name)) b.fn(g, name);
  for (auto& r : s_->rec) {
    if (!r.grads || !r.where(name)) continue;
    Tensor& dst = r.cache->grads[name];
    if (!dst.defined()) {
      dst = g.clone();
      continue;
    }
    float* d = dst.data();  // a second backward accumulates, as .grad does
    const float* s = g.data();
    for (int64_t i = 0; i < dst.numel(); ++i) d[i] += s[i];
  }
}

Tensor Hooks::tapped(const std::string& name, const Tensor& x) const {
  if (!grad_enabled() || !x.requires_grad() || !has_backward(name)) return x;
  const Hooks self = *this;  // shares the state: the graph keeps the hooks alive
  return tap(x, [self, name](const Tensor& g) { self.backward_at(name, g); });
}

Tensor Hooks::apply(const std::string& name, const Tensor& x, bool tap_for_backward) const {
  Tensor cur = x;
  for (auto& f : s_->fwd) {
    if (!f.where(name)) continue;
    Tensor r = f.fn(cur, name);
    if (!r.defined()) continue;
    if (r.shape() != cur.shape())
      fail("hook at ", name, ": the replacement has shape ", r.shape().str(), " but the activation is ", cur.shape().str());
    cur = r;
  }
  for (auto& r : s_->rec)
    if (r.where(name)) r.cache->acts[name] = cur.detach();
  for (auto& sp : s_->splices)
    if (sp.first == name) cur = sp.second(cur, *this);
  return tap_for_backward ? tapped(name, cur) : cur;
}

Hooks Hooks::spliced(const std::vector<std::pair<std::string, Splice>>& splices) const {
  Hooks h;
  *h.s_ = *s_;  // the same hooks; the caches' data is shared
  h.s_->splices.insert(h.s_->splices.end(), splices.begin(), splices.end());
  return h;
}

Tensor replace_head(const Tensor& x, int head, const Tensor& value) {
  if (x.ndim() < 2) fail("replace_head: expected (..., heads, d), got ", x.shape().str());
  const int64_t H = x.size(-2), d = x.size(-1);
  if (head < 0 || head >= H) fail("replace_head: head ", head, " outside 0..", H - 1);
  if (value.defined() && value.numel() != d)
    fail("replace_head: value ", value.shape().str(), " must have ", d, " elements (one head)");
  Tensor keep = Tensor::ones({H, d}), repl = Tensor::zeros({H, d});
  for (int64_t j = 0; j < d; ++j) {
    keep.data()[head * d + j] = 0.f;
    if (value.defined()) repl.data()[head * d + j] = value.data()[j];
  }
  return add(mul(x, keep), repl);
}

}  // namespace hl
