// Named hook points, TransformerLens style: every activation a head study needs has a name
// ("blocks.1.attn.hook_pattern") and a documented shape. Each module declares the hook points it
// makes beside the code that makes them (MultiHeadAttention::hook_points, FeedForward's,
// TransformerBlock's, the model's); hook_points() in models/transformer.h gathers them, and
// `headlab hooks` and Python's hl.hook_points list that. A forward hook sees the activation and may return
// a replacement (ablation, activation patching, steering); a backward hook sees the gradient of
// the loss with respect to the activation during backward. An ActivationCache records
// activations (and their gradients) by name.
//
// With no Hooks object in the forward options nothing is named, recorded or copied: the
// forward is exactly the fast path. A hook that only reads (returns an undefined Tensor) never
// changes the computation: the outputs are bit for bit those without it.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/ops.h"

namespace hl {

// ---- Hook names: the one place they are spelled. Every analysis, study, command and the Python
// module build names here, never by hand. Parameters live under the same module prefix
// ("blocks.1.attn.W_Q.weight"); see docs/hooks.md for where parameter and hook names differ.
// "blocks.3." : the prefix of layer 3's module, its hook points and its parameters.
std::string block_prefix(int layer);
// A hook point inside a block: hook_name(1, "attn.hook_z") = "blocks.1.attn.hook_z",
// hook_name(0, "hook_resid_pre") = "blocks.0.hook_resid_pre".
std::string hook_name(int layer, const std::string& in_block);
// An attention hook point: attn_hook(1, "pattern") = "blocks.1.attn.hook_pattern".
std::string attn_hook(int layer, const std::string& what);
// The layer of a name inside a block ("blocks.3.attn.hook_z" -> 3), or -1 (hook_embed, ln_final.*).
int hook_layer(const std::string& name);
// The name after the block prefix ("blocks.3.attn.hook_z" -> "attn.hook_z"); `name` if it has none.
std::string in_block_name(const std::string& name);
// TransformerLens's utils.get_act_name: ("pattern", 0) -> "blocks.0.attn.hook_pattern", ("q", 1,
// "attn"), ("resid_pre", 2), ("scale", 0, "ln1"), ("embed"), ("scale") -> "ln_final.hook_scale";
// "pattern0" = ("pattern", 0); a full name ("blocks.0.hook_resid_pre") is kept. hl.get_act_name
// and the Python cache's keys call this.
std::string get_act_name(std::string name, std::optional<int> layer = std::nullopt, std::string layer_type = "");

// A hook point as its module declares it: the name ("hook_q", prefixed by the module's place
// when gathered: "blocks.0.attn.hook_q"), the shape with the config's sizes filled in
// ("(B, T, 4, 16)"; B = batch, T = tokens) and what the activation holds.
struct HookPointInfo {
  std::string name, shape, what;
};
// `points` with `prefix` put before every name, appended to `to`.
void append_hook_points(std::vector<HookPointInfo>& to, const std::string& prefix, const std::vector<HookPointInfo>& points);

using NameFilter = std::function<bool(const std::string& name)>;
NameFilter name_is(const std::string& name);
NameFilter names_in(const std::vector<std::string>& names);
NameFilter names_ending_with(const std::string& suffix);  // e.g. "hook_pattern": every layer's
NameFilter all_names();

// Returns an undefined Tensor to leave the activation as it is, or a replacement of the same
// shape. The activation must not be changed in place (backward may still need it).
using ForwardHook = std::function<Tensor(const Tensor& activation, const std::string& name)>;
using BackwardHook = std::function<void(const Tensor& grad, const std::string& name)>;

// Activations by name (views of the forward's tensors, no copies) and, when asked for, their
// gradients, filled in during backward. Copies share their contents (so a cache returned by
// value is still the one the graph fills in during backward).
class ActivationCache {
 public:
  const Tensor& operator[](const std::string& name) const;  // throws listing what is cached
  const Tensor& grad(const std::string& name) const;        // throws if no gradient reached it
  bool has(const std::string& name) const { return d_->acts.count(name) > 0; }
  bool has_grad(const std::string& name) const { return d_->grads.count(name) > 0; }
  std::vector<std::string> names() const;
  size_t size() const { return d_->acts.size(); }
  void clear();

 private:
  friend class Hooks;
  struct Data {
    std::map<std::string, Tensor> acts, grads;
  };
  std::shared_ptr<Data> d_ = std::make_shared<Data>();
};

// The hooks of one forward pass. Copies share their hooks; the graph keeps what it needs alive,
// so a Hooks object may go out of scope before backward.
class Hooks {
 public:
  Hooks& add_forward(NameFilter where, ForwardHook fn);
  Hooks& add_forward(const std::string& name, ForwardHook fn) { return add_forward(name_is(name), std::move(fn)); }
  Hooks& add_backward(NameFilter where, BackwardHook fn);
  Hooks& add_backward(const std::string& name, BackwardHook fn) { return add_backward(name_is(name), std::move(fn)); }
  // Records each activation whose name passes `filter` into `cache` (and its gradient during
  // backward when with_grads). Recording happens after this point's other forward hooks.
  Hooks& cache(const ActivationCache& cache, NameFilter filter, bool with_grads = false);

  bool has_forward(const std::string& name) const;
  bool has_backward(const std::string& name) const;
  bool any(const std::string& name) const { return has_forward(name) || has_backward(name); }

  // At hook point `name`: runs the forward hooks on x in order (each sees the previous one's
  // replacement), checks that a replacement keeps x's shape, records into caches, and, when
  // a backward hook matches and x is part of a graph, routes the result through tap() so the
  // hook sees its gradient. Returns x itself (the same tensor) when nothing replaced or tapped it.
  // With tap_for_backward false the caller routes gradients itself (see tapped()).
  Tensor apply(const std::string& name, const Tensor& x, bool tap_for_backward = true) const;
  // x routed through tap() when a backward hook matches `name` and x is part of a graph.
  Tensor tapped(const std::string& name, const Tensor& x) const;
  // Calls the backward hooks (and gradient caches) at `name` with dL/d(activation).
  void backward_at(const std::string& name, const Tensor& grad) const;

  // A splice at a hook point (an SAE attached to the model: TransformerLM::add_sae): after the
  // forward hooks and caches at `name`, run(x, hooks) gives the activation the forward goes on
  // with, applying `hooks` at its own points on the way ("<name>.hook_sae_acts_post").
  using Splice = std::function<Tensor(const Tensor& x, const Hooks& hooks)>;
  // These hooks (sharing their caches) with splices added: what a forward of a model with
  // attached SAEs runs with. A spliced point counts as replaced (has_forward).
  Hooks spliced(const std::vector<std::pair<std::string, Splice>>& splices) const;
  bool has_splices() const { return !s_->splices.empty(); }

 private:
  struct Fwd { NameFilter where; ForwardHook fn; };
  struct Bwd { NameFilter where; BackwardHook fn; };
  struct Rec { NameFilter where; std::shared_ptr<ActivationCache::Data> cache; bool grads; };
  struct State {
    std::vector<Fwd> fwd;
    std::vector<Bwd> bwd;
    std::vector<Rec> rec;
    std::vector<std::pair<std::string, Splice>> splices;
  };
  std::shared_ptr<State> s_ = std::make_shared<State>();
};

// Replaces head `head` of a per-head activation (..., H, d) with `value` (d) or zeros: the
// forward hook of zero- and mean-ablation. Returns a new tensor, differentiable in x.
Tensor replace_head(const Tensor& x, int head, const Tensor& value = Tensor());

}  // namespace hl
