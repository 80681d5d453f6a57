// Binds models (ModelConfig, TransformerLM, hook_points) and hooks: Python callables as forward
// and backward hooks, and the activation cache as read-only array views.
#include <cstring>

#include "bindings.h"

#include <cstdio>

#include "analysis/decompose.h"
#include "lib/safetensors.h"
#include "models/checkpoint.h"
#include "models/hooks.h"

namespace hl::bindings {
namespace {

// ---- hooks from Python callables -------------------------------------------------------------

void check_hook_name(const ModelConfig& cfg, const std::string& name) {
  for (auto& [n, shape] : hook_points(cfg))
    if (n == name) return;
  throw py::value_error("unknown hook point '" + name + "': headlab.hook_points(config) lists them");
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

// fn(activation, name) -> None or a replacement array of the same shape.
Hooks hooks_from(const ModelConfig& cfg, const std::vector<std::pair<std::string, py::function>>& fwd,
                 const std::vector<std::pair<std::string, py::function>>& bwd) {
  Hooks hooks;
  for (auto& [name, f] : fwd) {
    check_hook_name(cfg, name);
    hooks.add_forward(name, [fn = keep(f)](const Tensor& x, const std::string& n) -> Tensor {
      py::gil_scoped_acquire gil;
      py::object r;
      // An exception the hook raises (KeyboardInterrupt and SystemExit included) reaches the
      // caller as itself: error_already_set carries it through the C++ frames.
      r = fn->fn(view_of(x, /*writeable=*/false), n);
      if (r.is_none()) return Tensor();
      py::array a = py::array::ensure(r);
      if (!a) throw py::type_error("hook at " + n + ": return None or an array, got " + std::string(py::str(r.get_type())));
      Tensor t = tensor_from_array(a, "hook at " + n);
      if (t.shape() != x.shape())
        throw py::value_error("hook at " + n + ": the replacement has shape " + t.shape().str() + " but the activation is " +
                              x.shape().str());
      return t;
    });
  }
  for (auto& [name, f] : bwd) {
    check_hook_name(cfg, name);
    hooks.add_backward(name, [fn = keep(f)](const Tensor& g, const std::string& n) {
      py::gil_scoped_acquire gil;
      fn->fn(view_of(g.clone(), /*writeable=*/false), n);  // a copy: the gradient buffer is reused
    });
  }
  return hooks;
}

// The activation cache seen from Python: cache[name] is an array view. It knows the model and
// the input of its forward (the model object kept alive), for the decomposition methods.
struct PyCache {
  ActivationCache cache;
  py::object model_obj;  // the TransformerLM that made it
  Ids ids;               // (B, T)
  py::array get(const std::string& name) const { return view_of(cache[name], false); }
  py::array grad(const std::string& name) const { return view_of(cache.grad(name), false); }
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
  py::class_<ModelConfig>(m, "ModelConfig", "Model settings with the CLI's names and defaults")
      .def(py::init([](py::kwargs kw) { return model_config_from_kwargs(kw); }))
      .def_readonly("vocab_size", &ModelConfig::vocab_size)
      .def_readonly("d_model", &ModelConfig::d_model)
      .def_readonly("layers", &ModelConfig::n_layers)
      .def_readonly("heads", &ModelConfig::n_heads)
      .def_property_readonly("kv_heads", &ModelConfig::kv_heads)
      .def_property_readonly("d_head", &ModelConfig::head_dim)
      .def_readonly("d_ff", &ModelConfig::d_ff)
      .def_readonly("max_seq_len", &ModelConfig::max_seq_len)
      .def_property_readonly("norm", [](const ModelConfig& c) { return to_string(c.norm); })
      .def_property_readonly("activation", [](const ModelConfig& c) { return to_string(c.activation); })
      .def_property_readonly("positions", [](const ModelConfig& c) { return to_string(c.positions); })
      .def_readonly("dropout", &ModelConfig::dropout)
      .def_readonly("attn_dropout", &ModelConfig::attn_dropout)
      .def_readonly("attn_bias", &ModelConfig::attn_bias)
      .def_readonly("mlp_bias", &ModelConfig::mlp_bias)
      .def_readonly("head_bias", &ModelConfig::head_bias)
      .def("to_dict", [](const ModelConfig& c) { return json_to_py(json::parse(c.to_json())); })
      .def("__repr__", [](const ModelConfig& c) {  // the attribute names (as the CLI's flags), not the file's
        auto b = [](bool v) { return std::string(v ? "True" : "False"); };
        char dropout[64];
        std::snprintf(dropout, sizeof dropout, "dropout=%g, attn_dropout=%g", c.dropout, c.attn_dropout);
        return "headlab.ModelConfig(vocab_size=" + std::to_string(c.vocab_size) + ", d_model=" + std::to_string(c.d_model) +
               ", layers=" + std::to_string(c.n_layers) + ", heads=" + std::to_string(c.n_heads) +
               ", kv_heads=" + std::to_string(c.kv_heads()) + ", d_head=" + std::to_string(c.head_dim()) +
               ", d_ff=" + std::to_string(c.d_ff) + ", max_seq_len=" + std::to_string(c.max_seq_len) + ", norm='" +
               to_string(c.norm) + "', activation='" + to_string(c.activation) + "', positions='" + to_string(c.positions) +
               "', attn_bias=" + b(c.attn_bias) + ", mlp_bias=" + b(c.mlp_bias) + ", head_bias=" + b(c.head_bias) + ", " +
               dropout + ")";
      });

  m.def("hook_points", [](const ModelConfig& c) { return hook_points(c); }, "(name, shape) of every hook point");

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
  py::class_<PyCache>(m, "ActivationCache", "Activations by hook name (read-only array views) and their gradients")
      .def("__getitem__", &PyCache::get)
      .def("grad", &PyCache::grad)
      .def("__contains__", [](const PyCache& c, const std::string& n) { return c.cache.has(n); })
      .def("has_grad", [](const PyCache& c, const std::string& n) { return c.cache.has_grad(n); })
      .def("keys", [](const PyCache& c) { return c.cache.names(); })
      .def("__len__", [](const PyCache& c) { return c.cache.size(); })
      .def("__iter__", [](const PyCache& c) { return py::iter(py::cast(c.cache.names())); })
      // ---- the residual stream as components (analysis/decompose.h), TransformerLens's names ----
      .def("decompose_resid", stack_method(decompose_resid, "decompose_resid"), py::arg("layer") = -1,
           py::arg("pos_slice") = py::none(), py::arg("apply_ln") = false, py::arg("return_labels") = false,
           "Components whose sum is the residual stream entering `layer` (-1/None = the final one): (C, B, T, d_model), "
           "or (C, B, d_model) with pos_slice; labels embed, pos_embed, L{l}H{h}, {l}_attn_bias, {l}_mlp_out")
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
      .def_property_readonly("model", [](const PyCache& c) { return c.model_obj; })
      .def_property_readonly("ids", [](const PyCache& c) { return ids_to_array(c.ids); });

  py::class_<TransformerLM>(m, "TransformerLM")
      .def(py::init([](const ModelConfig& c, uint64_t seed) {
             c.validate();
             return std::make_unique<TransformerLM>(c, seed);
           }),
           py::arg("config"), py::arg("seed") = 0)
      .def_static("load", [](const PathArg& p) { return load_model(p.path); }, "A model from a headlab checkpoint (safetensors)")
      .def("save", [](const TransformerLM& model, const PathArg& p) { save_checkpoint(p.path, model); },
           "Writes a checkpoint the CLI reads (atomic)")
      .def("load_parameters", [](TransformerLM& model, const PathArg& p) { load_parameters(model, read_checkpoint(p.path)); })
      .def_readonly("config", &TransformerLM::cfg)
      .def("train", [](TransformerLM& model, bool on) { model.train(on); }, py::arg("on") = true)
      .def("eval", [](TransformerLM& model) { model.eval(); })
      .def("forward", [](TransformerLM& model, const py::object& ids) {
             const Ids x = ids_from(ids);
             py::gil_scoped_release release;
             return model.forward(x);
           }, py::arg("ids"), "ids (T) or (B, T) -> logits (B, T, vocab)")
      .def("__call__", [](TransformerLM& model, const py::object& ids) {
             const Ids x = ids_from(ids);
             py::gil_scoped_release release;
             return model.forward(x);
           })
      .def("loss", [](TransformerLM& model, const py::object& ids, const py::object& targets) {
             const Ids x = ids_from(ids), y = ids_from(targets, "targets");
             py::gil_scoped_release release;
             return cross_entropy(model.forward(x), y);
           }, py::arg("ids"), py::arg("targets"), "Mean cross-entropy over targets != -1 (a tensor; call backward())")
      .def("named_parameters", [](const TransformerLM& model) {
             py::dict d;
             for (auto& [name, t] : model.named_parameters()) d[py::str(name)] = t;
             return d;
           }, "name -> Tensor (headlab's parameter names; np.asarray gives a view)")
      .def("zero_grad", [](TransformerLM& model) { model.zero_grad(); })
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
           "Copies of head's blocks: W_Q, W_K, W_V (d_head, d_model) and W_O (d_model, d_head); grads=True: of their gradients")
      .def("gates", [](TransformerLM& model, int layer) { return model.gates(layer); }, "Head gates of a layer (H): a view to set")
      .def("gate_values", [](const TransformerLM& model) {
             HeadGrid g;
             for (auto& row : model.gate_values()) g.emplace_back(row.begin(), row.end());
             return grid_array(g);
           })
      .def("run_with_cache", [](const py::object& self, const py::object& ids, const py::object& names, bool with_grads) {
             TransformerLM& model = self.cast<TransformerLM&>();
             const Ids x = ids_from(ids);
             // a misspelt name is refused here, as run_with_hooks refuses it, not at lookup
             if (py::isinstance<py::str>(names)) check_hook_name(model.cfg, names.cast<std::string>());
             else if (!names.is_none() && !py::isinstance<py::function>(names))
               for (const std::string& n : names.cast<std::vector<std::string>>()) check_hook_name(model.cfg, n);
             NameFilter f = filter_from(names);
             std::pair<Tensor, ActivationCache> r;
             {
               py::gil_scoped_release release;
               r = model.run_with_cache(x, f, with_grads);
             }
             return py::make_tuple(r.first, PyCache{r.second, self, x});
           }, py::arg("ids"), py::arg("names") = py::none(), py::arg("with_grads") = false,
           "(logits, cache): cache[name] for every hook name in `names` (None = all, a list, or a predicate); the cache's "
           "decompose_resid, logit_attrs and the rest read hook_result and hook_scale, which names=None caches")
      .def("run_with_hooks", [](TransformerLM& model, const py::object& ids,
                                const std::vector<std::pair<std::string, py::function>>& fwd_hooks,
                                const std::vector<std::pair<std::string, py::function>>& bwd_hooks) {
             const Ids x = ids_from(ids);
             ForwardOptions opt;
             const Hooks hooks = hooks_from(model.cfg, fwd_hooks, bwd_hooks);
             opt.hooks = &hooks;
             py::gil_scoped_release release;
             return model.forward(x, opt);
           }, py::arg("ids"), py::arg("fwd_hooks") = std::vector<std::pair<std::string, py::function>>{},
           py::arg("bwd_hooks") = std::vector<std::pair<std::string, py::function>>{},
           "logits with hooks: fn(activation, name) may return a replacement; backward hooks fn(grad, name) run during backward()")
      .def_property_readonly("num_parameters", &TransformerLM::num_parameters);
}

}  // namespace hl::bindings
