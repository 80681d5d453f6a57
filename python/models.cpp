// Binds models (ModelConfig, TransformerLM, hook_points) and hooks: Python callables as forward
// and backward hooks, and the activation cache as read-only array views.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "bindings.h"

#include <cstdio>

#include "analysis/decompose.h"
#include "analysis/evaluate.h"
#include "lib/ops.h"
#include "datasets/tokenizer.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "models/checkpoint.h"
#include "models/hooks.h"
#include "models/sae.h"

namespace hl::bindings {
namespace {

// ---- hooks from Python callables -------------------------------------------------------------

// The model's hook points: its config's and its attached SAEs' (model.add_sae).
void check_hook_name(const TransformerLM& model, const std::string& name) {
  for (const HookPointInfo& p : describe_hook_points(model))
    if (p.name == name) return;
  throw py::value_error("unknown hook point '" + name + "': headlab.hook_points(config) lists them" +
                        (model.saes.empty() ? "" : ", and model.hook_points() those of the attached SAEs too"));
}

// A Python callable kept by C++ (in hooks that the autograd graph holds): released with the GIL
// taken, since the graph may be freed by a backward that runs without it.
struct PyCallable {
  py::function fn;
  explicit PyCallable(py::function f) : fn(std::move(f)) {}
  ~PyCallable() {
    py::gil_scoped_acquire gil;
    fn = py::function();
  }
};
std::shared_ptr<PyCallable> keep(const py::function& f) { return std::make_shared<PyCallable>(f); }

// A hook made by headlab.tensor_hook(fn) receives the activation as an hl.Tensor in the graph.
bool wants_tensor(const py::function& f) { return py::hasattr(f, "_headlab_as_tensor"); }

// fn(activation, name) -> None or a replacement of the same shape: an array (a constant to
// autograd) or an hl.Tensor (its graph kept: gradients flow through an expression of x).
Hooks hooks_from(const TransformerLM& model, const std::vector<std::pair<std::string, py::function>>& fwd,
                 const std::vector<std::pair<std::string, py::function>>& bwd) {
  Hooks hooks;
  for (auto& [name, f] : fwd) {
    check_hook_name(model, name);
    hooks.add_forward(name, [fn = keep(f)](const Tensor& x, const std::string& n) -> Tensor {
      py::gil_scoped_acquire gil;
      py::object r;
      // An exception the hook raises (KeyboardInterrupt and SystemExit included) reaches the
      // caller as itself: error_already_set carries it through the C++ frames.
      try {
        if (wants_tensor(fn->fn)) {
          // a copy in the graph: an edit in place cannot reach the activation the model, the
          // cache and autograd keep, and one that returns nothing is said, not silently dropped
          const Tensor given = mul_scalar(x, 1.f);
          r = fn->fn(given, n);
          if (r.is_none() && std::memcmp(given.data(), x.data(), static_cast<size_t>(x.numel()) * sizeof(float)) != 0)
            throw py::value_error("hook at " + n + ": the activation was edited in place; return the edited tensor (or an "
                                  "expression of x such as x * mask) to replace it");
        } else {
          r = fn->fn(view_of(x, /*writeable=*/false), n);
        }
      } catch (py::error_already_set& e) {
        // NumPy's "assignment destination is read-only" does not say what to do instead
        if (e.matches(PyExc_ValueError) && std::string(e.what()).find("read-only") != std::string::npos)
          throw py::value_error("hook at " + n + ": the activation is read-only; return an edited copy instead "
                                "(x = x.copy(); x[...] = ...; return x)");
        throw;
      }
      if (r.is_none()) return Tensor();
      Tensor t;
      if (py::isinstance<Tensor>(r)) {
        t = r.cast<Tensor>();  // differentiable: the graph from x (if any) is kept
      } else {
        py::array a = py::array::ensure(r);
        if (!a) throw py::type_error("hook at " + n + ": return None, an array or an hl.Tensor, got " + std::string(py::str(r.get_type())));
        t = tensor_from_array(a, "hook at " + n);
      }
      if (t.shape() != x.shape())
        throw py::value_error("hook at " + n + ": the replacement has shape " + t.shape().str() + " but the activation is " +
                              x.shape().str());
      return t;
    });
  }
  for (auto& [name, f] : bwd) {
    check_hook_name(model, name);
    hooks.add_backward(name, [fn = keep(f)](const Tensor& g, const std::string& n) {
      py::gil_scoped_acquire gil;
      fn->fn(view_of(g.clone(), /*writeable=*/false), n);  // a copy: the gradient buffer is reused
    });
  }
  return hooks;
}

using HookList = std::vector<std::pair<std::string, py::function>>;

// The hooks added to a model (model.add_hook, with model.hooks(...)) live in its __dict__ as
// _fwd_hooks / _bwd_hooks lists of (name, fn), so that Python owns them; every forward of the
// model from Python runs them, before the hooks given to the call itself.
HookList kept_hooks(const py::object& self, const char* attr) {
  if (!py::hasattr(self, attr)) return {};
  return self.attr(attr).cast<HookList>();
}
// The model's hooks then the call's; nullopt when there are none (the forward's fast path).
std::optional<Hooks> model_hooks(const py::object& self, const HookList& fwd = {}, const HookList& bwd = {}) {
  HookList f = kept_hooks(self, "_fwd_hooks"), b = kept_hooks(self, "_bwd_hooks");
  f.insert(f.end(), fwd.begin(), fwd.end());
  b.insert(b.end(), bwd.begin(), bwd.end());
  if (f.empty() && b.empty()) return std::nullopt;
  return hooks_from(self.cast<const TransformerLM&>(), f, b);
}
// TransformerLens's attention_mask (B, T) of a padded batch, 1 = a token, 0 = padding: the
// forward's key padding and each token's position (a left-padded row's start at its first token).
struct Padding {
  Tensor key_padding;  // undefined: no mask given
  Ids positions;
  void apply(ForwardOptions& opt) const {
    if (!key_padding.defined()) return;
    opt.key_padding = key_padding;
    opt.position_ids = &positions;
  }
};
Padding padding_from(const py::object& mask, const Ids& ids, const char* what = "attention_mask") {
  Padding p;
  p.key_padding = key_padding_from(mask, ids, what);
  if (!p.key_padding.defined()) return p;
  p.positions = positions_from_padding(p.key_padding);
  return p;
}

Tensor forward_with_hooks(const py::object& self, const Ids& x, const HookList& fwd = {}, const HookList& bwd = {},
                          const Padding& pad = {}) {
  TransformerLM& model = self.cast<TransformerLM&>();
  const std::optional<Hooks> hooks = model_hooks(self, fwd, bwd);
  ForwardOptions opt;
  opt.hooks = hooks ? &*hooks : nullptr;
  pad.apply(opt);
  py::gil_scoped_release release;
  return model.forward(x, opt);
}
// TransformerLens's next-token targets of ids (B, T): position t predicts ids[t + 1]; -1 (not
// counted) at the last column and wherever t or t + 1 is padding.
Ids next_token_targets(const Ids& x, const Padding& pad) {
  const int64_t B = x.shape[0], T = x.shape[1];
  Ids y(x.shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const bool counted = t + 1 < T && (!pad.key_padding.defined() || (pad.key_padding.data()[b * T + t] == 0.f &&
                                                                         pad.key_padding.data()[b * T + t + 1] == 0.f));
      y.at(b, t) = counted ? x.at(b, t + 1) : -1;
    }
  return y;
}
// TransformerLens's return_type: "logits", "loss" (mean next-token cross-entropy, padding not
// counted), "both" ((logits, loss)) or None.
std::string return_type_of(const py::object& return_type) {
  const std::string kind = return_type.is_none() ? "none" : cast_arg<std::string>(return_type, "return_type", "'logits', 'loss', 'both' or None");
  if (kind != "logits" && kind != "loss" && kind != "both" && kind != "none")
    throw py::value_error("return_type must be 'logits', 'loss', 'both' or None, got '" + kind + "'");
  return kind;
}
Tensor next_token_loss(const Tensor& logits, const Ids& x, const Padding& pad, const std::string& kind) {
  const Ids y = next_token_targets(x, pad);
  if (std::none_of(y.data.begin(), y.data.end(), [](int32_t t) { return t >= 0; }))
    throw py::value_error("return_type='" + kind + "': no position has a next token to predict (give rows of 2 or more tokens)");
  return cross_entropy(logits, y);
}
py::object forward_output(const Tensor& logits, const Tensor& loss, const std::string& kind) {
  if (kind == "logits") return py::cast(logits);
  if (kind == "loss") return py::cast(loss);
  if (kind == "both") return py::make_tuple(logits, loss);
  return py::none();
}
// The forward of model(ids, attention_mask=..., return_type=...) and forward(...).
py::object forward_masked(const py::object& self, const py::object& ids, const py::object& mask, const py::object& return_type) {
  const Ids x = ids_from(ids);
  const std::string kind = return_type_of(return_type);
  const Padding pad = padding_from(mask, x);
  const Tensor logits = forward_with_hooks(self, x, {}, {}, pad);
  return forward_output(logits, kind == "loss" || kind == "both" ? next_token_loss(logits, x, pad, kind) : Tensor(), kind);
}
constexpr char kForwardDoc[] =
    "ids (T) or (B, T) -> logits (B, T, d_vocab), with the hooks the model holds (add_hook). "
    "attention_mask (B, T), 1 = token, 0 = padding, runs prompts of different lengths padded on either side "
    "(model.to_tokens(texts, padding_side=...) makes both): padding is never attended to, and a row's positions "
    "count its tokens from its first (as alone). return_type (TransformerLens's): 'logits', 'loss' (the mean "
    "next-token cross-entropy, a tensor to call backward() on; padding not counted), 'both' ((logits, loss)) or None";

// TransformerLens's weights, [n_layers, heads, ...], from headlab's per-layer (out, in) Linears:
// copies (a layer's weights are their own tensor, so no view spans the layers).
// rows = true: head h is rows h*d_head.. of weight (W_Q/W_K/W_V) -> [L, heads, d_model, d_head];
// false: columns of W_O -> [L, heads, d_head, d_model].
py::array stacked_heads(const TransformerLM& model, Linear MultiHeadAttention::*lin, int heads, bool rows) {
  const int64_t L = model.cfg.n_layers, D = model.cfg.d_model, dh = model.cfg.head_dim();
  py::array_t<float> a({L, static_cast<int64_t>(heads), rows ? D : dh, rows ? dh : D});
  float* o = a.mutable_data();
  for (int64_t l = 0; l < L; ++l) {
    const Tensor& w = (model.blocks[l]->attn.*lin).weight;  // (heads*dh, D) or (D, heads*dh)
    const float* x = w.data();
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D; ++i)
        for (int64_t j = 0; j < dh; ++j) {
          const float v = rows ? x[(h * dh + j) * D + i] : x[i * (heads * dh) + h * dh + j];
          o[((l * heads + h) * (rows ? D : dh) + (rows ? i : j)) * (rows ? dh : D) + (rows ? j : i)] = v;
        }
  }
  return a;
}
// b_Q/b_K/b_V [L, heads, d_head] and b_O [L, d_model]; zeros without attention biases (as
// TransformerLens has them).
py::array stacked_bias(const TransformerLM& model, Linear MultiHeadAttention::*lin, int heads, bool per_head) {
  const int64_t L = model.cfg.n_layers, n = per_head ? heads * model.cfg.head_dim() : model.cfg.d_model;
  std::vector<int64_t> shape = per_head ? std::vector<int64_t>{L, heads, model.cfg.head_dim()} : std::vector<int64_t>{L, n};
  py::array_t<float> a(shape);
  float* o = a.mutable_data();
  for (int64_t l = 0; l < L; ++l) {
    const Tensor& b = (model.blocks[l]->attn.*lin).bias;
    for (int64_t i = 0; i < n; ++i) o[l * n + i] = b.defined() ? b.data()[i] : 0.f;
  }
  return a;
}
// TransformerLens's MLP weights, copies stacked over the layers: W_in and W_gate [n_layers,
// d_model, d_mlp] and W_out [n_layers, d_mlp, d_model] (headlab's (out, in) Linears transposed),
// or their biases b_in [n_layers, d_mlp] and b_out [n_layers, d_model] (zeros without mlp_bias).
py::array stacked_mlp(const TransformerLM& model, const char* name, const Linear* (*of)(const FeedForward&), bool bias) {
  const py::module_ np = py::module_::import("numpy");
  py::list layers;
  for (const auto& block : model.blocks) {
    if (!block->ffn) throw py::attribute_error(std::string(name) + ": the model is attention-only (d_mlp 0): it has no MLP");
    const Linear* lin = of(*block->ffn);
    if (!lin) throw py::attribute_error(std::string(name) + ": the MLP is not gated (mlp='plain'): it has no gate");
    if (!bias) layers.append(view_of(lin->weight, false).attr("T"));  // (out, in) read as (in, out)
    else if (lin->bias.defined()) layers.append(view_of(lin->bias, false));
    else layers.append(np.attr("zeros")(lin->weight.size(0), py::arg("dtype") = "float32"));
  }
  return np.attr("stack")(layers);
}

// With grouped-query attention each query head's key/value head (h / (heads / kv heads)),
// repeated as TransformerLens's W_K does; _W_K keeps the kv heads.
py::array repeat_kv(const TransformerLM& model, py::array kv) {
  const int groups = model.cfg.n_heads / model.cfg.kv_heads();
  return groups == 1 ? kv : py::module_::import("numpy").attr("repeat")(kv, groups, py::arg("axis") = 1);
}

// A cache key: a name, or a (name, layer[, layer_type]) tuple as TransformerLens's cache takes
// (get_act_name, models/hooks.h: the one spelling of hook names).
std::string act_name_of(const py::object& key) {
  if (py::isinstance<py::str>(key)) return get_act_name(key.cast<std::string>(), std::nullopt, "");
  if (!py::isinstance<py::tuple>(key)) throw py::type_error("a cache key is a hook name or a tuple (name, layer[, layer_type])");
  const auto t = key.cast<py::tuple>();
  if (t.size() < 1 || t.size() > 3 || !py::isinstance<py::str>(t[0]))
    throw py::type_error("a cache key tuple is (name, layer[, layer_type]), e.g. ('pattern', 0)");
  std::optional<int> layer;
  if (t.size() > 1 && !t[1].is_none()) layer = t[1].cast<int>();
  return get_act_name(t[0].cast<std::string>(), layer, t.size() > 2 ? t[2].cast<std::string>() : "");
}

// The activation cache seen from Python: cache[name] is an array view. It knows the model and
// the input of its forward (the model object kept alive), for the decomposition methods.
struct PyCache {
  ActivationCache cache;
  py::object model_obj;  // the TransformerLM that made it
  Ids ids;               // (B, T)
  // TransformerLens's gradient keys: a name ending in "_grad" ("blocks.0.attn.hook_q_grad", ("q_grad", 0))
  py::array get(const py::object& key) const {
    const std::string suffix = "_grad";
    auto is_grad = [&](const py::handle& k) {
      if (!py::isinstance<py::str>(k)) return false;
      const std::string n = k.cast<std::string>();
      return n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    auto strip = [&](const py::handle& k) { const std::string n = k.cast<std::string>(); return py::str(n.substr(0, n.size() - suffix.size())); };
    if (is_grad(key)) return grad(strip(key));
    if (py::isinstance<py::tuple>(key) && py::len(key) >= 1 && is_grad(key.cast<py::tuple>()[0])) {
      py::list k(key);
      k[0] = strip(k[0]);
      return grad(py::tuple(k));
    }
    return view_of(cache[act_name_of(key)], false);
  }
  py::array grad(const py::object& key) const { return view_of(cache.grad(act_name_of(key)), false); }
  const TransformerLM& model() const { return model_obj.cast<const TransformerLM&>(); }
  int64_t T() const { return ids.shape[1]; }
  // TransformerLens's layer argument: None or -1 = the final residual stream (n_layers).
  int layer(const py::object& l, const char* what) const {
    const int L = model().cfg.n_layers;
    if (l.is_none()) return L;
    if (!PyIndex_Check(l.ptr()) || py::isinstance<py::bool_>(l)) throw py::type_error(std::string(what) + ": layer must be an int or None");
    const int v = l.cast<int>();
    if (v == -1) return L;
    if (v < 0 || v > L)
      throw py::value_error(std::string(what) + ": layer " + std::to_string(v) + " is outside 0.." + std::to_string(L) +
                            " (or -1/None = " + std::to_string(L) + ", the final residual stream)");
    return v;
  }
  // pos_slice: None = every position (-1 for the library), an int (negative from the end).
  int64_t pos(const py::object& p, const char* what) const {
    if (p.is_none()) return -1;
    if (!PyIndex_Check(p.ptr()) || py::isinstance<py::bool_>(p)) throw py::type_error(std::string(what) + ": pos_slice must be an int or None");
    int64_t v = p.cast<int64_t>();
    if (v < 0) v += T();
    if (v < 0 || v >= T())
      throw py::value_error(std::string(what) + ": pos_slice " + std::to_string(p.cast<int64_t>()) + " is outside the " +
                            std::to_string(T()) + " cached positions");
    return v;
  }
};

py::array stack_array(const ResidStack& s) {
  py::array_t<double> a(std::vector<py::ssize_t>(s.shape.begin(), s.shape.end()));
  std::copy(s.values.begin(), s.values.end(), a.mutable_data());
  return a;
}
py::object stack_result(const ResidStack& s, bool return_labels) {
  if (return_labels) return py::make_tuple(stack_array(s), py::cast(s.labels));
  return stack_array(s);
}
ResidStack stack_from(const py::object& obj, const char* what) {
  const auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) throw py::type_error(std::string(what) + ": the stack must be a real array (components, B, T, d_model) or (components, B, d_model)");
  ResidStack s;
  s.shape.assign(a.shape(), a.shape() + a.ndim());
  s.values.assign(a.data(), a.data() + a.size());
  s.labels.assign(static_cast<size_t>(a.ndim() ? a.shape(0) : 0), "");
  return s;
}
// tokens: an int (every position) or an integer array of the stack's (B, T) or (B) positions;
// with one position (pos >= 0), tokens given for every position ((B, T)) are read at it.
TokenChoice tokens_from(const py::object& obj, const std::vector<int64_t>& stack_shape, int64_t pos, const char* what) {
  TokenChoice tk;
  if (py::isinstance<py::int_>(obj)) {
    const int64_t id = obj.cast<int64_t>();
    if (id < INT32_MIN || id > INT32_MAX) throw py::value_error(std::string("logit_attrs: ") + what + ": id " + std::to_string(id) + " is out of range");
    tk.ids = {static_cast<int32_t>(id)};
    return tk;
  }
  py::array a = py::array::ensure(obj);
  if (!a || (a.dtype().kind() != 'i' && a.dtype().kind() != 'u'))
    throw py::type_error(std::string("logit_attrs: ") + what + " must be an int or an integer array");
  const auto v = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  tk.shape.assign(v.shape(), v.shape() + v.ndim());
  std::vector<int64_t> ids(v.data(), v.data() + v.size());
  if (pos >= 0 && stack_shape.size() == 3 && tk.shape.size() == 2 && tk.shape[1] > pos) {  // (B, T) read at pos
    std::vector<int64_t> at;
    for (int64_t b = 0; b < tk.shape[0]; ++b) at.push_back(ids[b * tk.shape[1] + pos]);
    ids = at;
    tk.shape = {tk.shape[0]};
  }
  if (tk.shape.empty() && ids.size() == 1) tk.shape = {};
  for (int64_t x : ids) {
    if (x < INT32_MIN || x > INT32_MAX) throw py::value_error(std::string("logit_attrs: ") + what + ": id " + std::to_string(x) + " is out of range");
    tk.ids.push_back(static_cast<int32_t>(x));
  }
  return tk;
}

NameFilter filter_from(const py::object& names) {
  // None: every hook point but the split q/k/v inputs, which copy the residual stream per head
  // ((B, T, H, d_model) each) and so are made only when named (TransformerLens's use_split_qkv_input)
  if (names.is_none())
    return [](const std::string& n) {
      for (const char* split : {"hook_q_input", "hook_k_input", "hook_v_input"})
        if (n.size() >= std::strlen(split) && n.compare(n.size() - std::strlen(split), std::string::npos, split) == 0) return false;
      return true;
    };
  if (py::isinstance<py::str>(names)) return names_in({names.cast<std::string>()});
  if (py::isinstance<py::function>(names)) {
    return [f = keep(names)](const std::string& n) {
      py::gil_scoped_acquire gil;
      return f->fn(n).cast<bool>();
    };
  }
  return names_in(names.cast<std::vector<std::string>>());
}

}  // namespace

void bind_models(py::module_& m) {
  // ---- models ---------------------------------------------------------------------------------
  py::class_<ModelConfig> config(m, "ModelConfig", R"(The model's settings, by TransformerLens's names where it has one.

ModelConfig(**settings): n_layers, n_heads, d_model, d_head, d_mlp, d_vocab, n_ctx,
n_key_value_heads, norm, activation, positions, attn_bias, mlp_bias, head_bias, eps, dropout,
attn_dropout, the block options normalization, sandwich_norm, mlp, parallel_block, embed_scale,
final_softcap, the attention options rope_theta, rope_theta_local, rotary_dim, rotary_pct, rotary_style, qk_norm,
attn_scale, attn_softcap, sliding_window, window_layers, qkv_bias, o_bias, and arch (a preset's
name: its settings, unless given); each also by its CLI flag's name (layers=, heads=, kv_heads=, d_ff=, vocab_size=,
max_seq_len=, layer_norm_eps=). TransformerLens's act_fn ('gelu', 'gelu_new', 'silu', ...), normalization_type
('LN', 'RMS'), positional_embedding_type ('standard', 'rotary', ...) and original_architecture ('LlamaForCausalLM', ...)
are read as attributes and taken as keywords for activation, normalization, positions and arch. What is not given takes the CLI's default.
ModelConfig(**cfg.to_dict()) gives cfg back.)");
  config.def(py::init([](py::kwargs kw) { return model_config_from_kwargs(kw); }),
             "ModelConfig(**settings): the names are listed in the class's help; unknown ones raise TypeError");
  for (const ConfigField& f : config_fields()) {
    const auto get = f.get;
    config.def_property_readonly(f.name, [get](const ModelConfig& c) { return get(c); }, f.doc);
  }
  for (const TlSpelling& s : tl_spellings()) {
    const auto field = std::find_if(config_fields().begin(), config_fields().end(),
                                    [&](const ConfigField& f) { return std::string(f.name) == s.native; });
    config.def_property_readonly(s.tl, [&s, get = field->get](const ModelConfig& c) {
      return tl_value(s, get(c).cast<std::string>());
    }, s.doc);
  }
  config
      .def("to_dict", &config_dict, "{name: value} of every setting, by the names ModelConfig(...) takes")
      .def("__eq__", [](const ModelConfig& a, const ModelConfig& b) { return config_dict(a).equal(config_dict(b)); }, py::is_operator())
      .def("__repr__", [](const ModelConfig& c) {
        std::string r = "headlab.ModelConfig(";
        bool first = true;
        for (auto& [k, v] : config_dict(c)) {
          r += std::string(first ? "" : ", ") + std::string(py::str(k)) + "=" + std::string(py::repr(v));
          first = false;
        }
        return r + ")";
      });

  m.def("hook_points", [](const ModelConfig& c) { return hook_points(c); }, py::arg("config"),
        "(name, shape) of every hook point of a model of this config, in forward order");

  // The three stacks of the cache take the same arguments (layer, pos_slice, apply_ln, return_labels).
  using StackFn = ResidStack (*)(const TransformerLM&, const ActivationCache&, int, int64_t);
  auto stack_method = [](StackFn fn, const char* name) {
    return [fn, name](const PyCache& c, const py::object& layer, const py::object& pos_slice, bool apply_ln, bool return_labels) {
      const int l = c.layer(layer, name);
      const int64_t p = c.pos(pos_slice, name);
      ResidStack s = fn(c.model(), c.cache, l, p);
      if (apply_ln) s = apply_ln_to_stack(c.model(), c.cache, s, l, p);
      return stack_result(s, return_labels);
    };
  };
  m.def("get_act_name", [](const std::string& name, std::optional<int> layer, const std::string& layer_type) {
        return get_act_name(name, layer, layer_type);
      }, py::arg("name"), py::arg("layer") = py::none(), py::arg("layer_type") = "",
      "A hook's full name from TransformerLens's short form: get_act_name('pattern', 0) = 'blocks.0.attn.hook_pattern'");
  py::class_<PyCache>(m, "ActivationCache", "Activations by hook name (read-only array views) and their gradients")
      .def("__getitem__", &PyCache::get, py::arg("key"),
           "cache[name] or cache[name, layer(, layer_type)] (as get_act_name): a read-only view of the activation; "
           "a name ending in _grad (cache['blocks.0.attn.hook_q_grad'], cache['q_grad', 0]) gives the gradient there "
           "(run_with_cache(incl_bwd=True), then backward())")
      .def("grad", &PyCache::grad, py::arg("key"), "The gradient at a hook (run_with_cache(incl_bwd=True), then backward())")
      .def("__contains__", [](const PyCache& c, const py::object& k) { return c.cache.has(act_name_of(k)); })
      .def("has_grad", [](const PyCache& c, const py::object& k) { return c.cache.has_grad(act_name_of(k)); }, py::arg("key"),
           "Whether the cache holds the gradient at this hook (after backward())")
      .def("__repr__", [](const PyCache& c) {
        std::string r = "headlab.ActivationCache(" + std::to_string(c.cache.size()) + (c.cache.size() == 1 ? " activation" : " activations");
        for (const std::string& n : c.cache.names())
        {
          const Shape sh = c.cache[n].shape();
          r += "\n  " + n + ": " + std::string(py::repr(py::tuple(py::cast(std::vector<int64_t>(sh.dims, sh.dims + sh.ndim)))));
        }
        return r + (c.cache.size() ? "\n)" : ")");
      })
      .def("keys", [](const PyCache& c) { return c.cache.names(); }, "The cached hook names")
      .def("__len__", [](const PyCache& c) { return c.cache.size(); })
      .def("__iter__", [](const PyCache& c) { return py::iter(py::cast(c.cache.names())); })
      // ---- the residual stream as components (analysis/decompose.h), TransformerLens's names ----
      .def("decompose_resid", stack_method(decompose_resid, "decompose_resid"), py::arg("layer") = -1,
           py::arg("pos_slice") = py::none(), py::arg("apply_ln") = false, py::arg("return_labels") = false,
           "Components whose sum is the residual stream entering `layer` (-1/None = the final one): (C, B, T, d_model), "
           "or (C, B, d_model) with pos_slice; labels embed, pos_embed, L{l}H{h}, {l}_attn_bias, {l}_attn_norm_bias, {l}_mlp_out")
      .def("stack_head_results", stack_method(stack_head_results, "stack_head_results"), py::arg("layer") = -1,
           py::arg("pos_slice") = py::none(), py::arg("apply_ln") = false, py::arg("return_labels") = false,
           "Each head's output (hook_result) of the layers before `layer`: (layer*heads, B, T, d_model), labels L{l}H{h}")
      .def("accumulated_resid", stack_method(accumulated_resid, "accumulated_resid"), py::arg("layer") = py::none(),
           py::arg("pos_slice") = py::none(), py::arg("apply_ln") = false, py::arg("return_labels") = false,
           "The residual stream entering each layer up to `layer` ({l}_pre) and, for the last, final_post: the logit lens's inputs")
      .def("apply_ln_to_stack", [](const PyCache& c, const py::object& stack, const py::object& layer, const py::object& pos_slice) {
             const int l = c.layer(layer, "apply_ln_to_stack");
             const int64_t p = c.pos(pos_slice, "apply_ln_to_stack");
             return stack_array(apply_ln_to_stack(c.model(), c.cache, stack_from(stack, "apply_ln_to_stack"), l, p));
           }, py::arg("residual_stack"), py::arg("layer") = py::none(), py::arg("pos_slice") = py::none(),
           "Each component centred and divided by the cached scale of the layer norm reading the residual entering `layer` "
           "(None = ln_final); its weight is folded into logit_attrs's directions")
      .def("logit_attrs", [](const PyCache& c, const py::object& stack, const py::object& tokens, const py::object& incorrect,
                             const py::object& pos_slice) {
             const int64_t p = c.pos(pos_slice, "logit_attrs");
             const ResidStack s = stack_from(stack, "logit_attrs");
             const TokenChoice tk = tokens_from(tokens, s.shape, p, "tokens");
             if (incorrect.is_none()) return stack_array(logit_attrs(c.model(), s, tk));
             const TokenChoice wrong = tokens_from(incorrect, s.shape, p, "incorrect_tokens");
             return stack_array(logit_attrs(c.model(), s, tk, &wrong));
           }, py::arg("residual_stack"), py::arg("tokens"), py::arg("incorrect_tokens") = py::none(),
           py::arg("pos_slice") = py::none(),
           "Each (layer-normed) component projected on ln_final.weight * W_U[:, token] (minus incorrect_tokens'): (C, B, T) or (C, B)")
      .def("final_bias_term", [](const PyCache& c, int32_t token, const py::object& incorrect) {
             return final_bias_term(c.model(), token, incorrect.is_none() ? -1 : incorrect.cast<int32_t>());
           }, py::arg("token"), py::arg("incorrect_token") = py::none(),
           "ln_final.bias . W_U[:, token] (+ the unembedding bias): the part of the logit no component carries")
      .def_property_readonly("model", [](const PyCache& c) { return c.model_obj; }, "The model whose forward this is")
      .def_property_readonly("ids", [](const PyCache& c) { return ids_to_array(c.ids); }, "The forward's input ids (B, T)");

  py::class_<TransformerLM> lm(m, "TransformerLM", py::dynamic_attr(), R"(A decoder-only transformer language model.

TransformerLM(config, seed=0) builds one (hl.ModelConfig); TransformerLM.load(path) reads a
checkpoint. model.cfg holds its settings by TransformerLens's names (cfg.n_layers, cfg.n_heads,
cfg.d_model, cfg.d_head, ...). model(ids) gives the logits (B, T, d_vocab);
run_with_cache(ids, names_filter=...) the logits and the activations by hook name;
model.hooks(fwd_hooks=[(name, fn)]) runs hooks in every forward of a with block.
The weights in TransformerLens's shapes: W_Q, W_K, W_V [n_layers, n_heads, d_model, d_head],
W_O [n_layers, n_heads, d_head, d_model], b_Q/b_K/b_V [n_layers, n_heads, d_head],
b_O [n_layers, d_model], W_E [d_vocab, d_model], W_pos [n_ctx, d_model], W_U [d_model, d_vocab].)");
  lm.def(py::init([](const ModelConfig& c, uint64_t seed) {
             c.validate();
             return std::make_unique<TransformerLM>(c, seed);
           }),
           py::arg("config"), py::arg("seed") = 0, "A model of this config, initialised from seed")
      .def_static("load", [](const PathArg& p) {
             const std::string& path = p.path;
             py::object model = py::cast(load_model(path));
             // a model directory's tokenizer files: to_tokens / to_str_tokens / to_string use them
             if (const std::shared_ptr<const Tokenizer> tok = tokenizer_for_directory(path)) {
               check_tokenizer_fits(*tok, model.cast<const TransformerLM&>().cfg.vocab_size, "the tokenizer in " + path);
               model.attr("tokenizer") = py::cast(std::const_pointer_cast<Tokenizer>(tok));
             }
             return model;
           }, py::arg("path"),
           "A model from a headlab checkpoint (safetensors) or a Hugging Face model directory (with its tokenizer files, "
           "tokenizer.json or GPT-2's: model.tokenizer)")
      .def("save", [](const TransformerLM& model, const PathArg& p) { save_checkpoint(p.path, model); }, py::arg("path"),
           "Writes a checkpoint the CLI reads (atomic)")
      .def("load_parameters", [](TransformerLM& model, const PathArg& p) { load_parameters(model, read_checkpoint(p.path)); },
           py::arg("path"), "Reads the parameters of a checkpoint of the same config into this model")
      .def_readonly("cfg", &TransformerLM::cfg, "The model's settings (a ModelConfig, TransformerLens's names)")
      .def_readonly("config", &TransformerLM::cfg, "The same as cfg (the older name)")
      .def("__repr__", [](const TransformerLM& model) {
        return "headlab.TransformerLM(" + std::string(py::repr(py::cast(model.cfg))) + ", " +
               std::to_string(model.num_parameters()) + " parameters)";
      })
      .def("train", [](TransformerLM& model, bool on) { model.train(on); }, py::arg("on") = true,
           "Training mode (dropout on) or, with on=False, evaluation mode")
      .def("eval", [](TransformerLM& model) { model.eval(); }, "Evaluation mode (no dropout)")
      .def("forward", &forward_masked, py::arg("ids"), py::arg("attention_mask") = py::none(), py::arg("return_type") = "logits",
           kForwardDoc)
      .def("__call__", &forward_masked, py::arg("ids"), py::arg("attention_mask") = py::none(), py::arg("return_type") = "logits",
           "The same as forward(ids, attention_mask, return_type)")
      .def("loss", [](const py::object& self, const py::object& ids, const py::object& targets, const py::object& mask) {
             const Ids x = ids_from(ids), y = counted_targets_from(targets, "loss");
             const Padding pad = padding_from(mask, x);
             if (pad.key_padding.defined())  // a target at padding would count a position that is not there
               for (size_t i = 0; i < y.data.size() && i < x.data.size(); ++i)
                 if (y.data[i] >= 0 && pad.key_padding.data()[i] != 0.f)
                   throw py::value_error("loss: targets count a padding position (row " + std::to_string(i / x.shape[1]) +
                                         ", column " + std::to_string(i % x.shape[1]) + "): set its target to -1");
             return cross_entropy(forward_with_hooks(self, x, {}, {}, pad), y);
           }, py::arg("ids"), py::arg("targets"), py::arg("attention_mask") = py::none(),
           "Mean cross-entropy over targets != -1 (a tensor; call backward()); no counted target raises ValueError. "
           "With attention_mask, padding positions must have target -1")
      .def("named_parameters", [](const TransformerLM& model) {
             py::dict d;
             for (auto& [name, t] : model.named_parameters()) d[py::str(name)] = t;
             return d;
           }, "name -> Tensor (headlab's parameter names; np.asarray gives a view)")
      .def("zero_grad", [](TransformerLM& model) { model.zero_grad(); }, "Clears every parameter's gradient")
      // ---- TransformerLens's weights ----
      .def_property_readonly("W_Q", [](const TransformerLM& model) { return stacked_heads(model, &MultiHeadAttention::W_Q, model.cfg.n_heads, true); },
                             "[n_layers, n_heads, d_model, d_head]: a copy (headlab keeps W_Q.weight as (heads*d_head, d_model) per layer)")
      .def_property_readonly("W_K", [](const TransformerLM& model) { return repeat_kv(model, stacked_heads(model, &MultiHeadAttention::W_K, model.cfg.kv_heads(), true)); },
                             "[n_layers, n_heads, d_model, d_head]: a copy; with grouped-query attention each head's key/value head (_W_K: the kv heads)")
      .def_property_readonly("W_V", [](const TransformerLM& model) { return repeat_kv(model, stacked_heads(model, &MultiHeadAttention::W_V, model.cfg.kv_heads(), true)); },
                             "[n_layers, n_heads, d_model, d_head]: a copy; with grouped-query attention each head's key/value head (_W_V: the kv heads)")
      .def_property_readonly("_W_K", [](const TransformerLM& model) { return stacked_heads(model, &MultiHeadAttention::W_K, model.cfg.kv_heads(), true); },
                             "[n_layers, n_key_value_heads, d_model, d_head]: a copy")
      .def_property_readonly("_W_V", [](const TransformerLM& model) { return stacked_heads(model, &MultiHeadAttention::W_V, model.cfg.kv_heads(), true); },
                             "[n_layers, n_key_value_heads, d_model, d_head]: a copy")
      .def_property_readonly("W_O", [](const TransformerLM& model) { return stacked_heads(model, &MultiHeadAttention::W_O, model.cfg.n_heads, false); },
                             "[n_layers, n_heads, d_head, d_model]: a copy")
      .def_property_readonly("b_Q", [](const TransformerLM& model) { return stacked_bias(model, &MultiHeadAttention::W_Q, model.cfg.n_heads, true); },
                             "[n_layers, n_heads, d_head]: a copy (zeros without attention biases)")
      .def_property_readonly("b_K", [](const TransformerLM& model) { return repeat_kv(model, stacked_bias(model, &MultiHeadAttention::W_K, model.cfg.kv_heads(), true)); },
                             "[n_layers, n_heads, d_head]: a copy (zeros without attention biases)")
      .def_property_readonly("b_V", [](const TransformerLM& model) { return repeat_kv(model, stacked_bias(model, &MultiHeadAttention::W_V, model.cfg.kv_heads(), true)); },
                             "[n_layers, n_heads, d_head]: a copy (zeros without attention biases)")
      .def_property_readonly("b_O", [](const TransformerLM& model) { return stacked_bias(model, &MultiHeadAttention::W_O, model.cfg.n_heads, false); },
                             "[n_layers, d_model]: a copy (zeros without attention biases)")
      .def_property_readonly("W_E", [](const TransformerLM& model) { return view_of(model.tok_emb.weight); },
                             "[d_vocab, d_model]: a view of the token embedding (writes change the model)")
      .def_property_readonly("W_pos", [](const TransformerLM& model) {
             return model.pos_emb ? view_of(model.pos_emb->weight) : view_of(model.sinusoid, /*writeable=*/false);
           }, "[n_ctx, d_model]: a view of the learned position embedding (read-only: the fixed table of sinusoidal positions)")
      .def_property_readonly("W_U", [](const TransformerLM& model) {
             const Tensor& w = model.head.weight;  // (d_vocab, d_model), read as its transpose by strides
             py::capsule owner(new Tensor(w), [](void* p) { delete static_cast<Tensor*>(p); });
             return py::array(py::dtype::of<float>(), {w.size(1), w.size(0)},
                              {static_cast<py::ssize_t>(sizeof(float)), static_cast<py::ssize_t>(sizeof(float) * w.size(1))},
                              w.data(), owner);
           },
                             "[d_model, d_vocab]: a view (transposed) of the unembedding head.weight (writes change the model)")
      .def_property_readonly("W_in", [](const TransformerLM& model) {
             return stacked_mlp(model, "W_in", [](const FeedForward& f) { return &f.fc1; }, false);
           }, "[n_layers, d_model, d_mlp]: a copy of each MLP's input weight (fc1; a gated MLP's linear half)")
      .def_property_readonly("W_gate", [](const TransformerLM& model) {
             return stacked_mlp(model, "W_gate", [](const FeedForward& f) { return static_cast<const Linear*>(f.gate.get()); }, false);
           }, "[n_layers, d_model, d_mlp]: a copy of each gated MLP's gate weight (what the activation reads)")
      .def_property_readonly("W_out", [](const TransformerLM& model) {
             return stacked_mlp(model, "W_out", [](const FeedForward& f) { return &f.fc2; }, false);
           }, "[n_layers, d_mlp, d_model]: a copy of each MLP's output weight (fc2)")
      .def_property_readonly("b_in", [](const TransformerLM& model) {
             return stacked_mlp(model, "b_in", [](const FeedForward& f) { return &f.fc1; }, true);
           }, "[n_layers, d_mlp]: a copy (zeros without mlp_bias)")
      .def_property_readonly("b_out", [](const TransformerLM& model) {
             return stacked_mlp(model, "b_out", [](const FeedForward& f) { return &f.fc2; }, true);
           }, "[n_layers, d_model]: a copy (zeros without mlp_bias)")
      .def_property_readonly("b_U", [](const TransformerLM& model) -> py::object {
             if (model.head.bias.defined()) return view_of(model.head.bias);
             return py::module_::import("numpy").attr("zeros")(model.cfg.vocab_size, py::arg("dtype") = "float32");
           }, "[d_vocab]: a view of the unembedding's bias (zeros, a copy, without head_bias)")
      .def("head_weights", [](const TransformerLM& model, int layer, int head, bool grads) {
             if (layer < 0 || layer >= model.cfg.n_layers || head < 0 || head >= model.cfg.n_heads)
               throw py::index_error("head (" + std::to_string(layer) + ", " + std::to_string(head) + ") is outside " +
                                     std::to_string(model.cfg.n_layers) + " layers x " + std::to_string(model.cfg.n_heads) + " heads");
             const MultiHeadAttention& a = model.blocks[layer]->attn;
             const int64_t dh = model.cfg.head_dim();
             const int kv = head / (model.cfg.n_heads / model.cfg.kv_heads());
             auto w = [&](const Tensor& t) -> Tensor {
               if (!grads) return t;
               if (!t.grad().defined()) throw py::value_error("no gradient yet: run backward() first");
               return t.grad();
             };
             py::dict d;
             d["W_Q"] = view_of(head_rows(w(a.W_Q.weight), head, dh));
             d["W_K"] = view_of(head_rows(w(a.W_K.weight), kv, dh));
             d["W_V"] = view_of(head_rows(w(a.W_V.weight), kv, dh));
             d["W_O"] = view_of(head_cols(w(a.W_O.weight), head, dh));
             return d;
           }, py::arg("layer"), py::arg("head"), py::arg("grads") = false,
           "Copies of head's blocks in headlab's (out, in) layout: W_Q, W_K, W_V (d_head, d_model) and W_O (d_model, d_head) "
           "(model.W_Q[layer, head] is W_Q's transpose); grads=True: of their gradients")
      .def("gates", [](TransformerLM& model, int layer) { return model.gates(layer); }, py::arg("layer"),
           "Head gates of a layer (H): a view to set")
      .def("gate_values", [](const TransformerLM& model) {
             HeadGrid g;
             for (auto& row : model.gate_values()) g.emplace_back(row.begin(), row.end());
             return grid_array(g);
           }, "Every layer's head gates (n_layers, n_heads)")
      // SAEs spliced into every later run (SAELens's HookedSAETransformer)
      .def("add_sae", [](TransformerLM& model, const Sae& sae, bool use_error_term) {
             model.add_sae(std::make_shared<const Sae>(sae), use_error_term);
           }, py::arg("sae"), py::arg("use_error_term") = true,
           "Splice `sae` in at its hook point for every later run (SAELens's HookedSAETransformer.add_sae): its features, "
           "reconstruction and error become hook points (HOOK.hook_sae_input, .hook_sae_acts_pre, .hook_sae_acts_post, "
           ".hook_sae_recons, .hook_sae_error, .hook_sae_output) that run_with_cache, hooks, activation_patching "
           "(axes=['feature']) and edge_patching (its features as senders) take. use_error_term=True adds the error x - x_hat "
           "back, so the outputs are the model's own until a feature is edited; False runs the model on x_hat")
      .def("reset_saes", &TransformerLM::reset_saes, "Detach every SAE (model.add_sae)")
      .def_property_readonly("saes", [](const TransformerLM& model) {
             py::list out;  // of hl.SAE (bound after the model: a list keeps the signature readable)
             for (const AttachedSae& a : model.saes) out.append(py::cast(*a.sae));
             return out;
           }, "The attached SAEs (hl.SAE, model.add_sae), in the order attached")
      .def("hook_points", [](const TransformerLM& model) {
             std::vector<std::pair<std::string, std::string>> out;
             for (const HookPointInfo& p : describe_hook_points(model)) out.push_back({p.name, p.shape});
             return out;
           }, "(name, shape) of every hook point of this model, its attached SAEs' included (hl.hook_points(config): the config's)")
      .def("run_with_cache", [](const py::object& self, const py::object& ids, const py::object& names, bool incl_bwd,
                                const py::object& mask, const py::object& return_type) {
             TransformerLM& model = self.cast<TransformerLM&>();
             const Ids x = ids_from(ids);
             const std::string kind = return_type_of(return_type);
             const Padding pad = padding_from(mask, x);
             // a misspelt name is refused here, as run_with_hooks refuses it, not at lookup
             if (py::isinstance<py::str>(names)) check_hook_name(model, names.cast<std::string>());
             else if (!names.is_none() && !py::isinstance<py::function>(names))
               for (const std::string& n : names.cast<std::vector<std::string>>()) check_hook_name(model, n);
             ActivationCache cache;
             Hooks hooks = model_hooks(self).value_or(Hooks());  // the model's hooks run first; the cache records what they leave
             hooks.cache(cache, filter_from(names), incl_bwd);
             ForwardOptions opt;
             opt.hooks = &hooks;
             pad.apply(opt);
             Tensor logits;
             {
               py::gil_scoped_release release;
               logits = model.forward(x, opt);
             }
             Tensor loss;
             if (kind == "loss" || kind == "both") {
               loss = next_token_loss(logits, x, pad, kind);
               if (incl_bwd) {  // as TransformerLens: the loss's backward fills the cache's gradients
                 if (!loss.requires_grad()) throw py::value_error("run_with_cache: incl_bwd=True needs a graph: call it outside hl.no_grad()");
                 py::gil_scoped_release release;
                 loss.backward();
               }
             }
             return py::make_tuple(forward_output(logits, loss, kind), PyCache{cache, self, x});
           }, py::arg("ids"), py::arg("names_filter") = py::none(), py::arg("incl_bwd") = false,
           py::arg("attention_mask") = py::none(), py::arg("return_type") = "logits",
           "(logits, cache): cache[name] for every hook name passing names_filter (None = all but the split q/k/v "
           "inputs, a name, a list, or a predicate name -> bool); incl_bwd=True: cache[name + '_grad'] (or "
           "cache.grad(name)) after a backward: return_type='loss' runs the loss's backward here (as TransformerLens), "
           "with 'logits' call backward() on a loss of them. The cache's decompose_resid, logit_attrs and the rest read "
           "hook_result and hook_scale, which names_filter=None caches. attention_mask, return_type: as model(...)")
      .def("run_with_hooks", [](const py::object& self, const py::object& ids, const HookList& fwd_hooks, const HookList& bwd_hooks,
                                const py::object& mask, const py::object& return_type) {
             const Ids x = ids_from(ids);
             const std::string kind = return_type_of(return_type);
             const Padding pad = padding_from(mask, x);
             const Tensor logits = forward_with_hooks(self, x, fwd_hooks, bwd_hooks, pad);
             return forward_output(logits, kind == "loss" || kind == "both" ? next_token_loss(logits, x, pad, kind) : Tensor(), kind);
           }, py::arg("ids"), py::arg("fwd_hooks") = HookList{}, py::arg("bwd_hooks") = HookList{},
           py::arg("attention_mask") = py::none(), py::arg("return_type") = "logits",
           "logits with hooks (after the model's own, add_hook): fn(activation, name) may return a replacement "
           "(the activation is read-only: edit a copy; an array is a constant to autograd; a hook wrapped in "
           "headlab.tensor_hook gets an hl.Tensor and its returned expression keeps the gradient); backward hooks "
           "fn(grad, name) run during backward(). attention_mask, return_type: as model(...)")
      .def("add_hook", [](const py::object& self, const std::string& name, const py::function& fn, const std::string& dir) {
             check_hook_name(self.cast<const TransformerLM&>(), name);
             if (dir != "fwd" && dir != "bwd") throw py::value_error("add_hook: dir must be 'fwd' or 'bwd', got '" + dir + "'");
             const char* attr = dir == "fwd" ? "_fwd_hooks" : "_bwd_hooks";
             if (!py::hasattr(self, attr)) self.attr(attr) = py::list();
             self.attr(attr).cast<py::list>().append(py::make_tuple(name, fn));
           }, py::arg("name"), py::arg("hook"), py::arg("dir") = "fwd",
           "Keeps hook fn(activation, name) at `name` for every forward of the model until reset_hooks()")
      .def("reset_hooks", [](const py::object& self) {
             for (const char* attr : {"_fwd_hooks", "_bwd_hooks"})
               if (py::hasattr(self, attr)) py::delattr(self, attr);
           }, "Removes every hook add_hook (or a hooks() block) left on the model")
      .def("generate", [](const py::object& self, const py::object& tokens, int64_t max_new_tokens, double temperature, uint64_t seed,
                          const py::object& mask) {
             // a hooked model (an ablation in a hooks() block) would generate as if unhooked: refused
             for (const char* attr : {"_fwd_hooks", "_bwd_hooks"})
               if (py::hasattr(self, attr) && py::len(self.attr(attr)) > 0)
                 throw Error("generate runs without hooks, and this model holds some (add_hook or a hooks() block): "
                             "call reset_hooks() first, or run the hooked forward step by step");
             TransformerLM& model = self.cast<TransformerLM&>();
             const Ids x = ids_from(tokens, "tokens");
             const Padding pad = padding_from(mask, x);
             Ids out;
             {
               py::gil_scoped_release release;
               out = generate(model, x, max_new_tokens, temperature, seed, pad.key_padding);
             }
             return ids_to_array(out);
           }, py::arg("tokens"), py::arg("max_new_tokens") = 10, py::arg("temperature") = 0.0, py::arg("seed") = 0,
           py::arg("attention_mask") = py::none(),
           "tokens (T) or (B, T) continued by max_new_tokens tokens (KV-cached; without hooks): temperature 0 is "
           "greedy, > 0 samples from softmax(logits / temperature), the same seed giving the same tokens. "
           "Returns (B, T + max_new_tokens) ids. Prompts of different lengths: padded on the left with their "
           "attention_mask (to_tokens(texts, padding_side='left'))")
      .def_property_readonly("num_parameters", &TransformerLM::num_parameters, "How many parameters the model has");
}

}  // namespace hl::bindings
